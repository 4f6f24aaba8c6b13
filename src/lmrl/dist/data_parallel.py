"""Data parallelism for the learner: the hooks `Learner.update` calls, a no-op on one process.

Every rank holds the same prepared batch (advantages computed on all of it) and trains on its share
of the prompt groups (`assign_groups`). The update then equals the one-process update on the whole
batch, up to float rounding, because:

- Mini-batches are the same. Each rank draws the same permutation of the whole batch (the learner's
  shuffle generator, seeded alike) and keeps its own rows of each mini-batch.
- Denominators are global. The objective of a mini-batch M is Σ_{i∈M} f_i(θ) / D(M): per-row terms
  over `AggScale` denominators of the whole of M (tokens, sequences, a horizon). With M split into
  the ranks' disjoint rows M_r, rank r computes L_r = Σ_{i∈M_r} f_i / D(M) using D(M) assembled from
  the ranks' own counts (`global_scale`: tokens and sequences add up, the fallback horizon, the
  mini-batch's width, is the largest). Inert rows are skipped but still counted, as on one process.
- Gradients are summed. L = Σ_r L_r, so ∇L = Σ_r ∇L_r: one all-reduce SUM per optimiser step
  (`reduce_gradients`). A mean, as in DDP, would divide by the world size; with local denominators
  it would also weigh ranks by their share of rows instead of tokens.
- Everything after the all-reduce is replicated: each rank clips the same (global) gradient and
  takes the same AdamW step. A non-finite loss on any rank skips the step on all (`agree`).
- Metrics are sums of token-weighted values and their weights, added up over ranks (`reduce_metrics`).

Every replica keeps the whole model and optimiser: rank 0 alone writes checkpoints (`is_main`).
"""
from __future__ import annotations

import contextlib
from dataclasses import fields, replace
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from lmrl.algos.aggregation import AggScale
from lmrl.types import Batch

SUMMED_SCALE = ("num_tokens", "num_seqs")  # AggScale fields that add up over disjoint rows
LARGEST_SCALE = ("horizon",)  # AggScale fields taken as the largest over ranks


class Parallel:
    """One process: every row is this process's own and every count is already global."""

    rank = 0
    world_size = 1
    sharded = False  # the model's weights are split over the ranks (`dist.sharded`)

    @property
    def is_main(self) -> bool:
        """The rank that writes checkpoints and logs."""
        return self.rank == 0

    def broadcast(self, params: Iterable[torch.Tensor]) -> None:
        """Give every rank rank 0's values (replicas start equal)."""

    def shard(self, batch: Batch) -> list[bool]:
        """For each row: does this rank train on it."""
        return [True] * batch.num_rows

    def global_scale(self, scale: AggScale) -> AggScale:
        """The denominators of the whole mini-batch from this rank's share of it."""
        return scale

    def agree(self, ok: bool) -> bool:
        """True when `ok` holds on every rank."""
        return ok

    def wrap(self, root: torch.nn.Module, model: torch.nn.Module, first_pass: Callable[[], None],
             frozen: bool = False) -> None:
        """Shard the learner's forward module `root` (holding `model`; `frozen`: the reference's) over the
        ranks, in place, then run `first_pass` (a forward of `root`); replicas: nothing."""

    def passes(self, count: int) -> int:
        """How many forward passes every rank runs when this one has `count` (sharded: the most of any rank)."""
        return count

    def gathered(self) -> contextlib.AbstractContextManager:
        """A context in which the model's weights are whole on every rank (generation runs there)."""
        return contextlib.nullcontext()

    def reduce_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """Sum the gradients over ranks, in place."""

    def clip_grad_norm(self, params: Iterable[torch.Tensor], max_norm: float) -> float:
        """Clip the gradients of `params` by their (global) norm, in place; return that norm."""
        return float(torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm))

    def reduce_metrics(self, totals: dict[str, float], weights: dict[str, float]
                       ) -> tuple[dict[str, float], dict[str, float]]:
        """Weighted metric sums and their weights, added up over ranks."""
        return totals, weights

    def barrier(self) -> None:
        """Wait for every rank (e.g. until rank 0 has written a checkpoint)."""

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects: completions, a run directory's path)."""
        return [obj]


class DataParallel(Parallel):
    """The hooks over an initialised process group (`lmrl.dist.process_group`).

    Gradients are all-reduced in buckets of about `bucket_mb` MiB, all launched before any is waited on.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, bucket_mb: float = 25.0):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs an initialised process group (lmrl.dist.init_from_env)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
                       else torch.device("cpu"))

    @torch.no_grad()
    def broadcast(self, params: Iterable[torch.Tensor]) -> None:
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        for p in params:
            dist.broadcast(p.data, src=src, group=self.group)

    def shard(self, batch: Batch) -> list[bool]:
        """This rank's rows: whole groups, balanced by tokens. Checks first that all ranks hold the same batch."""
        self._check_same_batch(batch)
        ranks = assign_groups(batch.group_index.tolist(), batch.attention_mask.sum(1).tolist(), self.world_size)
        return [r == self.rank for r in ranks]

    def global_scale(self, scale: AggScale) -> AggScale:
        names = {f.name for f in fields(scale)}
        if names != set(SUMMED_SCALE + LARGEST_SCALE):
            raise TypeError(f"DataParallel does not know how to combine AggScale fields {sorted(names)}")
        mine = torch.tensor([getattr(scale, k) for k in SUMMED_SCALE + LARGEST_SCALE], dtype=torch.float64)
        every = torch.stack(self._gather(mine))
        n = len(SUMMED_SCALE)
        total = {k: float(v) for k, v in zip(SUMMED_SCALE, every[:, :n].sum(0))}
        largest = {k: float(v) for k, v in zip(LARGEST_SCALE, every[:, n:].max(0).values)}
        return replace(scale, **total, **largest)

    def agree(self, ok: bool) -> bool:
        flag = torch.tensor([int(ok)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    @torch.no_grad()
    def reduce_gradients(self, params: Iterable[torch.Tensor]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        pending = []
        for bucket in _buckets(grads, self.bucket_bytes):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((bucket, flat, dist.all_reduce(flat, group=self.group, async_op=True)))
        for bucket, flat, work in pending:
            work.wait()
            for g, part in zip(bucket, flat.split([g.numel() for g in bucket])):
                g.copy_(part.view_as(g))

    def reduce_metrics(self, totals: dict[str, float], weights: dict[str, float]
                       ) -> tuple[dict[str, float], dict[str, float]]:
        names: list[list[str]] = [[] for _ in range(self.world_size)]
        dist.all_gather_object(names, sorted(totals), group=self.group)
        keys = sorted(set().union(*names))  # a metric some rank's micro-batches did not report counts 0 there
        sums = torch.tensor([[totals.get(k, 0.0) for k in keys], [weights.get(k, 0.0) for k in keys]],
                            dtype=torch.float64, device=self.device)
        dist.all_reduce(sums, group=self.group)
        return dict(zip(keys, sums[0].tolist())), dict(zip(keys, sums[1].tolist()))

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def gather_objects(self, obj: Any) -> list[Any]:
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, obj)
        return every

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(out, tensor.to(self.device), group=self.group)
        return [t.cpu() for t in out]

    def _check_same_batch(self, batch: Batch) -> None:
        """Rows, tokens, groups and advantages agree on every rank (else the shards would not add up)."""
        every: list = [None] * self.world_size
        dist.all_gather_object(every, _fingerprint(batch), group=self.group)
        exact, advantages = every[0]
        for other_exact, other_adv in every[1:]:
            if other_exact != exact or abs(other_adv - advantages) > 1e-6 * max(abs(advantages), 1.0):
                raise RuntimeError("ranks hold different batches; every rank must update on the same prepared batch")


def assign_groups(group_index: list[int], tokens: list[float], world_size: int) -> list[int]:
    """The rank of each row: a group's rows go together, largest groups first to the least-loaded rank.

    Deterministic in the batch alone, so every rank computes the same assignment. Keeping a group on
    one rank keeps its shared-prompt packing; its advantages were computed before on the whole batch.
    """
    load: dict[int, float] = {}
    for g, t in zip(group_index, tokens):
        load[g] = load.get(g, 0.0) + t
    rank_load = [0.0] * world_size
    owner: dict[int, int] = {}
    for g in sorted(load, key=lambda g: (-load[g], g)):
        owner[g] = min(range(world_size), key=lambda r: (rank_load[r], r))
        rank_load[owner[g]] += load[g]
    return [owner[g] for g in group_index]


def _fingerprint(batch: Batch) -> tuple[tuple[int, ...], float]:
    """Exact integer checksums of the rows, tokens and groups, and the advantages' absolute sum."""
    ids = batch.input_ids.long()
    weights = torch.arange(ids.numel(), dtype=torch.long).view_as(ids) % 9973 + 1
    exact = (batch.num_rows, ids.shape[1], int((ids * weights).sum()), int(batch.completion_mask.double().sum()),
             int((batch.group_index.long() * weights[:, 0]).sum()))
    adv = float(batch.advantages.double().abs().sum()) if batch.advantages is not None else 0.0
    return exact, adv


def _buckets(grads: list[torch.Tensor], max_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, up to `max_bytes` each (a larger tensor alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not out or size + nbytes > max_bytes or (g.dtype, g.device) != (out[-1][0].dtype, out[-1][0].device):
            out.append([])
            size = 0
        out[-1].append(g)
        size += nbytes
    return out
