"""Assembles the stages of a run from its Config: data first (fails fast), then the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmrl.algos import Algorithm
from lmrl.config import Config
from lmrl.data import GROUP_FILTERS, SAMPLERS
from lmrl.engines import ENGINES, SamplingParams
from lmrl.envs import TaskError, encode_rows, load_task
from lmrl.envs.single_turn import add_prompt_variants
from lmrl.learners import Learner
from lmrl.loops.build import check_names, check_row_fields
from lmrl.models import load_model, load_tokenizer, resolve_model_path
from lmrl.models.precision import resolve_bf16
from lmrl.rewards import RewardScorer


@dataclass
class Stages:
    cfg: Config
    tokenizer: Any
    model: Any
    engine: Any
    algorithm: Algorithm
    learner: Any
    sampler: Any
    keep_group: Any
    scorer: RewardScorer
    train_rows: list[dict]
    eval_rows: list[dict]
    generator: torch.Generator
    params: SamplingParams
    data_notes: dict[str, float]


def eos_ids(tokenizer, model) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(ids)


def build_engine(cfg: Config, model, tokenizer):
    """The rollout engine `rollout.engine` over `model`, stopping at every EOS the model declares."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bf16 = resolve_bf16(cfg.trainer.bf16, next(model.parameters()).device)
    return ENGINES.get(cfg.rollout.engine)(model, eos_ids(tokenizer, model), pad, bf16=bf16)


def sampling_params(cfg: Config) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)


def prepare_data(cfg: Config, tokenizer) -> tuple[list[dict], list[dict], dict[str, float]]:
    task = load_task(cfg.task)
    train, dropped_train = encode_rows(tokenizer, task.train, cfg.task.system_prompt, cfg.task.max_prompt_tokens)
    held, dropped_eval = encode_rows(tokenizer, task.eval, cfg.task.system_prompt, cfg.task.max_prompt_tokens)
    if not train:
        raise TaskError(f"every training prompt is longer than task.max_prompt_tokens={cfg.task.max_prompt_tokens}")
    if cfg.task.prompt_variants:
        train = add_prompt_variants(tokenizer, train, cfg.task.prompt_variants, cfg.task.system_prompt)
        longest = max(len(v["prompt_ids"]) for r in train for v in r["variants"])
        if longest > cfg.task.max_prompt_tokens:
            raise TaskError(f"a task.prompt_variants prompt is {longest} tokens, over task.max_prompt_tokens="
                            f"{cfg.task.max_prompt_tokens}; shorten the instruction or raise the limit")
    return train, held, {"data/dropped_long_prompts": float(dropped_train + dropped_eval)}


def preflight(cfg: Config, rows: int = 16) -> str:
    """What a real run would check before training, without loading weights: names, the model directory
    and tokenizer, and the first `rows` task rows encoded with the fields the config names."""
    check_names(cfg)
    path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(path)
    small = cfg.model_copy(update={"task": cfg.task.model_copy(update={
        "num_train": min(cfg.task.num_train, rows), "num_eval": min(cfg.task.num_eval, 1)})})
    train, _, _ = prepare_data(small, tokenizer)
    check_row_fields(cfg, train)
    return f"model {path}; task {cfg.task.name}: first {len(train)} training rows load with fields {sorted(train[0])}"


def build_stages(cfg: Config, model=None, tokenizer=None) -> Stages:
    """Validate names, load and encode the data, then load the model and build every stage.

    `model` and `tokenizer` may be passed in (tests, notebooks); otherwise `model.path` is loaded.
    """
    check_names(cfg)
    if tokenizer is None:
        path = resolve_model_path(cfg.model.path)
        tokenizer = load_tokenizer(path)
    train, held, notes = prepare_data(cfg, tokenizer)
    check_row_fields(cfg, train)
    torch.manual_seed(cfg.trainer.seed)
    if model is None:
        model = load_model(resolve_model_path(cfg.model.path))
    bf16 = resolve_bf16(cfg.trainer.bf16, next(model.parameters()).device)
    engine = build_engine(cfg, model, tokenizer)
    algorithm = Algorithm(cfg.algo, cfg.rollout.max_new_tokens)
    learner = Learner(model, cfg.trainer, cfg.rollout.temperature, needs_reference=algorithm.needs_reference,
                      bf16=bf16, critic=algorithm.critic, critic_lr=cfg.algo.critic_lr,
                      critic_shares_trunk=cfg.algo.critic_shares_trunk)
    return Stages(
        cfg=cfg, tokenizer=tokenizer, model=model, engine=engine, algorithm=algorithm, learner=learner,
        sampler=SAMPLERS.get(cfg.data.sampler)(train, seed=cfg.trainer.seed),
        keep_group=GROUP_FILTERS.get(cfg.data.group_filter), scorer=RewardScorer(cfg.reward),
        train_rows=train, eval_rows=held, generator=torch.Generator().manual_seed(cfg.trainer.seed),
        params=sampling_params(cfg),
        data_notes=notes,
    )
