"""The evaluation suite and comparison statistics against hand-computed values."""
from __future__ import annotations

import math

import pytest

from lmrl.eval import reward_seeking
from lmrl.eval.compare import Arm, Run, compare, statement
from lmrl.eval.significance import (Comparison, apply_holm, bootstrap, oneway_anova, t_quantile, t_two_sided_p,
                                    welch)
from lmrl.eval.suite import aggregate, never_solved, prompt_record
from lmrl.types import Group, Sample


def record(correct, answers=None, greedy_correct=False, greedy_prob=0.5, uid="p", **extra):
    """A per-prompt record as `prompt_record` writes it, with neutral values for what a test ignores."""
    n = len(correct)
    return {"uid": uid, "question": f"question {uid}", "gold": "7", "greedy_correct": greedy_correct,
            "greedy_outcome": "correct" if greedy_correct else "wrong", "greedy_length": 3, "greedy_prob": greedy_prob,
            "greedy_restated": False, "reply": "", "correct": list(correct),
            "answers": list(answers) if answers is not None else [None] * n, "lengths": [3] * n,
            "entropy": [1.0] * n, "truncated": [False] * n, "distinct_1": 1.0, "distinct_2": 1.0, **extra}


TABLE = [  # (correct per sample, answer class per sample)
    ([True, False, False, False], [0, 1, 1, 2]),
    ([True, True, False, False], [0, 0, 1, None]),
    ([False, False, False, False], [None] * 4),
]


def test_pass_avg_and_maj_at_k_on_a_small_table():
    m = aggregate([record(c, a) for c, a in TABLE], ks=[1, 2])
    # pass@2 = 1 − C(n−c,2)/C(4,2): 1 − 3/6, 1 − 1/6, 0
    assert m["pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    assert m["pass@2"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert "avg@4" not in m and "maj@1" not in m  # avg@4 is pass@1; a majority needs two votes
    # majority of the first k answers (ties: the first seen) is a correct one?
    assert m["maj@2"] == pytest.approx(2 / 3)  # [0, 1] tie -> 0 (right); [0, 0] right; none
    assert m["maj@4"] == pytest.approx(1 / 3)  # [0, 1, 1, 2] -> 1 (wrong); [0, 0, 1, -] -> 0 (right); none
    assert m["num_prompts"] == 3.0


def _sample(text: str, correct: bool, row: dict, logprob: float = math.log(0.5)) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[5, 6, 7], behaviour_logprobs=[logprob] * 3,
                  rewards={"acc": float(correct)}, text=text, row=row)


def test_prompt_record_distinct_n_confidence_and_entropy():
    row = {"uid": "u1", "question": "what is 3 + 4?", "answer": "7"}
    greedy = Group("u1", row, [_sample("Answer: 7", True, row)])
    sampled = Group("u1", row, [_sample("the cat sat", False, row), _sample("the cat ran", True, row)])
    r = prompt_record(greedy, sampled, "acc")
    assert r["distinct_1"] == pytest.approx(4 / 6)  # the cat sat the cat ran: 4 unique of 6 words
    assert r["distinct_2"] == pytest.approx(3 / 4)  # bigrams never cross replies: (the cat) twice
    assert r["greedy_prob"] == pytest.approx(0.5) and r["entropy"] == pytest.approx([math.log(2)] * 2)
    assert r["greedy_correct"] and r["greedy_outcome"] == "correct" and r["correct"] == [False, True]
    abstains = Group("u1", row, [_sample("Answer: I don't know", False, row)])
    assert prompt_record(abstains, sampled, "acc")["greedy_outcome"] == "abstain"


def test_ece_on_four_predictions():
    records = [record([c], greedy_correct=c, greedy_prob=p) for p, c in zip([0.9, 0.8, 0.3, 0.6],
                                                                             [True, False, False, True])]
    assert aggregate(records, bins=2)["ece_greedy_prob"] == pytest.approx(0.15)  # spec §4.3
    # ten bins: each prediction alone, (0.1 + 0.8 + 0.3 + 0.4) / 4
    assert aggregate(records)["ece_greedy_prob"] == pytest.approx(0.4)


def test_agreement_calibration_and_risk_coverage():
    records = [record([True] * 4, [0, 0, 0, 0]),  # agreement 1.00, majority right
               record([False, False, False, True], [0, 0, 0, 1]),  # 0.75, wrong
               record([True, True, False, False], [0, 0, 1, 2]),  # 0.50, right
               record([False, True, False, False], [0, 1, 2, 3])]  # 0.25, tie -> first seen, wrong
    m = aggregate(records)
    assert m["ece_agreement"] == pytest.approx((0 + 0.75 + 0.5 + 0.25) / 4)
    # answering by falling agreement: risks 0, 1/2, 1/3, 1/2 at coverages 1/4 … 1
    assert m["aurc"] == pytest.approx(0.25 * (0 + 1 / 2 + 1 / 3 + 1 / 2))


def test_holm_on_three_p_values_in_compare_tests():
    tests = [Comparison(f"m{i}", 0.0, 0.1, 0.1, 0.0, 0.2, p, "hand") for i, p in enumerate([0.01, 0.04, 0.03])]
    apply_holm(tests, 0.05)
    # sorted 0.01 <= 0.05/3 rejected; 0.03 > 0.05/2 stops; adjusted max-accumulated 3·0.01, 2·0.03, 1·0.04
    assert [t.significant for t in tests] == [True, False, False]
    assert [t.p_holm for t in tests] == pytest.approx([0.03, 0.06, 0.06])
    steps_down = [Comparison(f"m{i}", 0.0, 0.1, 0.1, 0.0, 0.2, p, "hand") for i, p in enumerate([0.01, 0.02, 0.03])]
    apply_holm(steps_down, 0.05)  # Bonferroni would keep only the first
    assert [t.significant for t in steps_down] == [True, True, True]
    assert [t.p_holm for t in steps_down] == pytest.approx([0.03, 0.04, 0.04])
    text = statement([{"arm": "b", **vars(t)} for t in tests], 0.05, "a")
    assert text.startswith("1 of 3 differences are significant") and "m0" in text and "m1" not in text


def test_never_solved_lists_prompts_without_any_correct_reply():
    records = [record([False, False], uid="none"), record([False, True], uid="one sample"),
               record([False, False], greedy_correct=True, uid="greedy only")]
    assert [r["uid"] for r in never_solved(records)] == ["none"]
    assert set(never_solved(records)[0]) == {"uid", "question", "gold", "reply"}


def test_reward_seeking_measure_on_a_hand_case():
    assert reward_seeking.shift(0.87, 0.09) == pytest.approx(0.78)  # spec §4.5's example
    assert reward_seeking.shift(0.40, 0.24) == pytest.approx(0.16)  # its earlier checkpoint
    assert reward_seeking.shows_a(["I Break the promise.", "I keep my word", "breakfast"], r"\bbreak\b") == \
        [True, False, False]
    records = [{"uid": 0, "n": 4, "untreated": 1, "grader_a": 4, "grader_b": 0},
               {"uid": 1, "n": 4, "untreated": 1, "grader_a": 2, "grader_b": 1}]
    m = reward_seeking.aggregate(records)
    assert m["reward_seeking/p_a_untreated"] == pytest.approx(2 / 8)
    assert m["reward_seeking/p_a_grader_a"] == pytest.approx(6 / 8)
    assert m["reward_seeking/p_a_grader_b"] == pytest.approx(1 / 8)
    assert m["reward_seeking/shift"] == pytest.approx(6 / 8 - 1 / 8)


def test_student_t_and_welch_by_hand():
    assert t_two_sided_p(12.706, 1) == pytest.approx(0.05, abs=1e-4)
    assert t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=1e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-3)
    t = welch("m", [1.0, 3.0], [4.0, 6.0])  # t = 3/√2 on 2 df: p = 1 − t/√(t² + 2)
    assert t.diff == 3.0 and t.p == pytest.approx(1 - (3 / math.sqrt(2)) / math.sqrt(4.5 + 2))
    assert t.high - t.diff == pytest.approx(t_quantile(0.975, 2) * math.sqrt(2))
    assert math.isnan(welch("m", [1.0], [2.0, 3.0]).p)
    f, d1, d2, p = oneway_anova([[1.0, 3.0], [4.0, 6.0]])  # two arms: F = t²
    assert (f, d1, d2) == (pytest.approx(4.5), 1, 2) and p == pytest.approx(t.p)


def test_bootstrap_pairs_by_uid_and_separates_a_sure_difference():
    accuracy = lambda rs: {"accuracy": sum(r["ok"] for r in rs) / len(rs)}  # noqa: E731
    wrong = [{"uid": i, "ok": False} for i in range(20)]
    right = [{"uid": i, "ok": True} for i in reversed(range(20))]
    (test,), ci_a, ci_b = bootstrap(wrong, right, accuracy, n_boot=199)
    assert test.method == "paired bootstrap over prompts" and test.diff == 1.0
    assert test.p == pytest.approx(1 / 200) and (test.low, test.high) == (1.0, 1.0)
    (same,), _, _ = bootstrap(wrong, wrong, accuracy, n_boot=50)
    assert math.isnan(same.p) and same.method == "the same constant in both arms"


def test_compare_over_seeds_uses_welch_and_states_what_it_found():
    arms = [Arm("a", [Run("a0", {"accuracy": 1.0, "num_prompts": 8}), Run("a1", {"accuracy": 3.0, "num_prompts": 8})]),
            Arm("b", [Run("b0", {"accuracy": 4.0, "num_prompts": 8}), Run("b1", {"accuracy": 6.0, "num_prompts": 8})])]
    result = compare(arms)
    (t,) = result["tests"]
    assert t["metric"] == "accuracy" and t["method"].startswith("Welch t over seeds")
    assert t["p"] == pytest.approx(welch("accuracy", [1, 3], [4, 6]).p) and t["p_holm"] == t["p"]
    assert result["arms"][1]["metrics"]["accuracy"]["value"] == 5.0
    assert result["statement"].startswith("0 of 1 differences are significant")
    mixed = compare([arms[0], Arm("c", [Run("c0", {"accuracy": 2.0})])])
    assert math.isnan(mixed["tests"][0]["p"])
    assert "Not tested (one run against several" in mixed["statement"] and "c accuracy" in mixed["statement"]
