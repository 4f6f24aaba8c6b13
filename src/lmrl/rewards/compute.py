"""Scoring a rollout: every named component per sample (or per group), safely, then aggregation.

Two kinds of component, chosen by the registry they are in:
- `REWARD_FNS`: per sample, `fn(sample, **params) -> float | dict[str, float] | None`;
- `GROUP_REWARD_FNS`: per group (majority vote, judge rankings, novelty…),
  `fn(samples, **params) -> list[float | dict[str, float] | None]`, one entry per sample.
A registered *class* is a stateful component (a memory, a reward model, a judge client): it is
built once per scorer as `cls(**params)` and then called without params. A per-sample class may also
score many samples in one call, `score_batch(samples) -> list` (one entry per sample, as a group
component returns): the scorer then makes one such call per group's samples (a reward model's
batched forward) instead of one call per sample; the timeout and retries apply to that call.

A component that raises, times out, or returns None / NaN / inf / a wrong type or shape is retried
`reward.retries` times, then the sample is excluded (`reward.on_error: exclude`, the default) or
given 0 for that component (`on_error: zero`); either way it is counted in the metrics and the run
goes on, but never silently: the first problem of each component is printed on stderr once (with the
traceback of the reward's own code when it raised), `reward_error_share` is logged every step, and
`check_error_rate` stops a run whose step is above `reward.max_error_rate` (`RewardErrorRate`). A
None is a component declining to score (no verdict): the sample is excluded and counted, not an
error. The accuracy component (`reward.accuracy_component`) scores every sample that reached the
scorer, even one another component's error excluded, so accuracy never depends on the others.
The time spent scoring adds up in `seconds` (the loops log it as `timing/reward_s`).
`reward.concurrency` > 1 scores that many samples of a group at once with a per-sample
component (worth it for judges behind HTTP and for sandboxed unit tests; the component must then be
thread-safe). `reward.workers: ray` runs the stateless components as Ray tasks (`rewards/remote.py`),
where a timeout kills the task's process.
"""
from __future__ import annotations

import inspect
import math
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lmrl.config import RewardConfig
from lmrl.errors import ConfigError, RewardErrorRate
from lmrl.registry import Registry
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Group, Sample

@dataclass(frozen=True)
class AggregationSpec:
    """What a reward aggregation reads: each sample's own components (`per_sample`), or its group's too."""

    per_sample: bool = False  # a sample's reward depends on its own components only (it can be scored alone)


REWARD_AGGREGATIONS: Registry = Registry("reward aggregation", declares=AggregationSpec)
GROUP_REWARD_FNS: Registry = Registry("group reward function", adopts_plain=False)


@REWARD_AGGREGATIONS.register("weighted_sum", "sum of weight × component", per_sample=True)
def weighted_sum(components: dict[str, list[float]], weights: dict[str, float], **_) -> list[float]:
    n = len(next(iter(components.values())))
    return [sum(weights[name] * values[i] for name, values in components.items()) for i in range(n)]


def find_component(name: str) -> tuple[Any, bool]:
    """(the registered function or class, whether it scores whole groups); KeyError if unknown."""
    if name in GROUP_REWARD_FNS:
        return GROUP_REWARD_FNS.get(name), True
    return REWARD_FNS.get(name), False


def owner_of(key: str, names: list[str]) -> str | None:
    """The component name whose value is `key`, or whose named part it is (`name/part`; names may hold '/')."""
    return max((n for n in names if key == n or key.startswith(n + "/")), key=len, default=None)


def grader_only(cfg: RewardConfig) -> RewardConfig:
    """`cfg` with the accuracy component alone (summed as it is): what grades a reply, without the cost of the
    other components. A ConfigError when no component owns `reward.accuracy_component`."""
    name = owner_of(cfg.accuracy_component, [c.name for c in cfg.components])
    if name is None:
        raise ConfigError(f"reward.accuracy_component={cfg.accuracy_component!r} is none of the reward components "
                          f"{[c.name for c in cfg.components]}")
    return cfg.model_copy(update={"components": [c for c in cfg.components if c.name == name],
                                  "aggregation": "weighted_sum", "aggregation_params": {}})


def accuracy_verdict(sample: Sample, component: str) -> bool | None:
    """Whether the accuracy component `component` (a component, or a component's named part `name/part`)
    scored `sample` correct (>= 1), whatever the other components did; None where it gave no verdict (it
    erred or returned None, or the sample was excluded before any reward ran)."""
    errors = sample.info.get("reward_errors", {})
    if component not in sample.rewards or any(component == k or component.startswith(k + "/") for k in errors):
        return None
    return sample.rewards[component] >= 1.0


class Problem(str):
    """Why a call gave no score (the text is the reason, e.g. `error: KeyError: 'target'`); when the
    component raised, `trace` is the traceback of the component's own frames and `where` its last one."""

    trace: str = ""
    where: str = ""


_SCORER_FILES = (str(Path(__file__)), str(Path(threading.__file__).parent / "concurrent"), threading.__file__)


def raised(err: BaseException) -> Problem:
    """The problem of a call that raised `err`, with the traceback of the component's own code (the
    scorer's and the thread pool's frames left out)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(_SCORER_FILES)]
    problem = Problem(f"error: {type(err).__name__}: {err}")
    problem.trace = "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                             *traceback.format_exception_only(err)]).rstrip()
    if frames:
        last = frames[-1]
        problem.where = f"{last.filename}:{last.lineno} in {last.name}: {(last.line or '').strip()}"
    return problem


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
        # what scores a list of samples in one call: a group component itself, or a per-sample one's batch call
        self.list_call: Callable | None = self.call if self.per_group else getattr(self.instance, "score_batch", None)


class RewardScorer:
    """Evaluates the configured components on groups and sets `sample.rewards` and `sample.reward`."""

    def __init__(self, cfg: RewardConfig, report: Callable[[str], None] | None = None):
        self.cfg = cfg
        self.report = report or _to_stderr  # where the first problem of each component is shown
        self.first: dict[str, Problem] = {}  # component -> its first problem (shown once)
        self.seconds = 0.0  # time spent scoring, over every call
        self.components = [_Component(c.name, c.weight, c.params, c.timeout_s or cfg.timeout_s)
                           for c in cfg.components]
        self.aggregate = REWARD_AGGREGATIONS.get(cfg.aggregation)
        self.grader = self._owner(cfg.accuracy_component)
        self.pool_size = max(4, 2 * cfg.concurrency)
        self.pool = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="reward")
        self.lock = threading.Lock()
        self.fan_out = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="reward-sample") \
            if cfg.concurrency > 1 else None
        self.remote = None
        if cfg.workers == "ray":
            from lmrl.rewards.remote import RayRewardWorkers

            self.remote = RayRewardWorkers(find_component, workers=cfg.concurrency)

    def state_dict(self) -> dict:
        """Run state of the stateful components that keep one (`reward_state()`, e.g. the MEDS memory)."""
        return {c.name: c.instance.reward_state() for c in self.components if hasattr(c.instance, "reward_state")}

    def load_state_dict(self, state: dict) -> None:
        for c in self.components:
            if c.name in state and hasattr(c.instance, "load_reward_state"):
                c.instance.load_reward_state(state[c.name])

    def _run(self, comp: _Component, arg, call: Callable | None = None) -> tuple[Any, str | None]:
        """One call under the timeout: (raw value, None) or (None, problem).

        A thread cannot be killed, so a call that times out keeps its worker; the scorer then moves
        to a fresh pool, and later calls never queue behind hung ones. `call`: what to call (default
        the component itself).
        """
        if self.remote is not None and comp.instance is None:
            return self.remote.run(comp.name, comp.params, arg, comp.timeout_s)
        pool = self.pool
        future = pool.submit(call or comp.call, arg)
        try:
            return future.result(timeout=comp.timeout_s), None
        except FutureTimeout:
            with self.lock:
                if self.pool is pool:
                    self.pool = ThreadPoolExecutor(max_workers=self.pool_size, thread_name_prefix="reward")
                    pool.shutdown(wait=False, cancel_futures=True)
            return None, "timeout"
        except Exception as err:  # a user reward may raise anything; handled per on_error
            return None, raised(err)

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
            raw, problem = self._run(comp, samples, comp.list_call)
            if problem is None and (not isinstance(raw, (list, tuple)) or len(raw) != len(samples)):
                problem = f"wrong shape: expected {len(samples)} values"
            if problem is None:
                return [_check_value(v) for v in raw]
        return [(None, problem)] * len(samples)

    def _record(self, comp: _Component, sample: Sample, values, problem, reasons: Counter) -> None:
        if problem is not None:
            reasons[problem.split(":")[0]] += 1
            self._show_first(comp, problem)
            sample.info.setdefault("reward_errors", {})[comp.name] = str(problem)
            if self.cfg.on_error == "zero":
                sample.rewards[comp.name] = 0.0
            elif sample.excluded is None:
                sample.excluded = f"reward {comp.name}: {problem}"
            return
        for key, v in values.items():
            sample.rewards[f"{comp.name}/{key}" if key else comp.name] = v

    def _show_first(self, comp: _Component, problem: Problem) -> None:
        """Print the first problem of `comp` (its traceback when it raised); later ones are only counted."""
        with self.lock:
            if comp.name in self.first:
                return
            self.first[comp.name] = problem
        if problem == "none":
            what = "returned None (no verdict): the sample is excluded; not counted by reward.max_error_rate"
        else:
            fate = "scored 0" if self.cfg.on_error == "zero" else "excluded"
            what = f"failed ({problem}) after {self.cfg.retries + 1} attempt(s): the sample is {fate}"
        trace = getattr(problem, "trace", "")
        self.report(f"reward {comp.name} {what}; shown once, every one is counted in the metrics "
                    f"(reward_errors/*, reward_error_share/{comp.name})" + (f"\n{trace}" if trace else ""))

    def _owner(self, key: str) -> _Component | None:
        """The component whose value is `key`, or whose named part it is."""
        name = owner_of(key, [c.name for c in self.components])
        return next((c for c in self.components if c.name == name), None)

    def _weight_of(self, key: str) -> float:
        owner = self._owner(key)
        return owner.weight if owner else 1.0

    def score(self, groups: list[Group], held_out: bool = False) -> dict[str, float]:
        """Score `groups` in place; the metrics of the scoring. `held_out`: the groups are an evaluation's, which a
        stateful component (one with `reward_state`) scores without learning from (its `held_out` attribute is
        set meanwhile): a discriminator or a memory trains on the run's own samples only."""
        started = time.perf_counter()
        stateful = [c.instance for c in self.components if hasattr(c.instance, "reward_state")]
        for instance in stateful:
            instance.held_out = held_out
        try:
            return self._score(groups)
        finally:
            for instance in stateful:
                instance.held_out = False
            self.seconds += time.perf_counter() - started

    def _score(self, groups: list[Group]) -> dict[str, float]:
        reasons: Counter[str] = Counter()
        for group in groups:
            entered = [s for s in group.samples if s.excluded is None]
            for comp in self.components:
                live = entered if comp is self.grader else [s for s in entered if s.excluded is None]
                if not live:
                    continue
                if comp.list_call is not None:
                    for sample, (values, problem) in zip(live, self._score_group(comp, live)):
                        self._record(comp, sample, values, problem, reasons)
                else:
                    results = (self.fan_out.map(lambda x, c=comp: self._score_sample(c, x), live) if self.fan_out
                               else (self._score_sample(comp, x) for x in live))
                    for sample, (values, problem) in zip(live, results):
                        self._record(comp, sample, values, problem, reasons)
            self._check_accuracy_part(group.samples)
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
        metrics.update(self._error_shares([s for g in groups for s in g.samples]))
        return metrics

    def _check_accuracy_part(self, samples: list[Sample]) -> None:
        """A `name/part` accuracy component that its component does not return is a config error, not a silent
        accuracy of 0."""
        key, owner = self.cfg.accuracy_component, self.grader
        if owner is None or key == owner.name:
            return
        for sample in samples:
            parts = sorted(k for k in sample.rewards if k.startswith(owner.name + "/"))
            if parts and key not in sample.rewards:
                raise ConfigError(f"reward.accuracy_component={key!r}: the component {owner.name!r} returns the "
                                  f"parts {parts}, not this one; name one of them")

    def _error_shares(self, samples: list[Sample]) -> dict[str, float]:
        """`reward_error_share`: the share of samples on which some component raised, timed out or
        returned an invalid value (a None is no verdict, not an error); and that share per component."""
        def failed(sample: Sample, name: str) -> bool:
            return sample.info.get("reward_errors", {}).get(name, "none") != "none"

        n = max(len(samples), 1)
        out = {"reward_error_share": sum(any(failed(s, c.name) for c in self.components) for s in samples) / n}
        out.update({f"reward_error_share/{c.name}": sum(failed(s, c.name) for s in samples) / n
                    for c in self.components})
        return out

    def check_error_rate(self, metrics: dict[str, float], step: int) -> None:
        """Raise `RewardErrorRate` when step `step`'s `reward_error_share` is above `reward.max_error_rate`,
        naming the component with the most errors, its first exception and where it was raised."""
        share, limit = metrics.get("reward_error_share", 0.0), self.cfg.max_error_rate
        if share <= limit:
            return
        name = max((c.name for c in self.components), key=lambda n: metrics.get(f"reward_error_share/{n}", 0.0))
        first, own = self.first.get(name, Problem("unknown")), metrics.get(f"reward_error_share/{name}", 0.0)
        where = f"\n  first raised at {first.where}" if getattr(first, "where", "") else ""
        raise RewardErrorRate(
            f"step {step}: {share:.0%} of the samples had reward errors, above reward.max_error_rate={limit:g}\n"
            f"  reward {name} failed on {own:.0%} of the samples: {first}{where}\n"
            f"  (its first traceback is printed above; fix the reward, or set reward.max_error_rate=1.0 to train "
            f"on the samples left)")


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
