"""Evaluation metrics against the hand-computed values of specs/rewards_data_systems.md §4."""
from __future__ import annotations

import math
from math import comb

import pytest

from lmrl.eval.metrics import (
    abstention_metrics,
    avg_at_k,
    distinct_n,
    expected_calibration_error,
    holm,
    mean_pass_at_k,
    pass_at_k,
)


@pytest.mark.parametrize(("n", "c", "k", "expected", "abs_tol"), [
    (5, 2, 2, 0.7, 1e-12),
    (4, 1, 1, 0.25, 1e-12),
    (10, 3, 5, 0.917, 5e-4),
])
def test_pass_at_k_spec_values(n, c, k, expected, abs_tol):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=abs_tol)


@pytest.mark.parametrize(("n", "c", "k"), [(20, 7, 3), (50, 1, 10), (13, 0, 4), (8, 8, 2), (100, 30, 64)])
def test_pass_at_k_matches_combinatorial_form(n, c, k):
    exact = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-10, abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0
    assert pass_at_k(6, 2, 1) == pytest.approx(2 / 6)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 5, 1), (4, -1, 1), (4, 1, 0), (0, 0, 1)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_problems():
    problems = [[True, False, True, False, False], [False, False, False, True]]
    assert mean_pass_at_k(problems, 2) == pytest.approx((0.7 + 0.5) / 2)
    assert mean_pass_at_k(problems, 1) == pytest.approx((0.4 + 0.25) / 2)


def test_mean_pass_at_k_errors():
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([[True], []], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([[True, False], [True]], 2)


def test_avg_at_k():
    problems = [[True, False, True, True], [False, True, False, False]]
    assert avg_at_k(problems) == pytest.approx((0.75 + 0.25) / 2)
    assert avg_at_k(problems, 2) == pytest.approx((0.5 + 0.5) / 2)
    assert avg_at_k(problems, 1) == pytest.approx(0.5)
    assert avg_at_k(problems) == pytest.approx(mean_pass_at_k(problems, 1))
    with pytest.raises(ValueError):
        avg_at_k(problems, 5)
    with pytest.raises(ValueError):
        avg_at_k([])


def test_distinct_n_spec_values():
    text = "the cat sat the cat ran"
    assert distinct_n([text], 1) == pytest.approx(4 / 6)
    assert distinct_n([text], 2) == pytest.approx(4 / 5)


def test_distinct_n_pools_without_crossing_texts():
    # Pooled 2-grams are (a b), (b c), (a b); the boundary pair (c a) must not be counted.
    assert distinct_n(["a b c", "a b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["a b", "a b"], 1) == pytest.approx(2 / 4)


def test_distinct_n_short_texts_and_errors():
    assert distinct_n(["one", ""], 2) == 0.0
    with pytest.raises(ValueError):
        distinct_n([], 1)
    with pytest.raises(ValueError):
        distinct_n(["a b"], 0)


def test_ece_spec_value():
    assert expected_calibration_error([0.9, 0.8, 0.3, 0.6], [1, 0, 0, 1], bins=2) == pytest.approx(0.15)


def test_ece_bins_are_right_closed():
    # 0.5 belongs to the first of two bins (0, 0.5]; with left-closed bins both share one bin and ECE = 0.25.
    assert expected_calibration_error([0.5, 1.0], [True, False], bins=2) == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    assert expected_calibration_error([0.0], [False], bins=10) == 0.0


def test_ece_perfect_calibration_is_zero():
    assert expected_calibration_error([1.0, 1.0, 0.0], [True, True, False]) == pytest.approx(0.0)


@pytest.mark.parametrize(("conf", "correct", "bins"), [
    ([], [], 10), ([0.5, 0.6], [1], 10), ([1.2], [1], 10), ([0.5], [1], 0), ([float("nan")], [1], 10),
])
def test_ece_errors(conf, correct, bins):
    with pytest.raises(ValueError):
        expected_calibration_error(conf, correct, bins=bins)


def test_abstention_metrics_spec_values():
    outcomes = ["correct"] * 6 + ["wrong"] + ["abstain"] * 3
    m = abstention_metrics(outcomes, lam=2.0)
    assert m["coverage"] == pytest.approx(0.7)
    assert m["abstention_rate"] == pytest.approx(0.3)
    assert m["conditional_accuracy"] == pytest.approx(0.857, abs=5e-4)
    assert m["error_rate"] == pytest.approx(0.1)
    assert m["risk_score"] == pytest.approx(0.4)


def test_abstention_metrics_all_abstain_and_errors():
    m = abstention_metrics(["abstain", "abstain"], lam=1.0)
    assert m["coverage"] == 0.0 and m["risk_score"] == 0.0
    assert math.isnan(m["conditional_accuracy"])
    with pytest.raises(ValueError):
        abstention_metrics([], lam=1.0)
    with pytest.raises(ValueError, match="unknown outcomes"):
        abstention_metrics(["correct", "skip"], lam=1.0)


def test_holm_spec_values():
    rejected, adjusted = holm([0.01, 0.04, 0.03, 0.20], alpha=0.05)
    assert rejected == [True, False, False, False]
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.20])


def test_holm_stops_at_first_failure_and_caps_at_one():
    # Sorted: 0.001 ≤ 0.05/3 passes, 0.03 > 0.05/2 fails, so 0.04 is kept even though 0.04 ≤ 0.05/1.
    rejected, adjusted = holm([0.04, 0.001, 0.03])
    assert rejected == [False, True, False]
    assert adjusted == pytest.approx([0.06, 0.003, 0.06])
    _, capped = holm([0.6, 0.7])
    assert capped == pytest.approx([1.0, 1.0])


def test_holm_rejects_all_when_all_pass():
    rejected, _ = holm([0.001, 0.002, 0.003])
    assert rejected == [True, True, True]


@pytest.mark.parametrize(("pvalues", "alpha"), [([], 0.05), ([0.1, 1.5], 0.05), ([0.1], 0.0), ([-0.1], 0.05)])
def test_holm_errors(pvalues, alpha):
    with pytest.raises(ValueError):
        holm(pvalues, alpha=alpha)


def test_majority_correct_takes_each_problems_most_frequent_answer():
    from lmrl.eval.evaluator import majority_correct
    from lmrl.types import Group, Sample

    def problem(*texts):
        return Group("u", {"answer": "5"}, [Sample([1], [2], [0.0], text=t) for t in texts])

    groups = [problem("Answer: 5", "Answer: 3", "so it is 5"),  # 5 wins 2-1 (a bare last number votes)
              problem("Answer: 3", "Answer: 3", "Answer: 5"),   # 3 wins: wrong although one sample is right
              problem("no number", "none either"),             # no answer at all
              problem("Answer: 4", "Answer: 5")]                # tie: the first seen (4)
    correct = [[True, False, True], [False, False, True], [False, False], [False, True]]
    assert majority_correct(groups, correct) == [True, False, False, False]
