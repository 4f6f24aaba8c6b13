"""Reward functions and the safe scorer: extraction, matching, and bad rewards that must not kill a run."""
import math
import time

import pytest

from lmrl.config import RewardConfig, RewardComponent
from lmrl.rewards import REWARD_FNS, RewardScorer, answers_match, extract_answer
from lmrl.types import Group, Sample


def sample(text, answer="42", n_tokens=5, finish="stop"):
    return Sample(prompt_ids=[1], completion_ids=[0] * n_tokens, behaviour_logprobs=[0.0] * n_tokens,
                  finish_reason=finish, text=text, row={"answer": answer})


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


@pytest.mark.parametrize("pred,gold,ok", [
    # numeric gold: a number literal, never an expression that evaluates to it
    ("1 + 2", "3", False), ("6/2", "3", False), ("$8 + 2 - 7$", "3", False), ("\\boxed{8+2-7}", "3", False),
    ("1+2=3", "3", False), ("3 or 4", "3", False), ("1,2", "12", False), ("1 2", "12", False),
    ("1,234", "1234", True), ("1 234", "1234", True), ("1,23,4", "1234", False), ("$1{,}234$", "1234", True),
    ("3/4", "0.75", True), ("3/4", "3/4", True), ("6/8", "3/4", False), ("\\frac{3}{4}", "0.75", True),
    ("-3", "-3", True), ("\u22123", "-3", True), ("- 3", "-3", True), ("+3", "3", True),
    ("5 apples", "5", True), ("$5", "5", True), ("5%", "5", True), ("5 or so", "5", False), ("3x", "3", False),
    ("x = 3", "3", True), ("three", "3", False), ("3.", "3", True), ("\\boxed{3}", "3", True),
    ("1e3", "1000", False), ("0.333333", "1/3", False), ("0.33", "1/3", False),
    # other gold: math-verify, unless the prediction hedges
    ("1 + x^2", "x^2+1", True), ("x^2+1 or x^2-1", "x^2+1", False), ("Paris or London", "Paris", False),
])
def test_what_counts_as_a_number(pred, gold, ok):
    assert answers_match(pred, gold) is ok


@pytest.mark.parametrize("pred,gold,ok", [
    # integers compare exactly, at any size
    ("672484000", "672484416", False), ("1000001", "1000000", False), ("1,000,000", "1000000", True),
    # decimals at the gold's precision (the prediction rounded to the gold's last digit)
    ("0.33", "0.33", True), ("0.333", "0.33", True), ("1/3", "0.33", True), ("0.3", "0.33", False),
    ("0.34", "0.33", False), ("2.5", "2.50", True), ("2.49", "2.5", True), ("2.44", "2.5", False),
    ("3.4", "3", False), ("3.0", "3", True),
    # e-notation: a gold written in it, and its value written out
    ("1.5e-05", "1.5e-05", True), ("0.000015", "1.5e-05", True), ("1.5e-5", "1.5e-05", True),
    ("1.6e-05", "1.5e-05", False), ("1.5e-05", "0.000015", False),  # not asked for: no literal
])
def test_exact_numbers(pred, gold, ok):
    assert answers_match(pred, gold) is ok


@pytest.mark.parametrize("pred,gold,question,ok", [
    ("0.75", "3/4", "Simplify 6/8.", False), ("3/4", "3/4", "Simplify 6/8.", True),
    ("0.75", "3/4", "Write 0.75 as a fraction.", False), ("0.75", "3/4", "What share of 8 is 6?", True),
    ("3/8", "0.375", "Write 0.25 + 0.125 as a decimal.", False), ("3/8", "0.375", "What is 0.25 + 0.125?", True),
    ("2.786824220544401e+05", "278682.4220544401", "Give it in scientific notation (e.g. 1.23e+4).", True),
    ("2.79e+05", "278682.4220544401", "Give it in scientific notation (e.g. 1.23e+4).", False),  # gold's precision
    ("2.786824220544401e+05", "278682.4220544401", "Compute 527.9^2.", False),  # e-notation not asked for
])
def test_the_form_the_question_asks_for(pred, gold, question, ok):
    assert answers_match(pred, gold, question) is ok


def test_a_fraction_from_the_question_is_not_an_answer():
    assert answers_match("3/4", "0.75")
    assert not answers_match("3/4", "0.75", question="What is 3/4 as a decimal?")
    assert not answers_match("3/4", "0.75", question="What is 3 \\div 4?")
    assert answers_match("3/4", "0.75", question="What is 13/4 - 2.5?")  # 3/4 is not in it


@pytest.mark.parametrize("text,numeric", [
    ("3", True), ("-12", True), ("1,234", True), ("0.75", True), ("3/4", True), ("6/2", True),
    ("\\frac{1}{2}", True), ("$5", True), ("5 apples", False), ("x = 3", False), ("3x", False),
    ("x^2+1", False), ("Paris", False), ("1 + 2", False), ("1.5e-05", True), ("-0.0013", True),
])
def test_is_number_is_strict_for_gold(text, numeric):
    from lmrl.rewards.numbers import is_number

    assert is_number(text) is numeric


@pytest.mark.parametrize("text,expected", [
    ("Answer: 3", "3"),
    ("Answer: 3\nAnswer: 3.0", "3.0"),  # agreeing answers: the last
    ("Answer: 4\nAnswer: 3", None),  # conflicting: no answer
    ("so \\boxed{3}", "3"),
    ("Answer: $\\boxed{3}$", "\\boxed{3}"),
    ("\\boxed{4} then Answer: 3", None),
    ("no marker 3", None),
    ("Answer: 3\nThis is the sum of 1 and 2.", "3"),  # an explanation after the answer
    ("Answer: 3\nWait, that is wrong.", None),  # a retraction on the next line
    ("Answer: 3\nNo, it is 4.", None),
    ("\\boxed{3}. Actually, 4", None),
    ("Answer: 3\n4", None),  # another bare number after the answer: a list
    ("Answer: 4\n**Answer**: 3", None),  # a later bold marker disagrees
    ("**Answer**: 3", "3"), ("**Answer:** 3", "3"), ("**Answer:**\n3", "3"), ("Final answer: 3", "3"),
    ("Answer\uff1a3", "3"),  # full-width colon
    ("Answer: ~~4~~ 3", "3"), ("Answer: ~~3~~", None), ("Answer: <del>4</del> 3", "3"),  # struck-out text
])
def test_final_answer(text, expected):
    from lmrl.rewards.answers import final_answer

    assert final_answer(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("so it is 40 + 2 = 42.", "42"),
    ("The sum of 40 and 2 is 42.", "42"),  # the question's numbers may appear
    ("40 + 2 = 42. So the answer", "42"),
    ("-2", "-2"),
    ("It is 42 or 43", None),  # hedge
    ("41 42 43", None),  # several candidates
    ("Maybe 42.", None),
    ("first 40 + 2", None),  # ends on an operand
    ("Calculate 40 + 2.", None),
    ("tens: 40 + 0 = 40. Then 2 + 0", None),  # cut off mid-derivation
    ("no number", None),
    ("so it is 42\u00b2.", None), ("so it is 42\u00bd.", None), ("so it is 42^2", None),  # 42², 42½
    ("it is 42 thousand", None), ("it is 42 is wrong", None), ("it is 42x", None),
    ("the total is (\u221242).", "-42"), ("so 40 + 2 = <b>42</b>.", "42"), ("= \u201342", "-42"),
])
def test_fallback_number(text, expected):
    from lmrl.rewards.answers import fallback_number

    assert fallback_number(text, question="Calculate 40 + 2.") == expected


def test_fallback_is_only_for_replies_without_a_marker():
    assert REWARD_FNS.get("answer")(sample("Answer: 41\nAnswer: 42"), fallback="last_number") == 0.0
    assert REWARD_FNS.get("answer")(sample("Answer: forty-two, i.e. 42"), fallback="last_number") == 0.0
    assert REWARD_FNS.get("answer")(sample("40 + 2 = 42"), fallback="last_number") == 1.0
    with pytest.raises(ValueError, match="fallback"):
        REWARD_FNS.get("answer")(sample("42"), fallback="lenient")


def test_callers_api_is_unchanged():
    """group.py and shaped.py call these with the old signatures."""
    from lmrl.rewards.functions import last_number

    assert last_number("a 1, then 2,") == "2" and last_number("none") is None
    assert extract_answer("Answer: 5\nAnswer: 6") == "6"
    assert answers_match("6", "6") and not answers_match("2 + 4", "6")


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
    assert g.samples[0].excluded == "reward bad: timeout" and metrics["reward_errors/timeout"] == 1.0


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


def make_group(texts):
    return Group(uid="g", row={"answer": "42"}, samples=[sample(t) for t in texts])


class Rank:
    """A stateful group component: ranks within the group, counts the groups it has seen."""

    def __init__(self, offset: float = 0.0):
        self.offset, self.seen = offset, 0

    def __call__(self, samples):
        self.seen += 1
        return [self.offset + i for i in range(len(samples))]


def test_group_component_stateful_class_retries_and_on_error_zero(monkeypatch):
    from lmrl.rewards import GROUP_REWARD_FNS

    calls = {"n": 0}

    def flaky(sample, **_):
        calls["n"] += 1
        if calls["n"] % 2:
            raise RuntimeError("transient")
        return 1.0

    monkeypatch.setitem(GROUP_REWARD_FNS._items, "rank", Rank)
    monkeypatch.setitem(REWARD_FNS._items, "flaky", flaky)
    monkeypatch.setitem(REWARD_FNS._items, "broken", lambda sample, **_: float("nan"))
    cfg = RewardConfig(components=[RewardComponent(name="rank", params={"offset": 1.0}),
                                   RewardComponent(name="flaky")], retries=1, accuracy_component="flaky")
    scorer = RewardScorer(cfg)
    g = make_group(["a", "b", "c"])
    metrics = scorer.score([g])
    assert [s.rewards["rank"] for s in g.samples] == [1.0, 2.0, 3.0]
    assert [s.reward for s in g.samples] == [2.0, 3.0, 4.0]  # every flaky call succeeded on its retry
    assert scorer.components[0].call.seen == 1 and metrics["reward_errors"] == 0.0 and calls["n"] == 6

    cfg = RewardConfig(components=[RewardComponent(name="broken")], on_error="zero", accuracy_component="broken")
    g = make_group(["a"])
    metrics = RewardScorer(cfg).score([g])
    assert g.samples[0].excluded is None and g.samples[0].reward == 0.0
    assert metrics["reward_errors/non-finite"] == 1.0 and metrics["excluded"] == 0.0


def test_group_component_wrong_shape_excludes_group(monkeypatch):
    from lmrl.rewards import GROUP_REWARD_FNS

    monkeypatch.setitem(GROUP_REWARD_FNS._items, "short", lambda samples, **_: [1.0])
    cfg = RewardConfig(components=[RewardComponent(name="short")], accuracy_component="short")
    g = make_group(["a", "b"])
    metrics = RewardScorer(cfg).score([g])
    assert all(s.excluded.startswith("reward short: wrong shape") for s in g.samples)
    assert metrics["excluded"] == 1.0


def test_rollout_metrics_report_the_sampling_entropy_of_every_row():
    from lmrl.loops.collect import rollout_metrics

    a = Sample(prompt_ids=[1], completion_ids=[5, 6], behaviour_logprobs=[-1.0, -2.0], reward=1.0,
               rewards={"answer": 1.0})
    b = Sample(prompt_ids=[1], completion_ids=[7], behaviour_logprobs=[-3.0], reward=0.0, rewards={"answer": 0.0})
    metrics = rollout_metrics([Group(uid="g", row={}, samples=[a, b])], "answer")
    assert metrics["entropy/rollout"] == pytest.approx(2.0)
    assert metrics["accuracy"] == 0.5 and metrics["response_length/mean"] == 1.5


def test_concurrency_scores_a_groups_samples_at_once(monkeypatch):
    """Four calls must be in flight together to pass the barrier; one at a time they time out."""
    import threading

    for concurrency, ok in ((4, True), (1, False)):
        barrier = threading.Barrier(4, timeout=1.0)

        def meet(s, **_):
            barrier.wait()
            return 1.0

        monkeypatch.setitem(REWARD_FNS._items, "meet", meet)
        scorer = RewardScorer(RewardConfig(components=[RewardComponent(name="meet")], accuracy_component="meet",
                                           concurrency=concurrency, timeout_s=3.0))
        g = Group("u", {"answer": "42"}, [sample(f"Answer: {i}") for i in range(4)])
        scorer.score([g])
        assert all((x.excluded is None) == ok for x in g.samples), concurrency
        assert ok or all("BrokenBarrierError" in x.excluded for x in g.samples)


def test_hung_calls_do_not_starve_later_samples(monkeypatch):
    """Six calls hang past the timeout (more than the pool's 4 workers); the calls after them still
    run on fresh workers instead of queueing behind the hung ones."""
    import threading

    release = threading.Event()
    calls = {"n": 0}

    def sometimes_hangs(s, **_):
        calls["n"] += 1
        if calls["n"] <= 6:
            release.wait(10)
        return 1.0

    scorer = _scorer(monkeypatch, sometimes_hangs, timeout=0.2)
    g = Group("u", {"answer": "42"}, [sample("Answer: 42") for _ in range(10)])
    scorer.score([g])
    release.set()
    assert [x.excluded is None for x in g.samples] == [False] * 6 + [True] * 4
