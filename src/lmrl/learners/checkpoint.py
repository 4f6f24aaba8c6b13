"""Atomic checkpoints: a directory written under a temporary name, then renamed into place.

Holds transformers-loadable safetensors weights (for a LoRA run, peft's adapter files instead), the
optimiser and scheduler, the learner's own modules besides the policy (e.g. a value head or a reward
model's score head, in `modules.safetensors`), and a pickled state (`state.pt`) whose parts `loops.run_state.RunState`
lists, so that `--resume` reproduces an uninterrupted run exactly. Checkpoints are device-independent: everything loads onto the CPU
first and is then copied into the (possibly CUDA) parameters and optimiser state.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lmrl.models.checkpoint_dirs import COMPLETE, list_checkpoints
from lmrl.models.lora import ADAPTER_FILE, load_adapter
from lmrl.models.weights import is_peft

def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state a run draws from; the CUDA ones (dropout on the GPU) when CUDA is in use."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {k: g.get_state() for k, g in generators.items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Restore `rng_state`; CUDA states only where the same number of CUDA devices is visible."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    for k, g in generators.items():
        g.set_state(state["generators"][k])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _module_tensors(modules: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v.detach().cpu().contiguous() for name, m in modules.items() for k, v in m.state_dict().items()}


def fsync_tree(path: Path) -> None:
    """Flush every file under `path`, then the directories, so a power loss cannot leave them empty."""
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        with file.open("rb") as f:
            os.fsync(f.fileno())
    for directory in [path, *sorted(p for p in path.rglob("*") if p.is_dir())]:
        fsync_dir(directory)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_checkpoint(path: Path) -> None:
    """Rename out of the `step-*` namespace first (atomic), then delete: a half-deleted checkpoint is never listed."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clean_partial(root: Path) -> None:
    """Delete what a killed process left: half-written (`.tmp-*`) and half-deleted (`.trash-*`) directories."""
    if root.exists():
        for leftover in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:
            shutil.rmtree(leftover, ignore_errors=True)


def save_checkpoint(root: Path, step: int, model, tokenizer, optimizer, scheduler, state: dict[str, Any],
                    keep: int = 2, modules: dict[str, torch.nn.Module] | None = None,
                    extra: Callable[[Path], None] | None = None) -> Path:
    """Write `root/step-{step}` atomically and prune to the newest `keep` complete checkpoints.

    Everything is written and flushed to disk under a temporary name, then renamed into place: a
    process killed at any moment (or a power loss) leaves either the complete checkpoint or none.
    `modules`: further trainable modules by name (the learner's value head), saved beside the model;
    `extra`: writes more into the checkpoint's directory (the run's other roles, `loops.roles`).
    """
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
    if extra is not None:
        extra(tmp)
    return publish_checkpoint(root, tmp, step, state, keep, modules)


def publish_checkpoint(root: Path, tmp: Path, step: int, state: dict[str, Any], keep: int,
                       modules: dict[str, torch.nn.Module] | None = None, meta: dict[str, Any] | None = None) -> Path:
    """Finish the checkpoint written so far under `tmp` (its modules, `state.pt`, `meta.json`, the COMPLETE
    marker), flush it, rename it to `root/step-{step}` and prune to the newest `keep`."""
    final = root / f"step-{step:06d}"
    if modules:
        save_file(_module_tensors(modules), str(tmp / "modules.safetensors"))
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}))
    (tmp / COMPLETE).write_text("ok\n")
    fsync_tree(tmp)
    if final.exists():
        remove_checkpoint(final)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        remove_checkpoint(old)
    return final


def saved_module(path: Path, name: str) -> dict[str, torch.Tensor] | None:
    """The tensors of the module `name` (e.g. "score_head") saved with checkpoint `path`, by parameter name;
    None when the checkpoint has none."""
    file = path / "modules.safetensors"
    if not file.exists():
        return None
    prefix = f"{name}."
    tensors = {k[len(prefix):]: v for k, v in load_file(str(file)).items() if k.startswith(prefix)}
    return tensors or None


def _load_modules(path: Path, modules: dict[str, torch.nn.Module]) -> None:
    file = path / "modules.safetensors"
    if not file.exists():
        raise RuntimeError(f"checkpoint {path} has no {', '.join(modules)} (it was saved by a run without them)")
    tensors = load_file(str(file))
    for name, module in modules.items():
        prefix = f"{name}."
        module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})


# records a checkpoint pickled under a module that has moved since: old module -> where the class lives now
MOVED_MODULES = {"lmrl.loops.async_": "lmrl.loops.source"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return super().find_class(MOVED_MODULES.get(module, module), name)


_PICKLE = SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")  # for torch.load


def load_state(path: Path) -> dict[str, Any]:
    """A checkpoint's `state.pt` (written by any earlier version: moved record classes are found anew)."""
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False, pickle_module=_PICKLE)


def load_checkpoint(path: Path, model, optimizer, scheduler,
                    modules: dict[str, torch.nn.Module] | None = None) -> dict[str, Any]:
    """Restore weights (and `modules`), optimiser and scheduler in place; return the saved state dict.

    Tensors load onto the CPU and are copied into the model's parameters wherever they live;
    `optimizer.load_state_dict` moves its state to its parameters' devices (so a run saved on a GPU
    resumes on the CPU and back). A peft model gets its adapters back; its frozen base is its own.
    """
    if is_peft(model):
        load_adapter(model, path / "model")
    else:
        _load_weights(path, model)
    if modules:
        _load_modules(path, modules)
    optim = torch.load(path / "optim.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(_with_kernels_of(optimizer, optim["optimizer"]))
    scheduler.load_state_dict(optim["scheduler"])
    return load_state(path)


def _with_kernels_of(optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` with the kernel choice (fused, foreach, capturable) of this process's optimizer, which
    depends on where its parameters are now, not where the checkpoint was written; fused AdamW's step
    counters then move onto the parameters' device as it expects."""
    kernel_keys = ("fused", "foreach", "capturable")
    groups = [{**group, **{k: now[k] for k in kernel_keys if k in now}}
              for group, now in zip(saved["param_groups"], optimizer.param_groups)]
    return {**saved, "param_groups": groups}


def _load_weights(path: Path, model) -> None:
    if (path / "model" / ADAPTER_FILE).exists():
        raise RuntimeError(f"checkpoint {path} holds LoRA adapters but the model has none (set model.lora as the "
                           "run that saved it did)")
    weights: dict[str, torch.Tensor] = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model (missing {missing}, unexpected {unexpected})")
