"""A reward that fails is loud: its first error is printed once with the traceback of its own code, the error
share is logged, and a step above `reward.max_error_rate` stops the run naming the component and the line."""
from __future__ import annotations

import math

import pytest

from lmrl.config import RewardComponent, RewardConfig
from lmrl.errors import RewardErrorRate
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.types import Group, Sample

# the user's reward of the report: it reads a field the rows renamed
USER_REWARD = '''
def target_field(sample, **_):
    return float(sample.info["row"]["target"] in sample.info["text"])
'''


def sample(text: str, row: dict) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[0, 0], behaviour_logprobs=[0.0, 0.0], finish_reason="stop",
                  text=text, row=row)


def four_samples() -> list[Group]:
    """Four samples, one of whose rows still has `target`: the user's reward fails on three."""
    rows = [{"answer": "7"}, {"answer": "7"}, {"answer": "7"}, {"target": "7"}]
    return [Group("g", rows[0], [sample("7", r) for r in rows])]


@pytest.fixture
def user_reward(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARD)
    return path, f"{path}:target_field"


def scorer_for(name: str, printed: list[str], **reward) -> RewardScorer:
    cfg = RewardConfig(components=[RewardComponent(name=name)], accuracy_component=name, **reward)
    return RewardScorer(cfg, report=printed.append)


def test_the_first_error_of_a_component_is_shown_once_with_the_users_traceback(user_reward):
    path, name = user_reward
    printed: list[str] = []
    scorer = scorer_for(name, printed)
    scorer.score(four_samples())
    scorer.score(four_samples())  # six more failures: still one message
    assert len(printed) == 1
    message = printed[0]
    assert message.startswith(f"reward {name} failed (error: KeyError: 'target')")
    assert f'File "{path}", line 3, in target_field' in message  # the user's own file and line
    assert 'return float(sample.info["row"]["target"] in sample.info["text"])' in message
    assert message.rstrip().endswith("KeyError: 'target'")
    assert "concurrent/futures" not in message and "compute.py" not in message  # the scorer's frames left out


def test_the_default_report_goes_to_stderr(user_reward, capsys):
    _, name = user_reward
    RewardScorer(RewardConfig(components=[RewardComponent(name=name)], accuracy_component=name)).score(four_samples())
    out, err = capsys.readouterr()
    assert out == "" and err.count("KeyError: 'target'") == 2  # the header's reason and the traceback's last line


def test_each_component_is_shown_once_and_a_non_finite_value_without_a_traceback(monkeypatch):
    monkeypatch.setitem(REWARD_FNS._items, "nan_bonus", lambda sample, **_: math.nan)
    monkeypatch.setitem(REWARD_FNS._items, "none_bonus", lambda sample, **_: None)
    printed: list[str] = []
    cfg = RewardConfig(components=[RewardComponent(name="nan_bonus"), RewardComponent(name="none_bonus")],
                       accuracy_component="none_bonus")
    RewardScorer(cfg, report=printed.append).score(four_samples())
    assert len(printed) == 2
    assert printed[0].startswith("reward nan_bonus failed (non-finite)") and "Traceback" not in printed[0]
    assert printed[1].startswith("reward none_bonus returned None (no verdict)")


def test_error_shares_count_samples_with_an_error_and_not_a_none(user_reward, monkeypatch):
    _, name = user_reward
    monkeypatch.setitem(REWARD_FNS._items, "abstains", lambda sample, **_: None if sample.info["text"] else 1.0)
    metrics = scorer_for(name, []).score(four_samples())
    assert metrics["reward_error_share"] == 0.75 and metrics[f"reward_error_share/{name}"] == 0.75
    assert metrics["excluded"] == 0.75
    metrics = scorer_for("abstains", []).score(four_samples())  # every sample declined: excluded, no error
    assert metrics["reward_error_share"] == 0.0 and metrics["excluded"] == 1.0


def test_a_step_above_the_max_error_rate_stops_naming_the_component_exception_and_line(user_reward):
    path, name = user_reward
    scorer = scorer_for(name, [])
    metrics = scorer.score(four_samples())
    with pytest.raises(RewardErrorRate) as raised:
        scorer.check_error_rate(metrics, step=1)
    message = str(raised.value)
    assert message.splitlines()[0] == ("step 1: 75% of the samples had reward errors, above "
                                       "reward.max_error_rate=0.5")
    assert f"reward {name} failed on 75% of the samples: error: KeyError: 'target'" in message
    assert f'first raised at {path}:3 in target_field: return float(sample.info["row"]["target"]' in message
    assert "reward.max_error_rate=1.0" in message  # how to go on regardless


def test_a_rare_error_goes_on_and_max_error_rate_one_never_stops(user_reward):
    _, name = user_reward
    scorer = scorer_for(name, [])
    scorer.check_error_rate({"reward_error_share": 0.1, f"reward_error_share/{name}": 0.1}, step=1)
    scorer.check_error_rate({"reward_error_share": 0.5, f"reward_error_share/{name}": 0.5}, step=1)  # not above
    everything_fails = scorer_for(name, [], max_error_rate=1.0)
    everything_fails.check_error_rate({"reward_error_share": 1.0, f"reward_error_share/{name}": 1.0}, step=1)
    with pytest.raises(RewardErrorRate):
        scorer_for(name, [], max_error_rate=0.0).check_error_rate({"reward_error_share": 0.01}, step=1)


def test_max_error_rate_defaults_to_one_half_and_is_a_share():
    assert RewardConfig().max_error_rate == 0.5
    with pytest.raises(ValueError):
        RewardConfig(max_error_rate=1.5)


def test_time_spent_scoring_adds_up(monkeypatch):
    import time

    monkeypatch.setitem(REWARD_FNS._items, "slow", lambda sample, **_: time.sleep(0.05) or 1.0)
    scorer = scorer_for("slow", [])
    scorer.score(four_samples())
    assert 0.2 <= scorer.seconds < 1.0  # four samples × 0.05 s
