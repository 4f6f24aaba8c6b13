"""Scoring a rollout: every named component per sample (or per group), safely, then aggregation.

Two kinds of component, chosen by the registry they are in:
- `REWARD_FNS`: per sample, `fn(sample, **params) -> float | dict[str, float] | None`;
- `GROUP_REWARD_FNS`: per group (majority vote, judge rankings, novelty…),
  `fn(samples, **params) -> list[float | dict[str, float] | None]`, one entry per sample.
A registered *class* is a stateful component (a memory, a reward model, a judge client): it is
built once per scorer as `cls(**params)` and then called without params.

A component that raises, times out, or returns None / NaN / inf / a wrong type or shape is retried
`reward.retries` times, then the sample is excluded (`reward.on_error: exclude`, the default) or
given 0 for that component (`on_error: zero`); either way it is counted in the metrics and the run
goes on. `reward.concurrency` > 1 scores that many samples of a group at once with a per-sample
component (worth it for judges behind HTTP and for sandboxed unit tests; the component must then be
thread-safe). `reward.workers: ray` runs the stateless components as Ray tasks (`rewards/remote.py`),
where a timeout kills the task's process.
"""
from __future__ import annotations

import inspect
import math
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Any, Callable

from lmrl.config import RewardConfig
from lmrl.registry import Registry
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Group, Sample

REWARD_AGGREGATIONS: Registry = Registry("reward aggregation")
GROUP_REWARD_FNS: Registry = Registry("group reward function", adopts_plain=False)


@REWARD_AGGREGATIONS.register("weighted_sum", "sum of weight × component")
def weighted_sum(components: dict[str, list[float]], weights: dict[str, float], **_) -> list[float]:
    n = len(next(iter(components.values())))
    return [sum(weights[name] * values[i] for name, values in components.items()) for i in range(n)]


def find_component(name: str) -> tuple[Any, bool]:
    """(the registered function or class, whether it scores whole groups); KeyError if unknown."""
    if name in GROUP_REWARD_FNS:
        return GROUP_REWARD_FNS.get(name), True
    return REWARD_FNS.get(name), False


def _check_value(value: Any) -> tuple[dict[str, float] | None, str | None]:
    if value is None:
        return None, "none"
    values = value if isinstance(value, dict) else {"": value}
    out = {}
    for key, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None, f"wrong type {type(v).__name__}"
        if not math.isfinite(float(v)):
            return None, "non-finite"
        out[key] = float(v)
    return out, None


class _Component:
    """One configured component: bound params, kind, weight."""

    def __init__(self, name: str, weight: float, params: dict, timeout_s: float):
        target, self.per_group = find_component(name)
        self.name, self.weight, self.timeout_s, self.params = name, weight, timeout_s, params
        self.instance = None
        if inspect.isclass(target):
            self.instance = target(**params)
            self.call: Callable = self.instance
        else:
            self.call = lambda x, _fn=target, _p=params: _fn(x, **_p)


class RewardScorer:
    """Evaluates the configured components on groups and sets `sample.rewards` and `sample.reward`."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.components = [_Component(c.name, c.weight, c.params, c.timeout_s or cfg.timeout_s)
                           for c in cfg.components]
        self.aggregate = REWARD_AGGREGATIONS.get(cfg.aggregation)
        self.pool_size = max(4, 2 * cfg.concurrency)
        self.pool = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="reward")
        self.lock = threading.Lock()
        self.fan_out = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="reward-sample") \
            if cfg.concurrency > 1 else None
        self.remote = None
        if cfg.workers == "ray":
            from lmrl.rewards.remote import RayRewardWorkers

            self.remote = RayRewardWorkers(workers=cfg.concurrency)

    def state_dict(self) -> dict:
        """Run state of the stateful components that keep one (`reward_state()`, e.g. the MEDS memory)."""
        return {c.name: c.instance.reward_state() for c in self.components if hasattr(c.instance, "reward_state")}

    def load_state_dict(self, state: dict) -> None:
        for c in self.components:
            if c.name in state and hasattr(c.instance, "load_reward_state"):
                c.instance.load_reward_state(state[c.name])

    def _run(self, comp: _Component, arg) -> tuple[Any, str | None]:
        """One call under the timeout: (raw value, None) or (None, problem).

        A thread cannot be killed, so a call that times out keeps its worker; the scorer then moves
        to a fresh pool, and later calls never queue behind hung ones.
        """
        if self.remote is not None and comp.instance is None:
            return self.remote.run(comp.name, comp.params, arg, comp.timeout_s)
        pool = self.pool
        future = pool.submit(comp.call, arg)
        try:
            return future.result(timeout=comp.timeout_s), None
        except FutureTimeout:
            with self.lock:
                if self.pool is pool:
                    self.pool = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="reward")
                    pool.shutdown(wait=False, cancel_futures=True)
            return None, "timeout"
        except Exception as err:  # a user reward may raise anything; handled per on_error
            return None, f"error: {type(err).__name__}: {err}"

    def _score_sample(self, comp: _Component, sample: Sample) -> tuple[dict | None, str | None]:
        for _ in range(self.cfg.retries + 1):
            raw, problem = self._run(comp, sample)
            if problem is None:
                values, problem = _check_value(raw)
                if problem is None:
                    return values, None
        return None, problem

    def _score_group(self, comp: _Component, samples: list[Sample]) -> list[tuple[dict | None, str | None]]:
        for _ in range(self.cfg.retries + 1):
            raw, problem = self._run(comp, samples)
            if problem is None and (not isinstance(raw, (list, tuple)) or len(raw) != len(samples)):
                problem = f"wrong shape: expected {len(samples)} values"
            if problem is None:
                return [_check_value(v) for v in raw]
        return [(None, problem)] * len(samples)

    def _record(self, comp: _Component, sample: Sample, values, problem, reasons: Counter) -> None:
        if problem is not None:
            reasons[problem.split(":")[0]] += 1
            if self.cfg.on_error == "zero":
                sample.rewards[comp.name] = 0.0
                sample.info.setdefault("reward_errors", {})[comp.name] = problem
            else:
                sample.excluded = f"reward {comp.name}: {problem}"
            return
        for key, v in values.items():
            sample.rewards[f"{comp.name}/{key}" if key else comp.name] = v

    def _weight_of(self, key: str) -> float:
        """A component's weight for its value `name` or its named part `name/part` (names may hold '/')."""
        owner = max((c for c in self.components if key == c.name or key.startswith(c.name + "/")),
                    key=lambda c: len(c.name), default=None)
        return owner.weight if owner else 1.0

    def score(self, groups: list[Group]) -> dict[str, float]:
        reasons: Counter[str] = Counter()
        for group in groups:
            for comp in self.components:
                live = [s for s in group.samples if s.excluded is None]
                if not live:
                    break
                if comp.per_group:
                    for sample, (values, problem) in zip(live, self._score_group(comp, live)):
                        self._record(comp, sample, values, problem, reasons)
                else:
                    results = (self.fan_out.map(lambda x, c=comp: self._score_sample(c, x), live) if self.fan_out
                               else (self._score_sample(comp, x) for x in live))
                    for sample, (values, problem) in zip(live, results):
                        self._record(comp, sample, values, problem, reasons)
            valid = [s for s in group.samples if s.excluded is None]
            if not valid:
                continue
            keys = sorted({k for s in valid for k in s.rewards})
            comps = {k: [s.rewards.get(k, 0.0) for s in valid] for k in keys}
            weights = {k: self._weight_of(k) for k in keys}
            for s, r in zip(valid, self.aggregate(comps, weights, **self.cfg.aggregation_params)):
                s.reward = float(r)
        total = sum(len(g.samples) for g in groups)
        metrics = {"excluded": float(sum(s.excluded is not None for g in groups for s in g.samples)) / max(total, 1),
                   "reward_errors": float(sum(reasons.values())) / max(total, 1)}
        metrics.update({f"reward_errors/{k}": float(v) for k, v in reasons.items()})
        return metrics
