"""Assembles the stages of a run from its Config: data first (fails fast), then the model."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lmrl.algos import Algorithm
from lmrl.config import Config, ConfigError
from lmrl.dist import Parallel, init_from_env
from lmrl.dist.process_group import hooks
from lmrl.dist.rollouts import ShardedRollouts
from lmrl.data import BATCH_SOURCES, GROUP_FILTERS, SAMPLERS, OfflineData, build_sampler, sample_source
from lmrl.data.mixture import MixtureSampler, MixtureScorer
from lmrl.data.probe import bind_probe
from lmrl.engines import SamplingParams, sampling_params
from lmrl.envs.controllers import build_controller
from lmrl.envs.mixture import MixtureEntry, load_mixture
from lmrl.envs.pieces import Pieces, build_pieces
from lmrl.envs.prepare import check_rows_for_a_step, encode_task
from lmrl.envs.tasks import TaskData, load_task
from lmrl.loops.role_setup import Role, build_roles
from lmrl.loops.run_dir import run_dir_for
from lmrl.learners import Learner
from lmrl.validation import check_names, check_row_fields
from lmrl.models import load_tokenizer, resolve_model_path
from lmrl.models.device import resolve_device
from lmrl.models.memory import ModelShape, estimate_memory
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
    add_samples: Callable  # the run's sample source: kept groups -> (groups with added samples, metrics)
    eval_rows: list[dict]
    generator: torch.Generator
    params: SamplingParams
    data_notes: dict[str, float]
    parallel: Parallel = field(default_factory=Parallel)  # this process's rank in a data-parallel run
    offline: OfflineData | None = None  # an offline batch source's encoded rows (`batches.source`); None: rollouts
    controller: Any = None  # what writes the training rollouts' completions (`rollout.controller`); None: the engine
    mixture: dict[str, MixtureEntry] = field(default_factory=dict)  # a task mixture's tasks by name; {}: one task
    roles: dict[str, Role] = field(default_factory=dict)  # the run's roles besides the policy (`roles:`)

    def controllers(self) -> dict[str, Any]:
        """The rollout controllers in use by task ("" for a run of one task), those set only."""
        found = {name: e.controller for name, e in self.mixture.items()} if self.mixture else {"": self.controller}
        return {name: c for name, c in found.items() if c is not None}


def preflight(cfg: Config, rows: int = 16, resume: Path | None = None, trains: bool = True) -> str:
    """What a real run would check before training, without loading weights: names, the run directory (a new
    run may not write into another's; `resume`: the run continued; `trains=False`: an evaluation, which writes
    no run), the device, the model directory and tokenizer, the split's counts, and the first `rows` training
    rows encoded with the fields the config names."""
    check_names(cfg)
    check_sharding(cfg)
    where = "resumed" if resume is not None else run_dir_for(cfg) if trains else None
    device = resolve_device(cfg.trainer.device)
    path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(path)
    if cfg.mixture.tasks:
        entries, task, _ = load_mixture(cfg, tokenizer)
        for entry in entries:
            check_row_fields(entry.cfg, entry.train_rows[:rows])
        train, held = task.train[:rows], task.eval[:1]
    else:
        task = load_task(cfg.task)
        check_rows_for_a_step(cfg, len(task.train), task)
        train, held, _ = encode_task(cfg, tokenizer, TaskData(task.train[:rows], task.eval[:1]))
        check_row_fields(cfg, train)
    offline = "" if BATCH_SOURCES.spec(cfg.batches.source).online else \
        f"; batches: {read_offline(cfg, tokenizer, train, held).summary()}"
    what = f"task {cfg.task.name}" if not cfg.mixture.tasks else "mixture"
    return (f"model {path} on {device}; {what}: {task.summary()}; the first {len(train)} training rows "
            f"load with fields {sorted(train[0])}{offline}" + (f"; run directory {where}" if where else "")
            + f"; {memory_line(cfg, path, device)}")


def memory_line(cfg: Config, path: Path, device: torch.device) -> str:
    """What a learner rank of this run holds by the memory model (`models.memory`, docs/scaling.md): the
    model's shape from its config.json, trainer.bf16's precision, the ranks (torchrun's WORLD_SIZE or
    dist.learner_ranks) and `trainer.sharding` where set, a micro-batch of trainer.micro_batch_tokens, and
    the KV cache of the rank's share of a step's generations when its engine runs in its process."""
    from transformers import AutoConfig

    ranks = max(cfg.dist.learner_ranks, int(os.environ.get("WORLD_SIZE", "1")))
    sharding = "none" if getattr(cfg.trainer, "sharding", "none") in ("none", None) else "fsdp"
    source = BATCH_SOURCES.spec(cfg.batches.source)
    sequences = -(-cfg.rollout.prompts_per_step * cfg.rollout.group_size // ranks)
    in_process = source.online and not cfg.dist.rollout_pool
    kv_tokens = sequences * (cfg.task.max_prompt_tokens + cfg.rollout.max_new_tokens) if in_process else 0
    algorithm = Algorithm(cfg.algo, cfg.rollout.max_new_tokens, policy_gradient=source.policy_gradient)
    estimate = estimate_memory(ModelShape.from_hf(AutoConfig.from_pretrained(path)),
                               precision="bf16_autocast" if resolve_bf16(cfg.trainer.bf16, device) else "fp32",
                               sharding=sharding, ranks=ranks, micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                               checkpointing=cfg.trainer.gradient_checkpointing, kv_tokens=kv_tokens,
                               reference=algorithm.needs_reference)
    notes = [f"{ranks} rank{'s' if ranks > 1 else ''}, sharding {sharding}"] + (["with a reference model"] if algorithm.needs_reference else []) \
        + (["LoRA trains only its adapters, so grads and optimiser are far smaller"] if cfg.model.lora else [])
    return f"{estimate.line()} ({'; '.join(notes)})"


def build_stages(cfg: Config, model=None, tokenizer=None) -> Stages:
    """Validate names, load and encode the data, then load the model and build every stage.

    `model` and `tokenizer` may be passed in (tests, notebooks); otherwise `model.path` is loaded.
    The tokenizer, data, model (with its LoRA adapters, on `trainer.device`) and engine are
    `envs.pieces.build_pieces`'s; the training rows are checked and the sampler built before any weights
    load, and the learner shares the engine's model.
    """
    check_names(cfg)
    parallel = data_parallel(cfg)
    sampler, offline = None, None
    source = BATCH_SOURCES.spec(cfg.batches.source)

    def data_ready(pieces: Pieces) -> None:
        nonlocal sampler, offline
        shown = cfg.run.progress and parallel.is_main
        if shown:
            summary = TaskData(pieces.train_rows, pieces.eval_rows, pieces.task.held_out_from).summary()
            print(f"data: {summary}", file=sys.stderr, flush=True)
        for own, rows in [(e.cfg, e.train_rows) for e in pieces.mixture] or [(cfg, pieces.train_rows)]:
            check_row_fields(own, rows)
        sampler = MixtureSampler(cfg, pieces.mixture) if pieces.mixture else build_sampler(cfg, pieces.train_rows)
        if not source.online:
            offline = read_offline(cfg, pieces.tokenizer, pieces.train_rows, pieces.eval_rows)
            if shown:
                print(f"batches: {offline.summary()}", file=sys.stderr, flush=True)

    pieces = build_pieces(cfg, model, tokenizer, trains=True, before_model=data_ready)
    model, tokenizer, engine = pieces.model, pieces.tokenizer, pieces.engine
    if parallel.world_size > 1:
        engine = ShardedRollouts(engine, parallel)
    algorithm = Algorithm(cfg.algo, cfg.rollout.max_new_tokens, policy_gradient=source.policy_gradient)
    temperature = cfg.rollout.temperature if source.online else 1.0  # an offline dataset's rows: the model's own p
    learner = Learner(model, cfg.trainer, temperature, needs_reference=algorithm.needs_reference,
                      bf16=resolve_bf16(cfg.trainer.bf16, pieces.device), critic=algorithm.critic,
                      critic_lr=cfg.algo.critic_lr, critic_shares_trunk=cfg.algo.critic_shares_trunk,
                      score_head=algorithm.score_labels, parallel=parallel)
    if cfg.roles and parallel.world_size > 1:
        raise ConfigError("a run with roles runs in one process: launch it without torchrun")
    roles, engine = build_roles(cfg, model, tokenizer, engine, pieces.device)
    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    for own, own_sampler in [(e.cfg, sampler.children[e.name]) for e in pieces.mixture] or [(cfg, sampler)]:
        bind_probe(own_sampler, own, engine, model, generator)  # a sampler that checks prompts with the policy
    scorer = MixtureScorer(pieces.mixture) if pieces.mixture else RewardScorer(cfg.reward)
    for entry in pieces.mixture:
        entry.controller = build_controller(entry.cfg.rollout.controller, entry.cfg.rollout.controller_params,
                                            tokenizer)
    return Stages(
        cfg=cfg, tokenizer=tokenizer, model=model, engine=engine, algorithm=algorithm, learner=learner,
        sampler=sampler, keep_group=GROUP_FILTERS.get(cfg.data.group_filter), scorer=scorer,
        add_samples=sample_source(cfg, tokenizer, scorer), eval_rows=pieces.eval_rows,
        generator=generator, params=sampling_params(cfg), data_notes=pieces.data_notes, parallel=parallel,
        offline=offline,
        controller=build_controller(cfg.rollout.controller, cfg.rollout.controller_params, tokenizer),
        mixture={e.name: e for e in pieces.mixture}, roles=roles,
    )


def read_offline(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    """The offline batch source's rows, read and encoded (a bad dataset is a ConfigError naming it)."""
    try:
        return BATCH_SOURCES.get(cfg.batches.source)(cfg, tokenizer, rows, eval_rows)
    except (ValueError, OSError) as err:
        raise ConfigError(f"batches: {err}") from None


def data_parallel(cfg: Config) -> Parallel:
    """This process's place in a data-parallel run (launched by torchrun, or a group already joined):
    its ranks generate a share of each batch and train a share of it (docs/scaling.md); with
    `trainer.sharding: fsdp` they hold shards of the model (`dist.sharded`)."""
    import torch.distributed as dist

    check_sharding(cfg)
    sharding = {"sharded": cfg.trainer.sharding == "fsdp", "cpu_offload": cfg.trainer.cpu_offload,
                "bf16": resolve_bf16(cfg.trainer.bf16, resolve_device(cfg.trainer.device))}
    joined = dist.is_initialized() and dist.get_world_size() > 1  # (vLLM opens a one-process group of its own)
    parallel = hooks(**sharding) if joined else init_from_env(**sharding)
    if parallel.world_size > 1 and (cfg.rollout.max_staleness is not None or cfg.dist.rollout_pool
                                    or cfg.rollout.engine != "hf" or cfg.algo.guards.enabled):
        raise ConfigError("a data-parallel run (several ranks) uses the synchronous loop with each rank's own hf "
                          "engine and no guards: unset rollout.max_staleness, keep dist.backend=none (or ray "
                          "with dist.learner_ranks > 1), rollout.engine=hf and algo.guards.enabled=false")
    return parallel


def check_sharding(cfg: Config) -> None:
    """What `trainer.sharding: fsdp` does not run with (on any number of ranks: its checkpoints are sharded)."""
    if cfg.trainer.cpu_offload and cfg.trainer.sharding != "fsdp":
        raise ConfigError("trainer.cpu_offload keeps FSDP2 shards on the CPU: it needs trainer.sharding=fsdp")
    if cfg.trainer.cpu_offload and resolve_device(cfg.trainer.device).type != "cuda":
        raise ConfigError("trainer.cpu_offload keeps the shards of a CUDA learner in CPU memory (FSDP2's "
                          "CPUOffloadPolicy needs an accelerator to compute on); a CPU learner's shards are there already")
    if cfg.trainer.sharding != "fsdp":
        return
    sampler = SAMPLERS.get(cfg.data.sampler)
    probes = getattr(sampler, "probes", None)
    probing = probes(**cfg.data.sampler_params) if probes is not None else getattr(sampler, "needs_probe", False)
    if probing:
        raise ConfigError(f"trainer.sharding=fsdp does not run with data.sampler={cfg.data.sampler} (it probes "
                          "prompts with the whole model): use trainer.sharding=none for it (docs/scaling.md, "
                          "'Sharded learner')")
