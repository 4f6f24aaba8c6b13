"""Scoring a rollout: every named component per sample, safely, then aggregation into one reward.

A component that raises, times out, or returns None / NaN / inf / a wrong type marks the sample
as excluded (with the reason), never stops the run; the counts go into the metrics.
"""
from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

from lmrl.config import RewardConfig
from lmrl.registry import Registry
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Group, Sample

REWARD_AGGREGATIONS: Registry = Registry("reward aggregation")


@REWARD_AGGREGATIONS.register("weighted_sum", "sum of weight × component")
def weighted_sum(components: dict[str, list[float]], weights: dict[str, float]) -> list[float]:
    n = len(next(iter(components.values())))
    return [sum(weights[name] * values[i] for name, values in components.items()) for i in range(n)]


class RewardScorer:
    """Evaluates the configured components on groups and sets `sample.reward`."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.components = [(c.name, REWARD_FNS.get(c.name), c.weight, c.params) for c in cfg.components]
        self.aggregate = REWARD_AGGREGATIONS.get(cfg.aggregation)
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")

    def _one(self, fn, sample: Sample, params: dict) -> tuple[dict[str, float] | None, str | None]:
        future = self.pool.submit(fn, sample, **params)
        try:
            value = future.result(timeout=self.cfg.timeout_s)
        except FutureTimeout:
            return None, "timeout"
        except Exception as err:  # a user reward may raise anything; the sample is excluded
            return None, f"error: {type(err).__name__}: {err}"
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

    def score(self, groups: list[Group]) -> dict[str, float]:
        reasons: Counter[str] = Counter()
        for group in groups:
            for sample in group.samples:
                for name, fn, _, params in self.components:
                    values, problem = self._one(fn, sample, params)
                    if problem is not None:
                        sample.excluded = f"reward {name}: {problem}"
                        reasons[problem.split(":")[0]] += 1
                        break
                    for key, v in values.items():
                        sample.rewards[f"{name}/{key}" if key else name] = v
            valid = [s for s in group.samples if s.excluded is None]
            if not valid:
                continue
            keys = sorted({k for s in valid for k in s.rewards})
            comps = {k: [s.rewards.get(k, 0.0) for s in valid] for k in keys}
            weight_of = {name: w for name, _, w, _ in self.components}
            weights = {k: weight_of[k.split("/")[0]] for k in keys}
            for s, r in zip(valid, self.aggregate(comps, weights)):
                s.reward = float(r)
        total = sum(len(g.samples) for g in groups)
        metrics = {"excluded": float(sum(reasons.values())) / max(total, 1)}
        metrics.update({f"excluded/{k}": float(v) for k, v in reasons.items()})
        return metrics
