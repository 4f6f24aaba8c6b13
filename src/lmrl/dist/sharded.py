"""The sharded learner's hooks: FSDP2 `fully_shard` over the data-parallel design (docs/scaling.md).

`Sharded` keeps everything `DataParallel` decides (each rank's groups, the global denominators, one
optimiser step per mini-batch, summed metrics) and changes where the training state lives: each
decoder layer is an FSDP2 unit and the learner's forward module (decoder, final norm, LM head) is
the root unit, so each rank keeps 1/N of the weights, gradients and AdamW moments, and gathers one
unit's weights at a time for its forward and backward.

- Gradients are summed. FSDP2 reduce-scatters each unit's gradient after its backward; by default it
  averages over ranks. Here every unit divides by 1 and reduces with a plain SUM
  (`set_gradient_divide_factor(1.0)` with `set_force_sum_reduction_for_comms(True)`: no PREMUL_SUM,
  which gloo lacks), so each shard holds Σ_r ∇L_r, the one-process gradient. The learner's other
  modules (value head, score head) stay replicated and are all-reduced as in `DataParallel`.
- Lock-step. Every forward and backward of a unit is a collective, so every rank must run as many
  passes as the others: `passes` gives the largest count of any rank, and the learner runs
  zero-weight passes (`Learner._idle_pass`) where it has fewer rows.
- Clipping. The norm is the global one: the squares of the local shards summed over ranks, plus the
  replicated heads' (`clip_grad_norm`).
- Generation. `gathered()` all-gathers every unit once and keeps the weights whole until it exits,
  so decoding (whose length differs between ranks) runs no collective.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lmrl.dist.data_parallel import DataParallel


class Sharded(DataParallel):
    """FSDP2 over an initialised process group. `bf16`: bf16 compute and fp32 gradient reduction over
    fp32 master weights (`MixedPrecisionPolicy`); `cpu_offload`: shards, gradients and AdamW moments
    kept on the CPU (`CPUOffloadPolicy`)."""

    sharded = True

    def __init__(self, group: dist.ProcessGroup | None = None, bf16: bool = False, cpu_offload: bool = False):
        super().__init__(group)
        self.bf16, self.cpu_offload = bf16, cpu_offload
        self.root: torch.nn.Module | None = None
        self.layers: list[torch.nn.Module] = []

    def wrap(self, root: torch.nn.Module, model: torch.nn.Module, first_pass: Callable[[], None],
             frozen: bool = False) -> None:
        """Shard `root` in place: each of `model`'s decoder layers (its `_no_split_modules` classes) a unit,
        then `root` itself (embeddings, final norm, LM head and whatever else is left).

        `first_pass` runs a forward of `root` (FSDP2 finds its units from the first module called). After it
        the root too gives its weights back after every forward (FSDP2 keeps a root's whole until the
        backward), so that between passes every parameter is its shard: what the optimiser holds and what a
        checkpoint reads, and no forward runs on whole weights gathered before an optimiser step. `frozen`:
        a model that never trains nor generates (the reference), sharded the same way, its passes in lock-step."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        if self.group is not None:
            raise ValueError("FSDP2 sharding runs over the default process group")
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        options = {"mesh": mesh}
        if self.bf16:
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if self.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        layers = [m for m in root.modules() if type(m).__name__ in set(getattr(model, "_no_split_modules", None) or ())]
        if not layers:
            raise ValueError(f"{type(model).__name__} names no decoder-layer classes (_no_split_modules) to shard")
        for layer in layers:
            fully_shard(layer, **options)
        fully_shard(root, **options)
        for unit in [*layers, root]:
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        if not frozen:
            self.root, self.layers = root, layers
        first_pass()
        root.reshard()
        root.set_reshard_after_forward(True, recurse=False)

    def passes(self, count: int) -> int:
        """The largest `count` of any rank: the passes every rank runs."""
        most = torch.tensor([count], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        return int(most.item())

    @torch.no_grad()
    def reduce_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """The sharded gradients are summed already (reduce-scatter); all-reduce the replicated ones."""
        super().reduce_gradients(p for p in params if not isinstance(p, DTensor))

    @torch.no_grad()
    def clip_grad_norm(self, params: Iterable[torch.Tensor], max_norm: float) -> float:
        """Clip the gradients of `params` (shards and replicated tensors) by their global norm; return it."""
        grads = [p.grad for p in params if p.grad is not None]
        shards = [g.to_local() for g in grads if isinstance(g, DTensor)]
        local = sum((s.double().square().sum() for s in shards), torch.zeros((), dtype=torch.float64))
        local = local.to(self.device)
        dist.all_reduce(local, group=self.group)
        total = float(local) + sum(float(g.double().square().sum()) for g in grads if not isinstance(g, DTensor))
        norm = math.sqrt(total)
        if not math.isfinite(norm):
            return norm
        coef = min(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef)
        return norm

    @contextlib.contextmanager
    def gathered(self):
        """Every unit's weights whole (one all-gather each) until exit, and kept whole after each forward:
        forwards inside (decoding steps, whose number differs between ranks) run no collective."""
        units = [self.root, *self.layers] if self.root is not None else []
        for unit in units:
            unit.unshard()
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_reshard_after_forward(True, recurse=False)
                unit.reshard()
