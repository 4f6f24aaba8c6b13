"""A sharded learner's checkpoint: the weights as torch.distributed.checkpoint shards, gathered on demand.

A checkpoint written by `trainer.sharding: fsdp` (`learners.sharded_checkpoint`) holds, instead of
safetensors weights, a `sharded/` directory in the format of `torch.distributed.checkpoint` (DCP):
each rank's shards of the policy, the learner's heads and the AdamW state, under `model.policy.<name>`
(the transformers parameter names), `model.<head>.<name>` and `optim.…`. Its `model/` folder holds
the config and tokenizer only. `gather_weights` reads the shards in one process, whatever world size
wrote them, into a plain transformers directory: what `lmrl export`, a pipeline's export and the
evaluation of a checkpoint read.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

SHARDED = "sharded"  # the DCP directory inside a checkpoint
POLICY = "policy"  # the policy's prefix among the checkpoint's modules


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
