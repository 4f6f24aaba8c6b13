"""Per-prompt history that adaptive samplers learn from, kept by row uid and checkpointed with them.

For each prompt: how many scored samples it had (attempts), their summed metric (so p̂, the mean),
the mean generated tokens per sample (its cost) and the policy version of its last rollout. The
metric is the pass rate of the run's accuracy component (`metric="accuracy"`: a sample passes when
that component is ≥ 1, as the `accuracy` metric counts it) or the scalar reward (`metric="reward"`).
Excluded samples (reward errors, NaN) say nothing about a prompt and are ignored.
"""
from __future__ import annotations

import copy
from typing import Any

from lmrl.types import Group, Sample

METRICS = ("accuracy", "reward")


def base_uid(group: Group) -> str:
    """The sampler row a group came from: a prompt variant counts for the prompt it varies."""
    return str(group.row.get("variant_of", group.uid))


class PromptStats:
    """The history of every prompt observed so far; `clock` is the newest policy version seen."""

    def __init__(self, metric: str = "accuracy", accuracy_component: str = "answer"):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)} (got {metric!r})")
        self.metric, self.accuracy_component = metric, accuracy_component
        self.records: dict[str, dict[str, float]] = {}  # uid -> attempts, total, tokens, last_step
        self.clock = 0

    def value(self, sample: Sample) -> float:
        """What one sample scores under the metric."""
        if self.metric == "reward":
            return float(sample.reward)
        return float((sample.rewards.get(self.accuracy_component) or 0.0) >= 1.0)

    def group_values(self, group: Group) -> list[float]:
        """The metric of each of the group's scored samples (excluded ones left out)."""
        return [self.value(x) for x in group.samples if x.excluded is None and x.origin.sampled]

    def observe(self, groups: list[Group]) -> None:
        for group in groups:
            scored = [x for x in group.samples if x.excluded is None and x.origin.sampled]
            versions = [v for x in scored for v in x.policy_version]
            if versions:
                self.clock = max(self.clock, max(versions))
            if not scored:
                continue
            rec = self.records.setdefault(base_uid(group), {"attempts": 0, "total": 0.0, "tokens": 0, "last_step": 0})
            rec["attempts"] += len(scored)
            rec["total"] += sum(self.value(x) for x in scored)
            rec["tokens"] += sum(x.num_generated for x in scored)
            rec["last_step"] = max(versions) if versions else self.clock

    def attempts(self, uid: str) -> int:
        rec = self.records.get(uid)
        return int(rec["attempts"]) if rec else 0

    def p_hat(self, uid: str, default: float | None = None) -> float | None:
        """The prompt's mean metric over its history; `default` when it was never scored."""
        rec = self.records.get(uid)
        return rec["total"] / rec["attempts"] if rec else default

    def cost(self, uid: str) -> float | None:
        """Mean generated tokens per scored sample of the prompt; None when never scored."""
        rec = self.records.get(uid)
        return rec["tokens"] / rec["attempts"] if rec else None

    def last_step(self, uid: str) -> int | None:
        rec = self.records.get(uid)
        return int(rec["last_step"]) if rec else None

    def summary(self, num_rows: int) -> dict[str, float]:
        """What the history holds, for the step's log: the share of rows scored so far, and of those the
        mean p̂ and the shares never and always passed (p̂ = 0 / 1)."""
        p = [rec["total"] / rec["attempts"] for rec in self.records.values()]
        out = {"sampler/seen_share": len(p) / max(num_rows, 1)}
        if p:
            out.update({"sampler/mean_p_hat": sum(p) / len(p), "sampler/p_hat_0_share": sum(x == 0 for x in p) / len(p),
                        "sampler/p_hat_1_share": sum(x == 1 for x in p) / len(p)})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"records": copy.deepcopy(self.records), "clock": self.clock}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records, self.clock = copy.deepcopy(state["records"]), state["clock"]
