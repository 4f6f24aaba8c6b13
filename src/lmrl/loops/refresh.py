"""The proxy-refresh rounds of a pipeline (`refresh:`, docs/pipelines.md#refresh; stages_and_credit §5.1,
confidence low: the loop is reconstructed from the paper's abstract, the detection rule is lmrl's reading).

A refresh pipeline trains a reward model on labelled rollouts, then a policy against it, round after round.
After each policy stage, its held-out evaluations replayed through its `drop` rule say whether it over-optimised
the proxy (the gold metric fell from its best while the proxy rose). If it did, the stage is rolled back: its
model is the checkpoint of its best evaluation, and the rollouts sampled right after that checkpoint — the first
`refresh.feedback_groups` groups, as recorded, each sample scored by every reward component, the gold one
included — are the fresh labels: the stage writes `FEEDBACK_FILE`, the reward model's data so far and then
these groups, which the next round's reward model trains on. If it did not, its final weights are its model
and no further round runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from lmrl.config import Config, StopRule
from lmrl.pipeline_config import FEEDBACK_FILE
from lmrl.loading import load_run_config
from lmrl.loops.stopping import StopWatch
from lmrl.models.checkpoint_dirs import list_checkpoints

START = "start"  # what `export` is given to export the model the stage started from (a best before step 1)


def drop_rule(cfg: Config) -> StopRule:
    """The policy stage's over-optimisation rule: its `drop` rule on a metric of the evaluation."""
    return next(rule for rule in cfg.trainer.stop_when if rule.drop is not None and rule.at_evaluation)


def evaluations(folder: Path, rule: StopRule) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of each evaluation the stage logged that the rule reads, in order."""
    names = [rule.metric] + ([rule.while_rising] if rule.while_rising else [])
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row) for row in rows if all(name in row for name in names)]


def over_optimised_at(rule: StopRule, evals: list[tuple[int, dict[str, float]]]) -> int | None:
    """The step of the first evaluation at which the rule fires (None: it never does)."""
    watch = StopWatch([rule])
    return next((step for step, metrics in evals if watch.reason(metrics, evaluation=True)), None)


def best_checkpointed(rule: StopRule, evals: list[tuple[int, dict[str, float]]], until: int,
                      checkpointed: set[int]) -> int | None:
    """The step, among evaluations up to `until` that have a checkpoint, whose metric is the highest (the earliest
    of equals): where a rollback returns."""
    candidates = [(step, metrics[rule.metric]) for step, metrics in evals if step <= until and step in checkpointed]
    return max(candidates, key=lambda c: (c[1], -c[0]))[0] if candidates else None


def _records(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def refresh_after(cfg: Config, folder: Path, feedback_groups: int, reward_model_dir: Path,
                  export: Callable[[Path | str | None], Path]) -> dict[str, Any]:
    """After the policy stage `cfg` trained in `folder`: roll it back and write the next round's data if it
    over-optimised, else export its final weights (`export(checkpoint)`: None, the last; `START`, the model the
    stage started from; `reward_model_dir`: this round's reward-model stage, whose data the feedback extends).
    The evaluations are replayed through the rule from the one before step 1, as the run read them. Returns what
    happened, as pipeline.json records it. Running it again (a resumed pipeline) gives the same result."""
    rule = drop_rule(cfg)
    evals = evaluations(folder, rule)
    fired = over_optimised_at(rule, evals)
    if fired is None:
        export(None)
        return {"over_optimised": False}
    checkpoints: dict[int, Path | str] = {0: START}  # the starting weights are always there to return to
    checkpoints.update({int(p.name.split("-")[1]): p for p in list_checkpoints(folder / "checkpoints")})
    best = best_checkpointed(rule, evals, fired, set(checkpoints))
    if best is None:
        raise RuntimeError(f"{folder}: {rule.metric} fell at step {fired}, and no evaluated checkpoint before it is "
                           "kept to roll back to (eval.every, run.checkpoint_every, run.keep_checkpoints)")
    export(checkpoints[best])
    fresh = [line for line in _records(folder / "rollouts.jsonl") if json.loads(line)["step"] == best + 1]
    fresh = fresh[:feedback_groups]
    earlier = _records(Path(load_run_config(reward_model_dir).batches.dataset))
    tmp = folder / f".{FEEDBACK_FILE}.tmp"
    tmp.write_text("".join(line + "\n" for line in [*earlier, *fresh]))
    os.replace(tmp, folder / FEEDBACK_FILE)
    return {"over_optimised": True, "at_step": fired, "rolled_back_to": best,
            "best": dict(evals)[best][rule.metric], "feedback_groups": len(fresh),
            "feedback_total": len(earlier) + len(fresh)}
