"""The rollout engine of a run and its sampling parameters, from the Config."""
from __future__ import annotations

from lmrl.config import Config
from lmrl.engines.base import ENGINES, SamplingParams
from lmrl.engines.hf import HFEngine
from lmrl.engines.server_pool import ServerPool, spec_for
from lmrl.engines.workers import WorkerPool
from lmrl.models.precision import resolve_bf16
from lmrl.models.weights import detached_copy


def eos_ids(tokenizer, model) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation-config EOS ids."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(ids)


def build_engine(cfg: Config, model, tokenizer):
    """The rollout engine `rollout.engine` over `model`, stopping at every EOS the model declares; with
    `dist.backend` set and one learner rank, a pool of `hf` rollout workers (`engines.workers`) instead, and
    with `dist.servers` engine servers hosting `rollout.engine` (`engines.server_pool`).

    An engine with settings of its own (context length, memory) reads them in its `from_config`.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bf16 = resolve_bf16(cfg.trainer.bf16, next(model.parameters()).device)
    if cfg.dist.servers:
        return server_pool(cfg, model, eos_ids(tokenizer, model), pad, bf16)
    if cfg.dist.rollout_pool:
        d = cfg.dist
        return WorkerPool(model, eos_ids(tokenizer, model), pad, bf16, workers=d.rollout_workers,
                          threads=d.worker_threads, backend=d.backend, max_restarts=d.max_restarts)
    engine = ENGINES.get(cfg.rollout.engine)
    if hasattr(engine, "from_config"):
        return engine.from_config(cfg, model, eos_ids(tokenizer, model), pad, bf16=bf16)
    return engine(model, eos_ids(tokenizer, model), pad, bf16=bf16)


def server_pool(cfg: Config, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool) -> ServerPool:
    """`dist.rollout_workers` engine servers hosting `rollout.engine`, with the engine's own settings."""
    d, engine = cfg.dist, ENGINES.get(cfg.rollout.engine)
    options = engine.options(cfg, model) if hasattr(engine, "options") else {}
    spec = spec_for(model, cfg.rollout.engine, eos_token_ids, pad_token_id, bf16, threads=d.worker_threads,
                    options=options)
    return ServerPool(model, spec, servers=d.rollout_workers, backend=d.backend, max_restarts=d.max_restarts,
                      broadcast=d.broadcast, devices=d.server_devices, only_changed=d.broadcast_changed)


def async_engines(cfg: Config, engine, model, tokenizer):
    """The asynchronous loop's engines: (rollout, evaluation). The rollout engine owns its weights and
    loads them version by version while the learner trains (an `hf` engine gets a copy of the model);
    evaluation reads the learner's current module with an `hf` engine."""
    bf16 = resolve_bf16(cfg.trainer.bf16, next(model.parameters()).device)
    if engine.shares_module:
        return HFEngine(detached_copy(model), eos_ids(tokenizer, model), engine.pad_token_id, bf16=bf16), engine
    return engine, HFEngine(model, eos_ids(tokenizer, model), engine.pad_token_id, bf16=bf16)


def sampling_params(cfg: Config) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
