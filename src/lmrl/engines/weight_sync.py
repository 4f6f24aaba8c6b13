"""How new policy weights travel from the learner to a rollout engine, tagged with their version.

A transport packs the learner's weights (`models.weights.inference_weights`: transformers names,
LoRA deltas folded in) into a `Parcel` that a rollout worker opens later, in another thread,
process or machine; the version travels with it, so an engine loads one whole version between
rollouts and never mixes two inside one. Registered in `WEIGHT_TRANSPORTS` (`rollout.weight_transport`):

- `in_process`: the tensors cloned into a dict (one process; the async loop's default).
- `shared_file`: one safetensors file in shared memory (/dev/shm where it exists): any process on
  the machine maps it.
- `ray`: the Ray object store (any process or machine of a Ray cluster; the `ray` extra).

`benchmarks/weight_transport.py` measures each in seconds per MB (docs/scaling.md).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors.torch import load_file, save_file

from lmrl.registry import Registry

WEIGHT_TRANSPORTS: Registry = Registry("weight transport")


@dataclass
class Parcel:
    """One version of the weights in transit: what the transport needs to open it, and its size."""

    version: int
    payload: Any
    nbytes: int


def _clones(weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Copies of the tensors; tied weights (one storage under two names) are copied once and stay tied."""
    out, copies = {}, {}
    for name, t in weights:
        key = (t.data_ptr(), t.shape, t.dtype)
        if key not in copies:
            copies[key] = t.detach().to("cpu", copy=True).contiguous()
        out[name] = copies[key]
    return out


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes held, each storage counted once."""
    return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors.values()}.values())


@WEIGHT_TRANSPORTS.register("in_process", "tensors cloned into a dict, handed over in the same process")
class InProcess:
    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> Parcel:
        tensors = _clones(weights)
        return Parcel(version, tensors, _nbytes(tensors))

    def receive(self, parcel: Parcel) -> dict[str, torch.Tensor]:
        return parcel.payload

    def release(self, parcel: Parcel) -> None:
        parcel.payload = None


@WEIGHT_TRANSPORTS.register("shared_file", "one safetensors file in shared memory (/dev/shm), for any local process")
class SharedFile:
    def __init__(self, directory: str | None = None):
        root = directory or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
        self.directory = Path(tempfile.mkdtemp(prefix="lmrl-weights-", dir=root))

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> Parcel:
        tensors, aliases, owners = {}, {}, {}
        for name, t in weights:  # tied weights (one storage, two names) are written once
            t = t.detach().to("cpu").contiguous()
            key = (t.data_ptr(), t.shape, t.dtype)
            if key in owners:
                aliases[name] = owners[key]
            else:
                owners[key], tensors[name] = name, t
        path = self.directory / f"v{version}.safetensors"
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"version": str(version), "aliases": json.dumps(aliases)})
        os.replace(tmp, path)  # a reader never sees half a file
        return Parcel(version, (str(path), aliases), _nbytes(tensors))

    def receive(self, parcel: Parcel) -> dict[str, torch.Tensor]:
        path, aliases = parcel.payload
        tensors = load_file(path)
        return {**tensors, **{name: tensors[owner] for name, owner in aliases.items()}}

    def release(self, parcel: Parcel) -> None:
        Path(parcel.payload[0]).unlink(missing_ok=True)


@WEIGHT_TRANSPORTS.register("ray", "the Ray object store, for Ray actors on any machine of the cluster (ray extra)")
class RayObjectStore:
    def __init__(self):
        try:
            import ray
        except ImportError as err:
            raise ImportError("rollout.weight_transport: ray needs Ray: pip install 'lmrl[ray]'") from err
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.ray = ray

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> Parcel:
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in weights}  # tied ones stay one tensor
        return Parcel(version, self.ray.put(tensors), _nbytes(tensors))

    def receive(self, parcel: Parcel) -> dict[str, torch.Tensor]:
        return self.ray.get(parcel.payload)

    def release(self, parcel: Parcel) -> None:
        parcel.payload = None  # Ray counts references: the object goes when the last one does


def build_transport(name: str):
    return WEIGHT_TRANSPORTS.get(name)()
