"""The offline batch source: each step's batch is `batches.size` groups of an offline dataset (SFT rows,
preference pairs), encoded once before the model loads (`data.sources`).

The order is a function of the step alone: epoch e visits the training groups in a permutation seeded
by (`trainer.seed`, e), and step k takes the k-th run of `batches.size` groups of those epochs laid end
to end. A resumed run therefore needs no source state to go on exactly where it stopped. When the objective
has a reference, every row's reference log-probs are computed once, before the first step, in the dataset's
order and batches of `batches.size` (TRL's `precompute_ref_log_probs`): a row's values depend on no step's
batch, so a resumed run trains with the very same. The held-out groups give the eval loss at every
evaluation (`loops.collect.held_out_loss`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from lmrl.data import OfflineData
from lmrl.inputs.model import reference_logprobs
from lmrl.loops.batching import to_batch
from lmrl.loops.collect import batch_inputs
from lmrl.loops.source import FollowingSource, Rollout
from lmrl.types import Group


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """The training groups' order in epoch `epoch` (0-based)."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()


def step_groups(data: OfflineData, size: int, seed: int, step: int) -> tuple[list[Group], float]:
    """Step `step`'s groups (1-based) and the epoch it reaches (fractional: 1.5 = half-way through the second)."""
    count = len(data.train)
    start = (step - 1) * size
    orders: dict[int, list[int]] = {}
    picked = []
    for position in range(start, start + size):
        epoch, index = divmod(position, count)
        if epoch not in orders:
            orders[epoch] = epoch_order(count, seed, epoch)
        picked.append(data.train[orders[epoch][index]])
    return picked, (start + size) / count


def reference_pass(s, groups: list[Group]) -> None:
    """The frozen reference's log-probs of `groups`' rows, in batches of `batches.size` in their order, kept with
    each row (`inputs.model.reference_logprobs` caches an offline row's values)."""
    size = s.cfg.batches.size
    for start in range(0, len(groups), size):
        inputs = batch_inputs(s, groups[start: start + size], 0)
        reference_logprobs(to_batch(inputs, s.engine.pad_token_id), inputs)


class OfflineSource(FollowingSource):
    """Hands the loop an offline dataset's groups; the run's engine (which shares the learner's weights) is
    only used to evaluate."""

    def __init__(self, s):
        self.s = s
        self.eval_engine = s.engine
        self.data: OfflineData = s.offline
        self.published: int | None = None  # the step whose weights the engine has yet to receive
        if s.algorithm.needs_reference:
            reference_pass(s, s.offline.train)
            reference_pass(s, s.offline.eval)

    def take(self, step: int) -> Rollout:
        t0 = time.perf_counter()
        groups, epoch = step_groups(self.data, self.s.cfg.batches.size, self.s.cfg.trainer.seed, step)
        tokens = sum(x.num_generated for g in groups for x in g.samples)  # the trained ones (their loss mask)
        metrics = {"data/epoch": epoch, "data/trained_tokens": float(tokens)}
        return Rollout(step, step - 1, [], groups, metrics, time.perf_counter() - t0, 0, trained=tokens)

    def after_update(self, step: int, model, updated: bool) -> dict[str, float]:
        """The engine only generates to evaluate: the new weights reach it then (`paused`), not every step."""
        if updated:
            self.published = step
        return {}

    @contextmanager
    def paused(self):
        if self.published is not None:
            self.s.engine.update_weights(None, self.published)
            self.published = None
        yield
