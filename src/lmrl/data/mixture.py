"""Sampling and scoring a task mixture (its tasks and rows: `lmrl.envs.mixture`).

Every step's `rollout.prompts_per_step` prompts are split among the tasks by their shares and `allocate`
(largest remainders of a running credit, so the counts follow the weights to within one prompt over the steps,
with no random draw), each task's prompts drawn by its own sampler (`MixtureSampler`), and each group scored by
its task's reward (`MixtureScorer`). Groups are one prompt's samples, so group-relative advantages compare a
task's samples only.
"""
from __future__ import annotations

import math
from typing import Any

from lmrl.config import Config
from lmrl.data.samplers import build_sampler, sampler_metrics
from lmrl.envs.mixture import TASK_FIELD, MixtureEntry, task_shares
from lmrl.rewards import RewardScorer
from lmrl.types import Group

def allocate(shares: dict[str, float], n: int, credit: dict[str, float]) -> dict[str, int]:
    """`n` prompts split by `shares`: each task's credit grows by n·p_k, the whole part of it is taken, and the prompts
    left go to the largest fractional credits (ties by task order); `credit` keeps what each task is still owed,
    so over steps the counts follow the shares to within one prompt."""
    for name, p in shares.items():
        credit[name] = credit.get(name, 0.0) + n * p
    counts = {name: max(0, math.floor(credit[name] + 1e-9)) for name in shares}
    left = n - sum(counts.values())
    order = sorted(shares, key=lambda k: (-(credit[k] - counts[k]), list(shares).index(k)))
    for name in order[:max(left, 0)]:
        counts[name] += 1
    while sum(counts.values()) > n:  # float rounding gave one too many: take it from the most served
        most = max(counts, key=lambda k: counts[k] - credit[k])
        counts[most] -= 1
    for name in shares:
        credit[name] -= counts[name]
    return counts


class MixtureSampler:
    """The run's sampler over a mixture: each task's own sampler, asked for its task's share of the prompts."""

    def __init__(self, cfg: Config, entries: list[MixtureEntry]):
        self.mixture, self.entries = cfg.mixture, entries
        self.samplers = {e.name: build_sampler(e.cfg, e.train_rows) for e in entries}
        self.credit: dict[str, float] = {}
        self.step = 0
        self.last: dict[str, int] = {}

    @property
    def children(self) -> dict[str, Any]:
        return self.samplers

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        self.step += 1
        self.last = allocate(task_shares(self.mixture, self.entries, self.step), n, self.credit)
        return [row for name, k in self.last.items() if k for row in self.samplers[name].next_prompts(k)]

    def observe(self, groups: list[Group]) -> None:
        for name, sampler in self.samplers.items():
            own = [g for g in groups if g.row.get(TASK_FIELD) == name]
            if own:
                sampler.observe(own)

    def metrics(self) -> dict[str, float]:
        """Each task's sampler metrics under `sampler/<task>/…`, its share of the step's prompts and its weight."""
        out = {}
        total = max(sum(self.last.values()), 1)
        shares = task_shares(self.mixture, self.entries, max(self.step, 1))
        for name, sampler in self.samplers.items():
            out.update({f"sampler/{name}/{k.removeprefix('sampler/')}": v for k, v in sampler_metrics(sampler).items()})
            out[f"mixture/{name}/prompts"] = self.last.get(name, 0) / total
            out[f"mixture/{name}/weight"] = shares[name]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"credit": dict(self.credit), "step": self.step, "last": dict(self.last),
                "tasks": {name: s.state_dict() for name, s in self.samplers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.credit, self.step, self.last = dict(state["credit"]), state["step"], dict(state["last"])
        for name, s in self.samplers.items():
            s.load_state_dict(state["tasks"][name])


class MixtureScorer:
    """Scores each group with its task's own `RewardScorer`; metrics for the whole batch and per task."""

    def __init__(self, entries: list[MixtureEntry]):
        self.scorers = {e.name: RewardScorer(e.cfg.reward) for e in entries}

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.scorers.values())

    def scorer_of(self, row: dict) -> RewardScorer:
        return self.scorers[row[TASK_FIELD]]

    def score(self, groups: list[Group], held_out: bool = False) -> dict[str, float]:
        """Each task's groups scored by its scorer; a share metric is the batch's (sample-weighted), every metric
        also under `task/<name>/…`."""
        out: dict[str, float] = {}
        weighted: dict[str, float] = {}
        total = 0
        for name, scorer in self.scorers.items():
            own = [g for g in groups if g.row.get(TASK_FIELD) == name]
            if not own:
                continue
            n = sum(len(g.samples) for g in own)
            metrics = scorer.score(own, held_out=held_out)
            out.update({f"task/{name}/{k}": v for k, v in metrics.items()})
            for k, v in metrics.items():
                weighted[k] = weighted.get(k, 0.0) + v * n
            total += n
        out.update({k: v / max(total, 1) for k, v in weighted.items()})
        return out

    def check_error_rate(self, metrics: dict[str, float], step: int) -> None:
        """Each task's reward against its own `reward.max_error_rate`, on its own samples."""
        for name, scorer in self.scorers.items():
            prefix = f"task/{name}/"
            own = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
            if own:
                scorer.check_error_rate(own, step)

    def state_dict(self) -> dict:
        return {name: s.state_dict() for name, s in self.scorers.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, s in self.scorers.items():
            s.load_state_dict(state.get(name, {}))
