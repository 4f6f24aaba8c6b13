"""The inline batch source: each step's batch is collected when the loop asks for it, with the
weights of the step before (the synchronous loop; `loops.collect.collect_groups`, which also makes a pair
source's pairs, as it does for the background source)."""
from __future__ import annotations

import time
from contextlib import nullcontext
from lmrl.loops.collect import collect_groups
from lmrl.loops.setup import Stages
from lmrl.loops.source import FollowingSource, Rollout
from lmrl.models.threads import apply_threads


class InlineSource(FollowingSource):
    """Collects with the run's own engine, which follows the learner's weights."""

    def __init__(self, s: Stages):
        self.s = s
        self.eval_engine = s.engine

    def take(self, step: int) -> Rollout:
        t0, scoring = time.perf_counter(), self.s.scorer.seconds
        apply_threads(self.s.cfg.trainer.threads)
        seen, kept, metrics = collect_groups(self.s)
        generated = sum(x.num_generated for g in seen for x in g.samples)
        return Rollout(step, step - 1, seen, kept, metrics, time.perf_counter() - t0, generated,
                       self.s.scorer.seconds - scoring)

    def after_update(self, step: int, model, updated: bool) -> dict[str, float]:
        return self.s.engine.update_weights(None, step) if updated else {}

    def paused(self):
        return nullcontext()
