"""Reward functions and the safe scorer: extraction, matching, and bad rewards that must not kill a run."""
import math
import time

import pytest

from lmrl.config import RewardConfig, RewardComponent
from lmrl.rewards import REWARD_FNS, RewardScorer, answers_match, extract_answer
from lmrl.types import Group, Sample


def sample(text, answer="42", n_tokens=5, finish="stop"):
    return Sample(prompt_ids=[1], completion_ids=[0] * n_tokens, behaviour_logprobs=[0.0] * n_tokens,
                  finish_reason=finish, info={"text": text, "row": {"answer": answer}})


@pytest.mark.parametrize("text,expected", [
    ("so 40 + 2 = 42. Answer: 42", "42"),
    ("Answer: 1\nwait, Answer: **-7**.", "-7"),
    ("The answer is: 3/4", "3/4"),
    ("no marker here 42", None),
    ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("pred,gold,ok", [
    ("42", "42", True), ("42.0", "42", True), ("1,000", "1000", True), ("-3", "3", False),
    ("\\frac{1}{2}", "0.5", True), ("x+1", "1+x", True), ("Paris", "paris", True), ("41", "42", False),
])
def test_answers_match(pred, gold, ok):
    assert answers_match(pred, gold) is ok


def test_answer_and_format_rewards():
    assert REWARD_FNS.get("answer")(sample("Answer: 42")) == 1.0
    assert REWARD_FNS.get("answer")(sample("Answer: 41")) == 0.0
    assert REWARD_FNS.get("answer")(sample("42")) == 0.0
    assert REWARD_FNS.get("format")(sample("blah\nAnswer: 7")) == 1.0
    assert REWARD_FNS.get("format")(sample("Answer: 7 and more text\nmore")) == 0.0
    assert REWARD_FNS.get("length")(sample("x", n_tokens=64), target=128) == -0.5
    assert REWARD_FNS.get("truncated")(sample("x", finish="length")) == -1.0


def _scorer(monkeypatch, fn, timeout=10.0):
    monkeypatch.setitem(REWARD_FNS._items, "bad", fn)
    cfg = RewardConfig(components=[RewardComponent(name="answer"), RewardComponent(name="bad", weight=0.5)],
                       timeout_s=timeout)
    return RewardScorer(cfg)


@pytest.mark.parametrize("bad,reason", [
    (lambda s, **_: 1 / 0, "error"), (lambda s, **_: None, "none"), (lambda s, **_: math.nan, "non-finite"),
    (lambda s, **_: "1.0", "wrong type"), (lambda s, **_: float("inf"), "non-finite"),
])
def test_bad_reward_excludes_sample_and_is_counted(monkeypatch, bad, reason):
    calls = {"n": 0}

    def flaky(s, **kw):
        calls["n"] += 1
        return bad(s) if calls["n"] == 1 else 1.0

    scorer = _scorer(monkeypatch, flaky)
    g = Group("u", {"answer": "42"}, [sample("Answer: 42"), sample("Answer: 1")])
    metrics = scorer.score([g])
    assert g.samples[0].excluded and reason in g.samples[0].excluded
    assert g.samples[0].reward is None
    assert g.samples[1].reward == pytest.approx(0.5)  # answer 0 + 0.5 × 1.0
    assert metrics["excluded"] == 0.5


def test_hanging_reward_times_out(monkeypatch):
    scorer = _scorer(monkeypatch, lambda s, **_: time.sleep(5), timeout=0.2)
    g = Group("u", {"answer": "42"}, [sample("Answer: 42")])
    t = time.perf_counter()
    metrics = scorer.score([g])
    assert time.perf_counter() - t < 2
    assert g.samples[0].excluded == "reward bad: timeout" and metrics["excluded/timeout"] == 1.0


def test_dict_rewards_are_named_components(monkeypatch):
    scorer = _scorer(monkeypatch, lambda s, **_: {"a": 1.0, "b": 2.0})
    g = Group("u", {"answer": "42"}, [sample("Answer: 42")])
    scorer.score([g])
    assert g.samples[0].rewards == {"answer": 1.0, "bad/a": 1.0, "bad/b": 2.0}


def test_last_number_fallback_is_opt_in():
    s = sample("so it is 40 + 2 = 42.")
    assert REWARD_FNS.get("answer")(s) == 0.0
    assert REWARD_FNS.get("answer")(s, fallback="last_number") == 1.0
    assert REWARD_FNS.get("answer")(sample("Answer: 41, not 42"), fallback="last_number") == 0.0
