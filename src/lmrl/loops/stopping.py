"""`trainer.stop_when`: end a run early on a logged metric, e.g. when a label-free reward saturates.

A rule reads the metrics the step has just logged; the run then ends as if `trainer.steps` had been
that step (final evaluation, final checkpoint), and the checkpoint records why, so a resumed run
stays stopped. A rule naming a metric the step did not log is an error (a typo would never stop).
"""
from __future__ import annotations

import difflib

from lmrl.config import ConfigError, StopRule


def stop_reason(rules: list[StopRule], metrics: dict[str, float]) -> str | None:
    """Why the run stops after a step that logged `metrics` (None: it goes on)."""
    for rule in rules:
        if rule.metric not in metrics:
            if metrics.get("skipped_updates"):
                continue  # a step without an update logs no learner metrics
            near = difflib.get_close_matches(rule.metric, list(metrics), n=3)
            raise ConfigError(f"trainer.stop_when: the step logged no metric {rule.metric!r}"
                              + (f" (did you mean {', '.join(near)}?)" if near else ""))
        value = metrics[rule.metric]
        if rule.above is not None and value > rule.above:
            return f"{rule.metric} = {value:.4g} > {rule.above:g}"
        if rule.below is not None and value < rule.below:
            return f"{rule.metric} = {value:.4g} < {rule.below:g}"
    return None
