"""Evaluation metrics: pass@k, avg@k, distinct-n, ECE, majority vote, risk–coverage, abstention, Holm.

Pure functions over plain Python / numpy values so the evaluator, the training loop and tests can
share one definition of each number (formulas on the pages of docs/rewards/ and in docs/methods/).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

ABSTENTION_OUTCOMES = ("correct", "wrong", "abstain")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `n` samples of which `c` are correct.

    Uses the numerically stable product form 1 − Π_{i=n−c+1..n} (1 − k/i) of 1 − C(n−c,k)/C(n,k).
    """
    if n < 1:
        raise ValueError(f"pass_at_k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _check_problems(correct_per_problem: Sequence[Sequence[bool]]) -> None:
    if len(correct_per_problem) == 0:
        raise ValueError("need at least one problem")
    for i, samples in enumerate(correct_per_problem):
        if len(samples) == 0:
            raise ValueError(f"problem {i} has no samples")


def mean_pass_at_k(correct_per_problem: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over problems; each inner list holds the correctness of that problem's samples."""
    _check_problems(correct_per_problem)
    return float(np.mean([pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct_per_problem]))


def avg_at_k(correct_per_problem: Sequence[Sequence[bool]], k: int | None = None) -> float:
    """avg@k: mean accuracy of the first `k` samples of each problem (all samples when k is None), averaged
    over problems. Equals the pass@1 estimate when k covers every sample."""
    _check_problems(correct_per_problem)
    accuracies = []
    for i, samples in enumerate(correct_per_problem):
        if k is not None and not 1 <= k <= len(samples):
            raise ValueError(f"avg_at_k needs 1 <= k <= {len(samples)} (samples of problem {i}), got k={k}")
        chosen = samples if k is None else samples[:k]
        accuracies.append(sum(bool(x) for x in chosen) / len(chosen))
    return float(np.mean(accuracies))


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Pooled distinct-n: unique n-grams / total n-grams over all texts (whitespace tokens, n-grams never
    cross text boundaries). Returns 0.0 when no text is long enough to hold an n-gram."""
    if n < 1:
        raise ValueError(f"distinct_n needs n >= 1, got {n}")
    if len(texts) == 0:
        raise ValueError("distinct_n needs at least one text")
    grams: list[tuple[str, ...]] = []
    for text in texts:
        tokens = text.split()
        grams.extend(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    if not grams:
        return 0.0
    return len(set(grams)) / len(grams)


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """ECE = Σ_b (|B_b|/N)·|acc(B_b) − conf(B_b)| over equal-width, right-closed bins on [0, 1]
    (bin b holds (b/bins, (b+1)/bins]; a confidence of exactly 0 falls in the first bin)."""
    conf = np.asarray(confidences, dtype=float)
    hits = np.asarray(correct, dtype=float)
    if conf.ndim != 1 or conf.size == 0:
        raise ValueError("expected_calibration_error needs a non-empty 1-D list of confidences")
    if conf.shape != hits.shape:
        raise ValueError(f"confidences ({conf.size}) and correct ({hits.size}) differ in length")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if not np.all(np.isfinite(conf)) or conf.min() < 0.0 or conf.max() > 1.0:
        raise ValueError("confidences must be finite and lie in [0, 1]")
    index = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        members = index == b
        if members.any():
            ece += members.mean() * abs(hits[members].mean() - conf[members].mean())
    return float(ece)


def abstention_metrics(outcomes: Sequence[str], lam: float) -> dict[str, float]:
    """Selective-prediction metrics from per-item outcomes "correct" / "wrong" / "abstain".

    risk_score = (correct − lam·wrong)/N matches the ternary abstention reward. conditional_accuracy is
    NaN when every item abstained (undefined, and skipped by the report as non-finite).
    """
    if len(outcomes) == 0:
        raise ValueError("abstention_metrics needs at least one outcome")
    unknown = sorted({o for o in outcomes if o not in ABSTENTION_OUTCOMES})
    if unknown:
        raise ValueError(f"unknown outcomes {unknown}; expected one of {ABSTENTION_OUTCOMES}")
    total = len(outcomes)
    n_correct = sum(o == "correct" for o in outcomes)
    n_wrong = sum(o == "wrong" for o in outcomes)
    answered = n_correct + n_wrong
    return {
        "coverage": answered / total,
        "abstention_rate": 1.0 - answered / total,
        "conditional_accuracy": n_correct / answered if answered else float("nan"),
        "error_rate": n_wrong / total,
        "risk_score": (n_correct - lam * n_wrong) / total,
    }


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[bool], list[float]]:
    """Holm step-down correction. Returns (rejected, adjusted p-values), both in the input order.

    Sorted ascending, p_(i) is rejected while p_(i) <= alpha/(m−i+1), stopping at the first failure;
    adjusted p_(i) = max_{j<=i} min(1, (m−j+1)·p_(j)).
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("holm needs a non-empty 1-D list of p-values")
    if not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0:
        raise ValueError("p-values must be finite and lie in [0, 1]")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    m = p.size
    order = np.argsort(p, kind="stable")
    factors = m - np.arange(m)
    adjusted_sorted = np.maximum.accumulate(np.minimum(1.0, factors * p[order]))
    passes = p[order] <= alpha / factors
    n_rejected = m if passes.all() else int(np.argmin(passes))
    rejected = np.zeros(m, dtype=bool)
    rejected[order[:n_rejected]] = True
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return rejected.tolist(), adjusted.tolist()


def majority(answers: Sequence[int | None], correct: Sequence[bool]) -> tuple[bool, float]:
    """(whether the most frequent answer is a correct one, its share of all replies). Ties: the first
    seen; replies without an answer vote for nothing but count in the share."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False, 0.0
    label, count = votes.most_common(1)[0]
    return any(c for a, c in zip(answers, correct) if a == label), count / len(answers)


def risk_coverage(confidence: Sequence[float], correct: Sequence[bool]) -> tuple[list[float], list[float], float]:
    """Selective prediction by confidence threshold: answer the prompts with confidence >= τ, for every τ
    seen. Returns coverages, risks (error share among the answered) and AURC = Σ Δcoverage · risk."""
    conf, hits = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=bool)
    coverages, risks, area, covered = [], [], 0.0, 0.0
    for tau in sorted(set(conf.tolist()), reverse=True):
        answered = conf >= tau
        coverage, risk = float(answered.mean()), float(1.0 - hits[answered].mean())
        area += (coverage - covered) * risk
        covered = coverage
        coverages.append(coverage)
        risks.append(risk)
    return coverages, risks, area


def across_tasks(per_task: dict[str, dict[str, float]], size_key: str) -> dict[str, float]:
    """A mixture's metrics over all its tasks: each metric every task reports, as the mean of the tasks' values
    weighted by their `size_key` (prompts), NaN values left out; `size_key` itself summed."""
    if not per_task:
        return {}
    out = {}
    for key in sorted(set.intersection(*(set(m) for m in per_task.values()))):
        if key == size_key:
            out[key] = float(sum(m[key] for m in per_task.values()))
            continue
        told = [(m[key], m.get(size_key, 0.0)) for m in per_task.values()
                if isinstance(m[key], (int, float)) and not np.isnan(m[key])]
        summed = sum(w for _, w in told)
        out[key] = sum(v * w for v, w in told) / summed if summed else float("nan")
    return out
