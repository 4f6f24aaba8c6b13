"""The stop rules' memory: a `drop` rule fires when its metric falls more than `drop` below its best while the
watched metric rises (the over-optimisation rule of stages_and_credit §5.1)."""
from __future__ import annotations

import pytest

from lmrl.config import ConfigError, StopRule
from lmrl.loops.stopping import StopWatch

GOLD, PROXY = "eval/accuracy", "eval/reward/reward_model"


def readings(watch: StopWatch, gold: list[float], proxy: list[float]) -> list[str | None]:
    return [watch.reason({GOLD: e, PROXY: p}, evaluation=True) for e, p in zip(gold, proxy)]


def test_the_spec_case_fires_at_the_fourth_reading():
    """E = [0.50, 0.58, 0.61, 0.57, 0.55], P rising, δ = 0.03: 0.57 < 0.61 − 0.03 at t = 3 (best at t = 2)."""
    watch = StopWatch([StopRule(metric=GOLD, drop=0.03, while_rising=PROXY)])
    fired = readings(watch, [0.50, 0.58, 0.61, 0.57, 0.55], [1.0, 2.0, 3.0, 4.0, 5.0])
    assert [f is not None for f in fired] == [False, False, False, True, True]
    assert "0.57" in fired[3] and "0.61" in fired[3] and PROXY in fired[3]
    assert watch.best == {0: 0.61}


def test_a_fall_while_the_proxy_also_falls_is_not_over_optimisation():
    watch = StopWatch([StopRule(metric=GOLD, drop=0.03, while_rising=PROXY)])
    assert readings(watch, [0.50, 0.61, 0.40], [1.0, 3.0, 2.0]) == [None, None, None]
    plain = StopWatch([StopRule(metric=GOLD, drop=0.03)])  # without while_rising: any fall counts
    assert readings(plain, [0.50, 0.61, 0.40], [1.0, 3.0, 2.0])[2] is not None


def test_a_fall_of_exactly_drop_does_not_fire():
    watch = StopWatch([StopRule(metric=GOLD, drop=0.25)])
    assert readings(watch, [0.5, 0.75, 0.5, 0.25], [0] * 4) == [None, None, None, watch.reason({GOLD: 0.25},
                                                                                               evaluation=True)]
    assert readings(StopWatch([StopRule(metric=GOLD, drop=0.25)]), [0.5, 0.25], [0, 0]) == [None, None]


def test_the_memory_survives_a_save_and_load():
    rule = StopRule(metric=GOLD, drop=0.03, while_rising=PROXY)
    first = StopWatch([rule])
    readings(first, [0.50, 0.61], [1.0, 2.0])
    again = StopWatch([rule])
    again.load_state_dict(first.state_dict())
    assert readings(again, [0.57], [3.0])[0] is not None
    fresh = StopWatch([rule])
    assert readings(fresh, [0.57], [3.0]) == [None]  # without the memory it has nothing to fall from


def test_step_rules_and_evaluation_rules_read_their_own_metrics():
    watch = StopWatch([StopRule(metric="reward/mean", above=0.5), StopRule(metric=GOLD, below=0.1)])
    assert watch.reason({"reward/mean": 0.9}) == "reward/mean = 0.9 > 0.5"
    assert watch.reason({GOLD: 0.05}, evaluation=True) == f"{GOLD} = 0.05 < 0.1"
    with pytest.raises(ConfigError, match="evaluation logged no metric"):
        watch.reason({"eval/acuracy": 0.05}, evaluation=True)


@pytest.mark.parametrize("rule, message", [
    ({"metric": GOLD, "drop": 0.1, "above": 1}, "exactly one"),
    ({"metric": GOLD, "below": 0.1, "while_rising": PROXY}, "goes with `drop`"),
    ({"metric": GOLD, "drop": 0.1, "while_rising": "reward/mean"}, "both metrics of the evaluation"),
    ({"metric": GOLD, "drop": -0.1}, "greater than or equal"),
])
def test_bad_rules_are_refused(rule, message):
    with pytest.raises(ValueError, match=message):
        StopRule(**rule)
