"""Intervals and tests for comparing runs: a bootstrap over prompts, Welch's t over seeds, Holm.

Pure functions over plain values, shared by `lmrl compare` and the benchmark scripts, so every
comparison the project states uses one definition of "significant" (docs/eval.md).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmrl.eval.metrics import holm


@dataclass
class Comparison:
    """One metric compared between a reference arm and another arm (difference = other − reference)."""

    metric: str
    reference: float
    other: float
    diff: float
    low: float  # confidence interval of the difference
    high: float
    p: float  # two-sided; NaN when the pair cannot be tested
    method: str  # "paired bootstrap over prompts", "bootstrap over prompts", "Welch t over seeds", …
    p_holm: float = float("nan")
    significant: bool = False


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` (possibly fractional) degrees of freedom."""
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The q-quantile (q in [0.5, 1)) of Student's t, by bisection on the two-sided tail."""
    target = 2.0 * (1.0 - q)
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > target:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_two_sided_p(mid, df) > target else (low, mid)
    return (low + high) / 2.0


def oneway_anova(groups: Sequence[Sequence[float]]) -> tuple[float, int, int, float]:
    """One-way ANOVA: are the arms' means further apart than their within-arm (seed) spread predicts?
    Returns (F, df between, df within, p)."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    sizes = np.array([g.size for g in groups])
    if len(groups) < 2 or sizes.min() < 1 or (sizes - 1).sum() < 1:
        raise ValueError("oneway_anova needs two or more arms and at least one arm with two runs")
    grand = np.concatenate(groups).mean()
    d1, d2 = len(groups) - 1, int((sizes - 1).sum())
    between = sum(g.size * (g.mean() - grand) ** 2 for g in groups) / d1
    within = sum(((g - g.mean()) ** 2).sum() for g in groups) / d2
    f = between / within
    return float(f), d1, d2, _betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))


def mean_interval(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """t interval of a mean over runs (seeds); NaN bounds with fewer than two runs."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float("nan"), float("nan")
    half = t_quantile(1 - alpha / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean() - half), float(v.mean() + half)


def welch(metric: str, reference: Sequence[float], other: Sequence[float], alpha: float = 0.05) -> Comparison:
    """Welch's t test and interval for mean(other) − mean(reference), each run (seed) one observation.

    Needs two runs per arm; with no spread in either arm the pair is untestable (p NaN)."""
    a, b = np.asarray(reference, dtype=float), np.asarray(other, dtype=float)
    ma, mb = float(a.mean()), float(b.mean())
    nan = float("nan")
    if a.size < 2 or b.size < 2:
        return Comparison(metric, ma, mb, mb - ma, nan, nan, nan, "needs two runs per arm")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Comparison(metric, ma, mb, mb - ma, nan, nan, nan, "no spread between seeds")
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    t = (mb - ma) / se
    half = t_quantile(1 - alpha / 2, df) * se
    return Comparison(metric, ma, mb, mb - ma, mb - ma - half, mb - ma + half, float(t_two_sided_p(t, df)),
                f"Welch t over seeds ({a.size} vs {b.size} runs, df {df:.1f})")


Aggregate = Callable[[list[dict]], dict[str, float]]
Intervals = dict[str, tuple[float, float]]


@dataclass
class Pairing:
    """How two arms' records pair: `order[i]` is the index in the other arm of reference record i (None: the
    arms are resampled separately); `note` says what a reader must know ('' for unique uids paired)."""

    order: list[int] | None
    note: str


def pair_by_uid(reference: list[dict], other: list[dict]) -> Pairing:
    """Pair records by `uid`; a uid that repeats pairs by (uid, occurrence): its k-th record in one arm with
    its k-th in the other (the same held-out list evaluated twice keeps its order). Arms graded on different
    prompts, or records without a uid, are not paired, and the note says so."""
    uids_a, uids_b = [r.get("uid") for r in reference], [r.get("uid") for r in other]
    if None in uids_a or None in uids_b:
        return Pairing(None, "not paired: some records have no uid")
    counts = Counter(uids_a)
    repeated = {u: c for u, c in counts.items() if c > 1}
    repeats = ""
    if repeated:
        shown = ", ".join(f"{u!r} ({c} times)" for u, c in list(repeated.items())[:3])
        repeats = (f"{len(repeated)} uid{'s' if len(repeated) > 1 else ''} repeat{'' if len(repeated) > 1 else 's'} "
                   f"({shown}{', …' if len(repeated) > 3 else ''})")
    if counts != Counter(uids_b):
        return Pairing(None, "not paired: the arms were graded on different prompts (their uids differ)"
                             + (f"; {repeats}" if repeats else ""))
    slots: dict[Any, list[int]] = {}
    for j, u in enumerate(uids_b):
        slots.setdefault(u, []).append(j)
    seen: Counter = Counter()
    order = []
    for u in uids_a:
        order.append(slots[u][seen[u]])
        seen[u] += 1
    return Pairing(order, f"{repeats}: paired by (uid, occurrence)" if repeats else "")


def bootstrap(reference: list[dict], other: list[dict], aggregate: Aggregate, alpha: float = 0.05,
              n_boot: int = 2000, seed: int = 0) -> tuple[list[Comparison], Intervals, Intervals]:
    """Bootstrap over prompts of every metric `aggregate` computes from per-prompt records.

    Records that `pair_by_uid` pairs are resampled together (paired), otherwise each arm separately;
    the method names what was done, with the pairing's note. Interval: percentiles of the resampled
    difference; p-value: the share of resampled differences at least as far from the observed one as
    the observed one is from 0, (1 + #{|Δ* − Δ| >= |Δ|}) / (B + 1). Returns the tests and each arm's
    percentile interval.
    """
    rng = np.random.default_rng(seed)
    pairing = pair_by_uid(reference, other)
    paired = pairing.order is not None
    if paired:
        other = [other[j] for j in pairing.order]
    point_a, point_b = aggregate(reference), aggregate(other)
    names = [m for m in point_a if m in point_b]
    reps_a, reps_b = {m: [] for m in names}, {m: [] for m in names}
    for _ in range(n_boot):
        idx_a = rng.integers(0, len(reference), len(reference))
        idx_b = idx_a if paired else rng.integers(0, len(other), len(other))
        ra, rb = aggregate([reference[i] for i in idx_a]), aggregate([other[i] for i in idx_b])
        for m in names:
            reps_a[m].append(ra.get(m, float("nan")))
            reps_b[m].append(rb.get(m, float("nan")))
    method = ("paired bootstrap over prompts" if paired else "bootstrap over prompts") + (
        f" ({pairing.note})" if pairing.note else "")
    tests, ci_a, ci_b = [], {}, {}
    q = [100 * alpha / 2, 100 * (1 - alpha / 2)]
    for m in names:
        a, b = np.asarray(reps_a[m]), np.asarray(reps_b[m])
        ci_a[m], ci_b[m] = _percentiles(a, q), _percentiles(b, q)
        diff = point_b[m] - point_a[m]
        d = (b - a)[np.isfinite(b - a)]
        reason = None
        if not math.isfinite(diff) or d.size == 0:
            reason = "undefined on these prompts"
        elif diff == 0 and np.ptp(a) == 0 and np.ptp(b) == 0:
            reason = "the same constant in both arms"
        if reason is not None:
            tests.append(Comparison(m, point_a[m], point_b[m], diff, math.nan, math.nan, math.nan, reason))
            continue
        low, high = np.percentile(d, q)
        p = (1 + np.sum(np.abs(d - diff) >= abs(diff))) / (d.size + 1) if diff != 0 else 1.0
        tests.append(Comparison(m, point_a[m], point_b[m], diff, float(low), float(high), float(min(1.0, p)), method))
    return tests, ci_a, ci_b


def _percentiles(values: np.ndarray, q: list[float]) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(finite, q)
    return float(low), float(high)


def apply_holm(tests: list[Comparison], alpha: float = 0.05) -> list[Comparison]:
    """Holm's correction over every testable test in `tests` (one family); fills p_holm and significant."""
    testable = [t for t in tests if math.isfinite(t.p)]
    if testable:
        rejected, adjusted = holm([t.p for t in testable], alpha)
        for t, r, p in zip(testable, rejected, adjusted):
            t.significant, t.p_holm = bool(r), float(p)
    return tests
