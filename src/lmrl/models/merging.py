"""Weight-space interpolation and merging of models: linear, SLERP and task arithmetic (docs/merging.md).

Interpolating an SFT and an RL checkpoint, θ(t) = (1−t)·θ_SFT + t·θ_RL, trades what RL gained
against what it forgot; task arithmetic, θ = θ_base + Σ_i λ_i (θ_i − θ_base), adds the deltas of
several models fine-tuned from one base. Every rule works tensor by tensor on models of one
architecture. The tensor functions are pure; `merge_models` reads the inputs (transformers
directories, lmrl checkpoints, LoRA checkpoints merged into their base first) and writes a
transformers directory with the tokenizer.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import ValidationError

from lmrl.config import ConfigError, ModelConfig
from lmrl.recipe_files import read_yaml

METHODS = ("linear", "slerp", "task_arithmetic")
PARALLEL = 0.9995  # |cos| above this: SLERP falls back to linear (the angle is too small to divide by)


def lerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """(1−t)·a + t·b, computed in float64 and returned in a's dtype."""
    return ((1 - t) * a.double() + t * b.double()).to(a.dtype)


def weighted_sum(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Σ w_i·x_i in float64, in the first tensor's dtype (linear merging of several models)."""
    total = sum(w * x.double() for w, x in zip(weights, tensors))
    return total.to(tensors[0].dtype)


def slerp(a: torch.Tensor, b: torch.Tensor, t: float, parallel: float = PARALLEL) -> torch.Tensor:
    """Spherical interpolation of two tensors seen as flat vectors.

    With Ω the angle between a and b: sin((1−t)Ω)/sin Ω · a + sin(tΩ)/sin Ω · b. The coefficients
    apply to the tensors as they are (not normalised), so unit vectors stay unit vectors and the
    endpoints are a and b. Nearly parallel or anti-parallel vectors (|cos Ω| > `parallel`) and
    zero vectors fall back to `lerp`, where the formula divides by sin Ω ≈ 0.
    """
    x, y = a.double().flatten(), b.double().flatten()
    norms = x.norm() * y.norm()
    if norms == 0:
        return lerp(a, b, t)
    cos = float((x @ y) / norms)
    if abs(cos) > parallel:
        return lerp(a, b, t)
    omega = math.acos(max(-1.0, min(1.0, cos)))
    s = math.sin(omega)
    out = math.sin((1 - t) * omega) / s * x + math.sin(t * omega) / s * y
    return out.reshape(a.shape).to(a.dtype)


def task_arithmetic(base: torch.Tensor, tuned: Sequence[torch.Tensor], lambdas: Sequence[float]) -> torch.Tensor:
    """base + Σ_i λ_i (θ_i − base), in float64, returned in base's dtype."""
    b = base.double()
    return (b + sum(lam * (x.double() - b) for lam, x in zip(lambdas, tuned))).to(base.dtype)


def _check_same_tensors(states: Sequence[dict[str, torch.Tensor]], names: Sequence[str]) -> None:
    ref = states[0]
    for name, state in zip(names[1:], states[1:]):
        missing, extra = sorted(ref.keys() - state.keys()), sorted(state.keys() - ref.keys())
        if missing or extra:
            raise ValueError(f"{name} does not have the tensors of {names[0]} (missing {missing[:3]}, "
                             f"extra {extra[:3]}): models to merge must share one architecture")
        for key, tensor in ref.items():
            if state[key].shape != tensor.shape:
                raise ValueError(f"{name}: {key} has shape {tuple(state[key].shape)}, {names[0]} has "
                                 f"{tuple(tensor.shape)}: models to merge must share one architecture")


def merge_state_dicts(states: Sequence[dict[str, torch.Tensor]], method: str = "linear", *, t: float | None = None,
                      weights: Sequence[float] | None = None, base: dict[str, torch.Tensor] | None = None,
                      lambdas: Sequence[float] | None = None, names: Sequence[str] | None = None
                      ) -> dict[str, torch.Tensor]:
    """One merged state dict from models of one architecture.

    linear: weights (one per model, normalised to sum to 1; default uniform) or, for two models,
    `t` (weights 1−t, t). slerp: two models and `t`. task_arithmetic: `base` and `lambdas` (one
    per model; default 1). Tensors that are not floating point (integer buffers) must be equal and
    are copied. `names` label the models in errors.
    """
    plan = _plan(len(states), method, t, weights, base is not None, lambdas)
    names = list(names or [f"model {i + 1}" for i in range(len(states))])
    everything = [base, *states] if base is not None else list(states)
    _check_same_tensors(everything, (["base"] + names) if base is not None else names)
    out = {}
    for key, first in states[0].items():
        tensors = [s[key] for s in states]
        if not first.is_floating_point():
            if any(not torch.equal(first, x) for x in [*tensors, *([base[key]] if base is not None else [])]):
                raise ValueError(f"{key} is not floating point and differs between the models: it cannot be merged")
            out[key] = first.clone()
        elif method == "slerp":
            out[key] = slerp(tensors[0], tensors[1], plan[1])
        elif method == "task_arithmetic":
            out[key] = task_arithmetic(base[key], tensors, plan)
        else:
            out[key] = weighted_sum(tensors, plan)
    return out


def _plan(n: int, method: str, t: float | None, weights: Sequence[float] | None, has_base: bool,
          lambdas: Sequence[float] | None) -> list[float]:
    """The coefficients of `method` for `n` models: linear weights, (1−t, t) for SLERP, or the λ_i."""
    if method not in METHODS:
        raise ValueError(f"unknown merge method {method!r}; choose from {', '.join(METHODS)}")
    if has_base != (method == "task_arithmetic"):
        raise ValueError("a base model goes with task_arithmetic only, and task_arithmetic needs one")
    if lambdas is not None and method != "task_arithmetic":
        raise ValueError("lambdas go with task_arithmetic; linear takes weights (or t), slerp takes t")
    if weights is not None and method != "linear":
        raise ValueError("weights go with linear; slerp takes t, task_arithmetic takes lambdas")
    if t is not None and (method == "task_arithmetic" or n != 2 or weights is not None):
        raise ValueError("t interpolates exactly two models (linear or slerp), without weights")
    if method == "task_arithmetic":
        plan = [1.0] * n if lambdas is None else [float(x) for x in lambdas]
        if n < 1 or len(plan) != n:
            raise ValueError(f"task_arithmetic: one lambda per model, got {len(plan)} for {n} models")
        return plan
    if n < 2 or (method == "slerp" and n != 2):
        raise ValueError(f"{method} needs {'exactly' if method == 'slerp' else 'at least'} two models, got {n}")
    if weights is None:
        return [1 - t, t] if t is not None else [1.0 / n] * n
    if len(weights) != n or sum(weights) <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"linear: one non-negative weight per model with a positive sum, got {list(weights)} "
                         f"for {n} models")
    return [float(w) / sum(weights) for w in weights]


# --- reading and writing models ----------------------------------------------------------------


def _checkpoint_of(path: Path) -> Path | None:
    """The lmrl checkpoint `path` names: itself (`checkpoints/step-N`) or a run's latest; else None."""
    from lmrl.models.checkpoint_dirs import COMPLETE, latest_checkpoint

    if (path / COMPLETE).exists() and (path / "model").is_dir():
        return path
    if (path / "config.yaml").exists() and (path / "checkpoints").is_dir():
        found = latest_checkpoint(path / "checkpoints")
        if found is None:
            raise FileNotFoundError(f"run {path} has no complete checkpoint to merge")
        return found
    return None


def _run_model(run_dir: Path) -> ModelConfig:
    """The model section of the config a run was started with (`run_dir/config.yaml`)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir}: no config.yaml there, so it is not an lmrl run directory")
    try:
        return ModelConfig.model_validate(read_yaml(path).get("model", {}))
    except ValidationError as err:
        raise ConfigError(f"{path}: invalid model section: {err}") from None


@contextmanager
def model_directories(sources: Sequence[str]) -> Iterator[list[Path]]:
    """Transformers directories for model arguments, run or checkpoint directories, while in the block.

    A full fine-tuning checkpoint's `model/` is used as it is; a LoRA checkpoint is exported with
    its adapters folded into the base (`lora.export_merged`, its run's `model.path` and
    `model.lora`) into a temporary directory removed afterwards.
    """
    from lmrl.models.loading import resolve_model_path
    from lmrl.models.lora import ADAPTER_FILE, export_merged
    from lmrl.models.sharded_checkpoint import is_sharded

    with tempfile.TemporaryDirectory(prefix="lmrl-merge-") as tmp:
        dirs = []
        for i, source in enumerate(sources):
            path = Path(source).expanduser()
            ckpt = _checkpoint_of(path) if path.is_dir() else None
            if ckpt is None:
                dirs.append(resolve_model_path(source))
            elif (ckpt / "model" / ADAPTER_FILE).exists() or is_sharded(ckpt):  # adapters, or FSDP shards
                model = _run_model(ckpt.parent.parent)
                dirs.append(export_merged(ckpt / "model", model.path, model.lora, Path(tmp) / str(i)))
            else:
                dirs.append(ckpt / "model")
        yield dirs


def merge_models(sources: Sequence[str], out: Path, method: str = "linear", *, t: float | None = None,
                 weights: Sequence[float] | None = None, base: str | None = None,
                 lambdas: Sequence[float] | None = None) -> Path:
    """Merge `sources` (see `model_directories`) with `method` and write a transformers directory.

    The config and tokenizer come from the base model (task arithmetic) or the first source; the
    weights are loaded and written in float32.
    """
    from transformers import AutoTokenizer

    from lmrl.models.loading import load_model

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new directory for the merged model")
    everything = [base, *sources] if base is not None else list(sources)
    with model_directories(everything) as dirs:
        models = [load_model(d) for d in dirs]
        states = [m.state_dict() for m in models]
        merged = merge_state_dicts(states[1:] if base is not None else states, method, t=t, weights=weights,
                                   base=states[0] if base is not None else None, lambdas=lambdas,
                                   names=list(sources))
        models[0].load_state_dict(merged)
        models[0].save_pretrained(out)
        AutoTokenizer.from_pretrained(dirs[0]).save_pretrained(out)
    return out
