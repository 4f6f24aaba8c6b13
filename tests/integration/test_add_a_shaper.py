"""Adding a reward shaper touches no config, algorithm, validation or loop file (docs/architecture.md,
"Shapers"): a clip of the sequence rewards registered here is switched on by `algo.extra_shapers`,
runs in its stage before the estimator, and a tiny model trains with it."""
from __future__ import annotations


import pytest

from conftest import toy_run_config, train_tiny
from lmrl.algos import Algorithm
from lmrl.algos.shapers import SHAPERS, active_shapers
from lmrl.config import AlgoConfig, ConfigError, ShaperConfig
from lmrl.types import Sample, collate


@SHAPERS.register("reward_clip", "clip each sequence reward to [low, high]", stage="rewards")
def reward_clip(rewards, inputs, low: float = -1.0, high: float = 1.0):
    clipped = rewards.clamp(low, high)
    return clipped, {"reward_clip/frac": float((clipped != rewards).float().mean())}


def shaper_config(tmp_path, steps=2, **shaper):
    return toy_run_config(tmp_path, steps, algo={"shaping": [{"name": "reward_clip", **shaper}]})


def test_the_shapers_of_a_stage_run_in_their_order_before_the_estimator(tmp_path):
    algo = shaper_config(tmp_path, params={"high": 0.5}).algo
    cfg = algo.model_copy(update={"shaping": [ShaperConfig(name="overlong", params={"buffer": 2}), *algo.shaping]})
    assert [s.name for s in active_shapers(cfg)] == ["overlong", "reward_clip"]
    samples = [Sample([1, 2], [5] * n, [-0.5] * n, reward=r) for r, n in zip([1.0, 2.0, 0.0], [2, 4, 2])]
    batch = collate(samples, [0, 0, 0], pad_id=0)
    metrics = Algorithm(cfg.model_copy(update={"advantage": "dr_grpo"}), max_new_tokens=4).prepare(batch)
    # overlong: the 4-token row loses (4 - 2) / 2 = 1 → [1, 1, 0]; clipped to 0.5 → [0.5, 0.5, 0] (2 of 3 rows)
    assert metrics["reward_clip/frac"] == pytest.approx(2 / 3)
    # dr_grpo: r − mean = 0.5 − 1/3 on the first two rows, −1/3 on the last
    per_row = (batch.advantages * batch.completion_mask).sum(1) / batch.completion_mask.sum(1)
    assert per_row.tolist() == pytest.approx([1 / 6, 1 / 6, -1 / 3])


def test_a_registered_shaper_trains_a_tiny_model(tmp_path):
    cfg = shaper_config(tmp_path, params={"low": 0.0, "high": 0.0})  # every reward clipped to 0
    steps, _ = train_tiny(cfg)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0 <= r["reward_clip/frac"] <= 1 for r in steps)
    assert all(r["advantage/abs_mean"] == 0.0 for r in steps)  # equal (clipped) rewards leave no advantage


@pytest.mark.parametrize("shaper, error", [
    ({"params": {"hi": 2.0}}, "unknown param 'hi' of shaper 'reward_clip'; did you mean 'high'?"),
    ({"name": "reward_clap"}, "algo.shaping[0].name"),
    ({"name": "kl_in_reward"}, "the 'kl_in_reward' shaper is switched on by algo.kl_in_reward"),
])
def test_shaping_entries_are_checked_at_config_time(tmp_path, shaper, error):
    with pytest.raises(ConfigError) as err:
        shaper_config(tmp_path, **shaper)
    assert error in str(err.value)


def test_the_keyed_shaper_comes_first_then_the_list_in_order():
    cfg = AlgoConfig(kl_in_reward=True, kl_coef=0.1, shaping=[{"name": "overlong", "params": {"buffer": 2}},
                                                             {"name": "cost_aware", "params": {"fraction": 0.5}}])
    assert [(s.name, s.knobs) for s in active_shapers(cfg)] == [
        ("kl_in_reward", {"coef": 0.1}), ("overlong", {"buffer": 2}), ("cost_aware", {"fraction": 0.5})]
    assert active_shapers(AlgoConfig()) == []
