"""`trainer.stop_when`: end a run early on a logged metric, e.g. when a label-free reward saturates, or when the
held-out gold accuracy falls from its best while a proxy reward still rises (over-optimisation).

A rule reads the metrics the step has just logged (a rule on `eval/...`: those of each evaluation, the one before
the first step included, which only sets what a `drop` rule remembers); the run
then ends as if `trainer.steps` had been that step (final evaluation, final checkpoint), and the checkpoint
records why, so a resumed run stays stopped. A `drop` rule remembers the best value its metric has had, and the
last value of the metric it watches rise; that memory is part of the run's history (saved in each checkpoint,
restored by `--resume`). A rule naming a metric that was not logged is an error (a typo would never stop).
"""
from __future__ import annotations

import difflib
import math
from typing import Any

from lmrl.config import ConfigError, StopRule


class StopWatch:
    """The run's stop rules and what the `drop` rules remember (best value, last value of `while_rising`)."""

    def __init__(self, rules: list[StopRule]):
        self.rules = list(rules)
        self.best: dict[int, float] = {}  # rule index -> best value of its metric so far
        self.last_rising: dict[int, float] = {}  # rule index -> last value of its `while_rising` metric

    def reason(self, metrics: dict[str, float], evaluation: bool = False) -> str | None:
        """Why the run stops after the step (`evaluation`: the evaluation) that logged `metrics` (None: it goes
        on). Every rule read at this point updates its memory, whether or not an earlier one fired."""
        found = None
        for i, rule in enumerate(self.rules):
            if rule.at_evaluation != evaluation:
                continue
            names = [rule.metric] + ([rule.while_rising] if rule.while_rising else [])
            absent = [name for name in names if name not in metrics]
            if absent:
                if metrics.get("skipped_updates"):
                    continue  # a step without an update logs no learner metrics
                near = difflib.get_close_matches(absent[0], list(metrics), n=3)
                raise ConfigError(f"trainer.stop_when: the {'evaluation' if evaluation else 'step'} logged no "
                                  f"metric {absent[0]!r}" + (f" (did you mean {', '.join(near)}?)" if near else ""))
            why = self._read(i, rule, metrics)
            found = found or why
        return found

    def _read(self, i: int, rule: StopRule, metrics: dict[str, float]) -> str | None:
        value = metrics[rule.metric]
        if rule.above is not None:
            return f"{rule.metric} = {value:.4g} > {rule.above:g}" if value > rule.above else None
        if rule.below is not None:
            return f"{rule.metric} = {value:.4g} < {rule.below:g}" if value < rule.below else None
        best, rising = self.best.get(i), True
        if rule.while_rising is not None:
            now, before = metrics[rule.while_rising], self.last_rising.get(i)
            rising = before is not None and math.isfinite(now) and now > before
            if math.isfinite(now):
                self.last_rising[i] = now
        if not math.isfinite(value):  # nothing scored: no reading (a NaN best would never be fallen from)
            return None
        self.best[i] = value if best is None else max(best, value)
        if best is not None and value < best - rule.drop and rising:
            return (f"{rule.metric} = {value:.4g} fell more than {rule.drop:g} below its best {best:.4g}"
                    + (f" while {rule.while_rising} rose" if rule.while_rising else ""))
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best), "last_rising": dict(self.last_rising)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = {int(k): float(v) for k, v in state.get("best", {}).items()}
        self.last_rising = {int(k): float(v) for k, v in state.get("last_rising", {}).items()}
