"""Checkpoints of a sharded learner: every rank writes its own shards with torch.distributed.checkpoint.

`save_sharded_checkpoint` is the sharded counterpart of `checkpoint.save_checkpoint`, called on every
rank at once: the policy's trained weights, the learner's heads and the AdamW state go to `sharded/` in
the DCP format (`models.sharded_checkpoint`), each rank writing its shards, with no gather of the whole
model; rank 0 then writes the rest as a plain checkpoint has it (config and tokenizer in `model/`, the
scheduler, `state.pt`, the heads again in `modules.safetensors` for the readers of a reward model's
head), and publishes the directory atomically. DCP stores each tensor's global shape and the slices
each rank held, so `load_sharded_checkpoint` restores onto any number of ranks: N sharded ranks, or one
process with a plain model (and from there a run may go on sharded again).

Only trained parameters are saved (`ignore_frozen_params`): for a LoRA model its adapters and their
AdamW state, the frozen base coming from `model.path` on resume as for an unsharded LoRA run. The
adapters, small, are also gathered whole into `model/` as peft's files, as an unsharded LoRA run's
checkpoint holds them, for the export, `lmrl merge` and the readers of a run's checkpoint.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from lmrl.dist.data_parallel import Parallel
from lmrl.learners.checkpoint import load_state, publish_checkpoint
from lmrl.models.lora import ADAPTER_FILE
from lmrl.models.sharded_checkpoint import POLICY, SHARDED, is_sharded
from lmrl.models.weights import is_peft


def _stateful(learner) -> torch.nn.Module:
    """The learner's trained modules under one root (their checkpoint names: `policy.…`, `value_head.…`)."""
    return torch.nn.ModuleDict({POLICY: learner.model, **learner.modules()})


def _trained_state(learner):
    """(model, optimiser) state dicts of the trained parameters only: a LoRA model's frozen base is left out."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(_stateful(learner), learner.optimizer, options=StateDictOptions(ignore_frozen_params=True))


def _whole_adapters(learner, parallel: Parallel) -> dict[str, torch.Tensor] | None:
    """A sharded LoRA model's adapter weights, whole, on rank 0 (a collective); None on one process, whose
    model holds them whole already."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not parallel.sharded:
        return None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(learner.model, options=options)


def save_sharded_checkpoint(root: Path, step: int, learner, tokenizer, state: dict[str, Any], keep: int,
                            parallel: Parallel) -> Path:
    """Write `root/step-{step}` from every rank (a collective: all ranks call it); prune to `keep`."""
    import torch.distributed.checkpoint as dcp

    tmp = root / f".tmp-step-{step:06d}-sharded"
    if parallel.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    parallel.barrier()
    model_state, optim_state = _trained_state(learner)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / SHARDED))
    adapters = _whole_adapters(learner, parallel) if is_peft(learner.model) else None
    final = root / f"step-{step:06d}"
    if parallel.is_main:
        if is_peft(learner.model):
            learner.model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=adapters)
        else:
            learner.model.config.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        torch.save({"scheduler": learner.scheduler.state_dict()}, tmp / "scheduler.pt")
        publish_checkpoint(root, tmp, step, state, keep, learner.modules(), meta={"ranks": parallel.world_size})
    parallel.barrier()
    return final


def load_sharded_checkpoint(path: Path, learner) -> dict[str, Any]:
    """Restore a sharded checkpoint into `learner` (sharded over any number of ranks, or one process), in
    place; return its saved state (every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not is_sharded(path):
        raise RuntimeError(f"checkpoint {path} was written by a learner without trainer.sharding=fsdp; resume it "
                           "with trainer.sharding=none")
    saved_lora = (path / "model" / ADAPTER_FILE).exists()
    if saved_lora != is_peft(learner.model):
        held, model = ("LoRA adapters", "none") if saved_lora else ("a whole model", "LoRA adapters")
        raise RuntimeError(f"checkpoint {path} holds {held} but the model has {model} (set model.lora as the run "
                           "that saved it did)")
    model_state, optim_state = _trained_state(learner)
    loaded = {"model": model_state, "optim": optim_state}
    dcp.load(loaded, checkpoint_id=str(path / SHARDED))
    # every trained parameter was loaded (dcp.load fails on a missing one); the frozen base is not in the dicts
    set_state_dict(_stateful(learner), learner.optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"], options=StateDictOptions(ignore_frozen_params=True, strict=False))
    learner.scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False)["scheduler"])
    return load_state(path)
