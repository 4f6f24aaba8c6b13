"""Assembles the stages of a run from its Config: data first (fails fast), then the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from lmrl.algos import Algorithm
from lmrl.config import Config
from lmrl.data import GROUP_FILTERS, SAMPLERS, sample_source
from lmrl.engines import SamplingParams, build_engine, sampling_params
from lmrl.envs import prepare_data
from lmrl.learners import Learner
from lmrl.validation import check_names, check_row_fields
from lmrl.models import load_model, load_tokenizer, resolve_model_path
from lmrl.models.device import resolve_device
from lmrl.models.lora import apply_lora, frozen_base_in_bf16
from lmrl.models.precision import resolve_bf16
from lmrl.models.weights import is_peft
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
    add_samples: Callable  # the run's sample source: kept groups -> (groups with added samples, metrics)
    eval_rows: list[dict]
    generator: torch.Generator
    params: SamplingParams
    data_notes: dict[str, float]


def preflight(cfg: Config, rows: int = 16) -> str:
    """What a real run would check before training, without loading weights: names, the device, the model
    directory and tokenizer, and the first `rows` task rows encoded with the fields the config names."""
    check_names(cfg)
    device = resolve_device(cfg.trainer.device)
    path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(path)
    small = cfg.model_copy(update={"task": cfg.task.model_copy(update={
        "num_train": min(cfg.task.num_train, rows), "num_eval": min(cfg.task.num_eval, 1)})})
    train, _, _ = prepare_data(small, tokenizer)
    check_row_fields(cfg, train)
    return (f"model {path} on {device}; task {cfg.task.name}: first {len(train)} training rows load with fields "
            f"{sorted(train[0])}")


def build_stages(cfg: Config, model=None, tokenizer=None) -> Stages:
    """Validate names, load and encode the data, then load the model and build every stage.

    `model` and `tokenizer` may be passed in (tests, notebooks); otherwise `model.path` is loaded.
    The model gets its LoRA adapters (`model.lora`) and moves to `trainer.device`; the engine and
    the learner share it there. Under bf16 autocast a LoRA model's frozen linear weights are kept in
    bf16 (`models.lora.frozen_base_in_bf16`: the same numbers, no per-call casts).
    """
    check_names(cfg)
    device = resolve_device(cfg.trainer.device)
    if tokenizer is None:
        path = resolve_model_path(cfg.model.path)
        tokenizer = load_tokenizer(path)
    train, held, notes = prepare_data(cfg, tokenizer)
    check_row_fields(cfg, train)
    torch.manual_seed(cfg.trainer.seed)
    if model is None:
        model = load_model(resolve_model_path(cfg.model.path))
    if cfg.model.lora is not None and not is_peft(model):
        model = apply_lora(model, cfg.model.lora)
    model = model.to(device)
    bf16 = resolve_bf16(cfg.trainer.bf16, device)
    if bf16 and is_peft(model):
        frozen_base_in_bf16(model)
    engine = build_engine(cfg, model, tokenizer)
    algorithm = Algorithm(cfg.algo, cfg.rollout.max_new_tokens)
    learner = Learner(model, cfg.trainer, cfg.rollout.temperature, needs_reference=algorithm.needs_reference,
                      bf16=bf16, critic=algorithm.critic, critic_lr=cfg.algo.critic_lr,
                      critic_shares_trunk=cfg.algo.critic_shares_trunk)
    sampler = SAMPLERS.get(cfg.data.sampler)(train, seed=cfg.trainer.seed)
    scorer = RewardScorer(cfg.reward)
    return Stages(
        cfg=cfg, tokenizer=tokenizer, model=model, engine=engine, algorithm=algorithm, learner=learner,
        sampler=sampler, keep_group=GROUP_FILTERS.get(cfg.data.group_filter), scorer=scorer,
        add_samples=sample_source(cfg, tokenizer, scorer), eval_rows=held,
        generator=torch.Generator().manual_seed(cfg.trainer.seed), params=sampling_params(cfg), data_notes=notes,
    )
