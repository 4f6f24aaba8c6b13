"""Sampling and scoring a task mixture (its tasks and rows: `lmrl.envs.mixture`).

Every step's `rollout.prompts_per_step` prompts are split among the tasks by their shares and `allocate`
(largest remainders of a running credit, so the counts follow the weights to within one prompt over the steps,
with no random draw), each task's prompts drawn by its own sampler (`MixtureSampler`), and each group scored by
its task's reward (`MixtureScorer`). Groups are one prompt's samples, so group-relative advantages compare a
task's samples only. With `mixture.sampling: progress` the shares follow each task's learning progress
(`LearningProgress`).
"""
from __future__ import annotations

import math
from typing import Any

from lmrl.config import Config, MixtureConfig
from lmrl.data.samplers import build_sampler, sampler_metrics
from lmrl.envs.mixture import TASK_FIELD, MixtureEntry, task_shares
from lmrl.rewards import RewardScorer
from lmrl.rewards.compute import accuracy_verdict
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


def task_score(groups: list[Group], component: str) -> float | None:
    """What a task's learning progress follows: the share of its scored samples that `component` (its
    `reward.accuracy_component`) judged correct; where it gave no verdict, their mean reward; None when
    no sample has either."""
    scored = [x for g in groups for x in g.scored]
    verdicts = [v for v in (accuracy_verdict(x, component) for x in scored) if v is not None]
    if verdicts:
        return sum(verdicts) / len(verdicts)
    rewards = [x.reward for x in scored if x.reward is not None]
    return sum(rewards) / len(rewards) if rewards else None


class LearningProgress:
    """A learning-progress curriculum over the tasks (`mixture.sampling: progress`).

    Each observation of task k (its groups of one draw) appends its score s_k (`task_score`) to a history of
    the last W + 1 (W = `progress_window`); its progress is |s_k(now) − s_k(W observations ago)| (the oldest
    kept while fewer), smoothed m_k ← β·m_k + (1 − β)·progress (β = `progress_smoothing`, m_k = 0 at the
    start). The shares are p_k = ε·π_k + (1 − ε)·m_k / Σ_j m_j, π the weight shares and ε = `progress_floor`,
    so a task with weight > 0 never gets less than ε·π_k; while every m_k is 0, p = π. A task not drawn keeps
    its m_k (nothing new is known of it)."""

    def __init__(self, mixture: MixtureConfig, names: list[str]):
        self.window, self.smoothing, self.floor = mixture.progress_window, mixture.progress_smoothing, \
            mixture.progress_floor
        self.history: dict[str, list[float]] = {n: [] for n in names}
        self.ema = {n: 0.0 for n in names}

    def observe(self, name: str, score: float) -> None:
        kept = self.history[name]
        kept.append(score)
        del kept[:-(self.window + 1)]
        self.ema[name] = self.smoothing * self.ema[name] + (1 - self.smoothing) * abs(kept[-1] - kept[0])

    def shares(self, prior: dict[str, float]) -> dict[str, float]:
        total = sum(self.ema.values())
        if total <= 0:
            return dict(prior)
        return {n: self.floor * p + (1 - self.floor) * self.ema[n] / total for n, p in prior.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"history": {n: list(h) for n, h in self.history.items()}, "ema": dict(self.ema)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {n: list(h) for n, h in state["history"].items()}
        self.ema = dict(state["ema"])


class MixtureSampler:
    """The run's sampler over a mixture: each task's own sampler, asked for its task's share of the prompts."""

    def __init__(self, cfg: Config, entries: list[MixtureEntry]):
        self.mixture, self.entries = cfg.mixture, entries
        self.samplers = {e.name: build_sampler(e.cfg, e.train_rows) for e in entries}
        self.credit: dict[str, float] = {}
        self.step = 0
        self.last: dict[str, int] = {}
        self.weights: dict[str, float] = {}  # the shares of the last draw
        self.graders = {e.name: e.cfg.reward.accuracy_component for e in entries}
        progress = cfg.mixture.sampling == "progress"
        self.progress = LearningProgress(cfg.mixture, [e.name for e in entries]) if progress else None

    @property
    def children(self) -> dict[str, Any]:
        return self.samplers

    def shares(self, step: int) -> dict[str, float]:
        """p_k for draw `step`: `task_shares`, moved by the learning progress so far under `progress`."""
        shares = task_shares(self.mixture, self.entries, step)
        return self.progress.shares(shares) if self.progress is not None else shares

    def next_prompts(self, n: int) -> list[dict[str, Any]]:
        self.step += 1
        self.weights = self.shares(self.step)
        self.last = allocate(self.weights, n, self.credit)
        return [row for name, k in self.last.items() if k for row in self.samplers[name].next_prompts(k)]

    def observe(self, groups: list[Group]) -> None:
        for name, sampler in self.samplers.items():
            own = [g for g in groups if g.row.get(TASK_FIELD) == name]
            if own:
                sampler.observe(own)
            score = task_score(own, self.graders[name]) if own and self.progress is not None else None
            if score is not None:
                self.progress.observe(name, score)

    def metrics(self) -> dict[str, float]:
        """Each task's sampler metrics under `sampler/<task>/…`, its share of the step's prompts, its weight (the
        share the last draw used) and, under `progress`, its smoothed learning progress."""
        out = {}
        total = max(sum(self.last.values()), 1)
        shares = self.weights or self.shares(max(self.step, 1))
        for name, sampler in self.samplers.items():
            out.update({f"sampler/{name}/{k.removeprefix('sampler/')}": v for k, v in sampler_metrics(sampler).items()})
            out[f"mixture/{name}/prompts"] = self.last.get(name, 0) / total
            out[f"mixture/{name}/weight"] = shares[name]
            if self.progress is not None:
                out[f"mixture/{name}/progress"] = self.progress.ema[name]
        return out

    def state_dict(self) -> dict[str, Any]:
        state = {"credit": dict(self.credit), "step": self.step, "last": dict(self.last),
                 "weights": dict(self.weights), "tasks": {name: s.state_dict() for name, s in self.samplers.items()}}
        if self.progress is not None:
            state["progress"] = self.progress.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.credit, self.step, self.last = dict(state["credit"]), state["step"], dict(state["last"])
        self.weights = dict(state.get("weights", {}))
        for name, s in self.samplers.items():
            s.load_state_dict(state["tasks"][name])
        if self.progress is not None:
            self.progress.load_state_dict(state["progress"])


def zero_variance_share(groups: list[Group]) -> float:
    """The share of `groups` (those with a reward) whose scored samples all got the same reward: a
    group-relative estimator learns nothing from them."""
    rewards = [[x.reward for x in g.scored if x.reward is not None] for g in groups]
    rewarded = [r for r in rewards if r]
    return sum(max(r) == min(r) for r in rewarded) / len(rewarded) if rewarded else 0.0


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
        also under `task/<name>/…`, with the share of the task's groups without a reward contrast
        (`zero_variance_share`)."""
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
            out[f"task/{name}/zero_variance_groups"] = zero_variance_share(own)
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
