"""Held-out accuracy is the accuracy component's alone: another component's errors do not make a sample wrong,
and a sample the accuracy component itself cannot grade is counted as excluded, not as wrong."""
from __future__ import annotations

import math

import pytest

from lmrl.config import RewardComponent, RewardConfig
from lmrl.eval.evaluator import correct_flags, graded_flags
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.types import Group, Sample


def sample(text: str) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], finish_reason="stop",
                  text=text, row={"answer": "7"})


def exact(sample, **_):
    """Accuracy: 1 for '7', 0 for another digit; raises on a reply that is not a digit."""
    return float(int(sample.text) == 7)


@pytest.fixture
def components(monkeypatch):
    monkeypatch.setitem(REWARD_FNS._items, "exact", exact)
    monkeypatch.setitem(REWARD_FNS._items, "nan_bonus", lambda sample, **_: math.nan)
    monkeypatch.setitem(REWARD_FNS._items, "bonus", lambda sample, **_: 0.5)


def scored(bonus: str, on_error: str = "exclude") -> list[Group]:
    """Replies '7', '3', 'x', '7' scored by `bonus` (listed first) and the accuracy component `exact`."""
    cfg = RewardConfig(components=[RewardComponent(name=bonus), RewardComponent(name="exact")],
                       accuracy_component="exact", on_error=on_error)
    groups = [Group("g", {"answer": "7"}, [sample(t) for t in ("7", "3", "x", "7")])]
    RewardScorer(cfg, report=lambda _: None).score(groups)
    return groups


@pytest.mark.usefixtures("components")
@pytest.mark.parametrize("on_error", ["exclude", "zero"])
def test_a_failing_secondary_component_leaves_accuracy_as_it_was(on_error):
    working, failing = scored("bonus", on_error), scored("nan_bonus", on_error)
    assert graded_flags(working, "exact") == [[True, False, None, True]]
    assert graded_flags(failing, "exact") == [[True, False, None, True]]  # NaN bonus on every sample: same grades
    assert correct_flags(failing, "exact") == [[True, False, False, True]]
    if on_error == "exclude":
        assert all(s.excluded for s in failing[0].samples)  # still out of any update


@pytest.mark.usefixtures("components")
def test_a_sample_excluded_before_scoring_has_no_verdict():
    groups = [Group("g", {"answer": "7"}, [sample("7"), sample("7")])]
    groups[0].samples[1].excluded = "env step: connection reset"
    RewardScorer(RewardConfig(components=[RewardComponent(name="exact")], accuracy_component="exact")).score(groups)
    assert graded_flags(groups, "exact") == [[True, None]]
