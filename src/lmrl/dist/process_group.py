"""Joining and leaving the process group of a data-parallel run.

`init_from_env` reads what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
and returns the learner's hooks: `DataParallel` (`Sharded` with `sharded=True`: FSDP2), or the
one-process `Parallel` when WORLD_SIZE is unset or 1. `spawn_local` starts N ranks on this machine (gloo, a file rendezvous) and returns what
a function returned on each; the tests and benchmarks use it.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmrl.dist.data_parallel import DataParallel, Parallel
from lmrl.dist.sharded import Sharded


def default_backend() -> str:
    """NCCL where CUDA is, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_from_env(backend: str | None = None, **sharding) -> Parallel:
    """Join the group torchrun describes (env://); one process without WORLD_SIZE > 1.

    Under NCCL each rank takes the CUDA device LOCAL_RANK. `sharding`: `hooks`'s options.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Parallel()
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://")
    return hooks(**sharding)


def init_explicit(rank: int, world_size: int, init_method: str, backend: str = "gloo") -> DataParallel:
    """Join a group by an explicit rendezvous (`file://…` or `tcp://host:port`)."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return DataParallel()


def hooks(sharded: bool = False, bf16: bool = False, cpu_offload: bool = False) -> DataParallel:
    """The learner's hooks over the joined group: replicas (`DataParallel`) or FSDP2 shards (`Sharded`, with
    bf16 mixed precision and CPU offload as asked)."""
    return Sharded(bf16=bf16, cpu_offload=cpu_offload) if sharded else DataParallel()


def teardown() -> None:
    """Leave the process group, if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn_local(fn: Callable[..., Any], world_size: int, *args, threads: int = 1) -> list[Any]:
    """`fn(parallel, *args)` on `world_size` local gloo ranks; their results, by rank.

    `fn` must be importable (a module-level function): ranks are spawned, not forked. Each rank runs
    `threads` torch threads (OMP_NUM_THREADS too), so that ranks do not oversubscribe the cores.
    """
    with tempfile.TemporaryDirectory() as tmp:
        rendezvous = f"file://{Path(tmp) / 'rendezvous'}"
        with _environ(OMP_NUM_THREADS=str(threads)):
            mp.spawn(_rank_main, args=(fn, world_size, rendezvous, threads, tmp, args), nprocs=world_size)
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _rank_main(rank: int, fn, world_size: int, rendezvous: str, threads: int, out_dir: str, args: tuple) -> None:
    torch.set_num_threads(threads)
    parallel = init_explicit(rank, world_size, rendezvous)
    try:
        result = fn(parallel, *args)
    finally:
        teardown()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


@contextlib.contextmanager
def _environ(**values: str):
    """Set environment variables for the processes started inside (children inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
