"""Weights broadcast from the learner to engine servers through a torch.distributed group of their own.

The learner (rank 0) and its N engine servers (ranks 1…N) form a process group apart from any other
in these processes (the learner's data-parallel group, vLLM's own): a `ProcessGroupGloo` (CPU) or
`ProcessGroupNCCL` (GPUs) built on a TCP store the learner hosts, never the default group. A group
is formed again, under a new generation, whenever a server is restarted.

A version travels as a `Plan` (names, shapes, dtypes, tied names, the bucket layout: a few hundred
bytes, sent to each server over its command channel) and then the tensors themselves, broadcast from
rank 0 one bucket at a time: consecutive tensors of one dtype concatenated up to `bucket_mb`, a
larger tensor alone (the pool's 1 MB moved weights 3–5× faster over gloo than 64 MB buckets).
With `only_changed` the learner sends only the tensors that moved since the servers received them
(`ChangeTracker`): the layers a LoRA adapter folds into, the trainable ones of a partly frozen
model; a server keeps the others from the version before.

A server that holds a version is rank 0 of a group of its own with servers started again after a
death, on the same store: it sends them its version with the same `send` (`engines.holders`).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.distributed as dist

STORE_PREFIX = "lmrl-weights"


@dataclass
class Plan:
    """One version in transit: what each rank needs to post the same collectives and unpack them."""

    version: int
    tensors: list[tuple[str, tuple[int, ...], torch.dtype]]  # sent, in order
    aliases: dict[str, str] = field(default_factory=dict)  # a tied name -> the sent name sharing its storage
    buckets: list[list[int]] = field(default_factory=list)  # indices into `tensors`, one dtype per bucket
    nbytes: int = 0


def plan_weights(weights: Iterable[tuple[str, torch.Tensor]], version: int, bucket_mb: float,
                 skip: set[str] = frozenset()) -> tuple[Plan, list[torch.Tensor]]:
    """The plan of `weights` as `version` and the tensors it sends; tied names sent once, `skip` left out."""
    sent, tensors, owners, aliases = [], [], {}, {}
    for name, t in weights:
        key = (t.data_ptr(), t.shape, t.dtype)
        if key in owners:
            aliases[name] = owners[key]
            continue
        owners[key] = name
        if name not in skip:
            sent.append((name, tuple(t.shape), t.dtype))
            tensors.append(t.detach())
    aliases = {a: o for a, o in aliases.items() if o not in skip}
    limit = bucket_mb * 2**20
    buckets, size = [], 0.0
    for i, (_, shape, dtype) in enumerate(sent):
        nbytes = tensors[i].numel() * tensors[i].element_size()
        if not buckets or sent[buckets[-1][0]][2] != dtype or size + nbytes > limit:
            buckets.append([])
            size = 0.0
        buckets[-1].append(i)
        size += nbytes
    total = sum(t.numel() * t.element_size() for t in tensors)
    return Plan(version, sent, aliases, buckets, total), tensors


class ChangeTracker:
    """Which tensors moved since the servers last received them: another tensor object in its place, or
    one whose in-place version counter moved (optimiser steps, `load_state_dict`). The tensors last sent
    are held, so their memory is not reused by a new tensor at the same address. Writes through
    `.data` bypass the counter: `only_changed` is for models trained by ordinary in-place updates."""

    def __init__(self):
        self.held: dict[str, tuple[torch.Tensor, int]] = {}

    def unchanged(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        return {name for name, t in weights if name in self.held and self._same(self.held[name], t)}

    def record(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.held = {name: (t, t._version) for name, t in weights}

    def forget(self) -> None:
        self.held = {}

    @staticmethod
    def _same(held: tuple[torch.Tensor, int], t: torch.Tensor) -> bool:
        old, version = held
        return (old.data_ptr() == t.data_ptr() and old.shape == t.shape and old.dtype == t.dtype
                and old.stride() == t.stride() and t._version == version)


def new_group(store, rank: int, world: int, backend: str, timeout_s: float):
    """This rank's end of a weight group of `world` ranks over `store`; not the default group."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, options)
    return dist.ProcessGroupGloo(store, rank, world, timeout)


def join(address: tuple[str, int], rank: int, world: int, generation: int, backend: str, timeout_s: float):
    """A server's end of generation `generation` of the weight group hosted at `address`."""
    store = dist.TCPStore(address[0], address[1], world, False, timeout=datetime.timedelta(seconds=timeout_s))
    return new_group(dist.PrefixStore(f"{STORE_PREFIX}-{generation}", store), rank, world, backend, timeout_s)


def _broadcast(group, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([tensor], options).wait()


def send(group, plan: Plan, tensors: list[torch.Tensor], device: torch.device) -> None:
    """Rank 0's side of one version's broadcast: `plan`'s buckets, from `device` (the group's)."""
    for bucket in plan.buckets:
        parts = [tensors[i].reshape(-1) for i in bucket]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        _broadcast(group, flat.to(device).contiguous())


def receive(group, plan: Plan, device: torch.device) -> dict[str, torch.Tensor]:
    """A server's side of one version's broadcast: the tensors of `plan`, tied names included."""
    out = {}
    for bucket in plan.buckets:
        shapes = [plan.tensors[i][1] for i in bucket]
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        flat = torch.empty(sum(sizes), dtype=plan.tensors[bucket[0]][2], device=device)
        _broadcast(group, flat)
        for i, part, shape in zip(bucket, flat.split(sizes), shapes):
            out[plan.tensors[i][0]] = part.view(shape)
    out.update({alias: out[owner] for alias, owner in plan.aliases.items()})
    return out


class Broadcaster:
    """The learner's end: hosts the store, forms each generation of the group, broadcasts versions."""

    def __init__(self, backend: str, device: torch.device, host: str = "127.0.0.1", timeout_s: float = 300.0):
        self.backend, self.device, self.timeout_s = backend, device, timeout_s
        self.store = dist.TCPStore(host, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_for_workers=False)
        self.address = (host, self.store.port)
        self.generation, self.group = 0, None

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation

    def form(self, world: int) -> None:
        """Join the current generation as rank 0 (the servers join it at the same time)."""
        self.group = None
        store = dist.PrefixStore(f"{STORE_PREFIX}-{self.generation}", self.store)
        self.group = new_group(store, 0, world, self.backend, self.timeout_s)

    def send(self, plan: Plan, tensors: list[torch.Tensor]) -> None:
        send(self.group, plan, tensors, self.device)
