"""One optimiser step on a batch that arrives in parts (streaming consumption, docs/scaling.md): `StreamedUpdate`."""
from __future__ import annotations

import torch

from lmrl.algos.aggregation import UNIT_SCALE, AggScale
from lmrl.types import Batch


class StreamedUpdate:
    """One optimiser step on a prepared batch that arrives in parts (streaming consumption, docs/scaling.md).

    Each part runs its forward and backward passes when it comes, aggregated over unit denominators
    (`UNIT_SCALE`), so the gradients add up to those of the batch's summed loss terms. `finish` divides
    them by `denominator`, the `AggScale` field the aggregation declares, of the parts' combined scale
    (the whole batch's), then clips and steps: the update of `Learner.update` with one mini-batch and
    one epoch, up to float rounding. One process; the objective must have that one denominator
    (`loops.streaming` refuses value and demonstration terms, which have their own).
    """

    def __init__(self, learner, algorithm, denominator: str):
        self.learner, self.algorithm, self.denominator = learner, algorithm, denominator
        self.scales: list[AggScale] = []
        self.totals: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.rows, self.inert, self.finite = 0, 0, True
        learner.model.train()
        learner._zero_grads()

    def add(self, part: Batch) -> None:
        """Forward and backward of one prepared part of the batch."""
        learner, algorithm = self.learner, self.algorithm
        inert = algorithm.inert_rows(part).tolist()
        if algorithm.needs_old_logp:  # the weights are those of the whole batch's until `finish`
            part.extras["old_logp"] = learner.logprobs(part)
        self.scales.append(algorithm.scale(algorithm.aggregation_mask(part)))
        self.rows += part.num_rows
        self.inert += sum(inert)
        if self.finite:
            live = part.select([r for r in range(part.num_rows) if not inert[r]])
            self.finite = learner._backward(live, algorithm, UNIT_SCALE, self.totals, self.weights)

    def finish(self) -> dict[str, float]:
        """Divide by the whole batch's denominator, clip, step; the update's metrics."""
        learner = self.learner
        torch.randperm(self.rows, generator=learner.shuffle)  # the shuffle generator advances as in `update`
        if self.finite:
            divisor = AggScale.combine(self.scales).divisor(self.denominator) if self.scales else 1.0
            for p in learner._trainable():
                if p.grad is not None:
                    p.grad.div_(divisor)
            self.totals["loss"] = self.totals.get("loss", 0.0) / divisor
        if "loss" in self.totals:
            self.weights["loss"] = 1.0
        norms = learner._step(self.finite)
        return learner._finish(True, self.totals, self.weights, [norms[0]] if norms else [],
                               [norms[1]] if norms else [], int(norms is None), self.inert / max(self.rows, 1))
