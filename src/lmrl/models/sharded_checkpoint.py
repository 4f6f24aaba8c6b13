"""A sharded learner's checkpoint: the weights as torch.distributed.checkpoint shards, gathered on demand.

A checkpoint written by `trainer.sharding: fsdp` (`learners.sharded_checkpoint`) holds, instead of
safetensors weights, a `sharded/` directory in the format of `torch.distributed.checkpoint` (DCP):
each rank's shards of the policy's trained weights, the learner's heads and the AdamW state, under
`model.policy.<name>` (the transformers parameter names), `model.<head>.<name>` and `optim.…`. Its
`model/` folder holds the config and tokenizer only; a LoRA run's holds its adapters as peft's files
too, whole, as an unsharded LoRA checkpoint does (its shards have the adapters alone, no base).
`gather_weights` reads a whole model's shards in one process, whatever world size wrote them, into a
plain transformers directory: what `lmrl export`, a pipeline's export and the evaluation of a
checkpoint read. `loadable_model` is the folder of a checkpoint that loads as a model.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

SHARDED = "sharded"  # the DCP directory inside a checkpoint
POLICY = "policy"  # the policy's prefix among the checkpoint's modules
GATHERED = "gathered"  # a whole model's shards gathered into a transformers directory, inside its checkpoint


def is_sharded(checkpoint: Path) -> bool:
    """Whether `checkpoint` (a `step-N` directory) was written by a sharded learner."""
    return (Path(checkpoint) / SHARDED).is_dir()


def gather_weights(checkpoint: Path, out: Path) -> Path:
    """Write the full weights of sharded `checkpoint` with its config and tokenizer as transformers
    directory `out` (one process; no process group needed)."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint, out = Path(checkpoint), Path(out)
    config = AutoConfig.from_pretrained(checkpoint / "model")
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    weights = {f"{POLICY}.{k}": v for k, v in model.state_dict().items()}
    dcp.load({"model": weights}, checkpoint_id=str(checkpoint / SHARDED))
    model.load_state_dict({k[len(POLICY) + 1:]: v for k, v in weights.items()})
    shutil.copytree(checkpoint / "model", out, dirs_exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


def loadable_model(checkpoint: Path) -> Path:
    """The folder of `checkpoint` (a `step-N` directory) that loads as a model: `model/` where it holds weights
    (a plain checkpoint's transformers directory, a LoRA run's peft adapters, sharded or not); for a
    sharded learner's whole model, its shards gathered once into `step-N/gathered/` (kept there and pruned
    with the checkpoint; written under a temporary name and renamed, so concurrent callers are safe)."""
    checkpoint = Path(checkpoint)
    model = checkpoint / "model"
    if not is_sharded(checkpoint) or any(model.glob("*.safetensors")):
        return model
    out = checkpoint / GATHERED
    if not out.is_dir():
        tmp = checkpoint / f".{GATHERED}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        gather_weights(checkpoint, tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
    return out
