"""The environment's own reward as a reward component, so aggregation, gaming metrics and filters apply.

A multi-turn episode (`lmrl.envs.episodes`) records the sum of its per-turn rewards in
`sample.info["env_return"]` (the list in `info["turn_rewards"]`); the `env` component returns it.
Combine it with task graders like any component: `reward.components: [{name: answer}, {name: env}]`.
"""
from __future__ import annotations

from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample


@REWARD_FNS.register("env", "the episode's environment reward: the sum of its per-turn rewards")
def env_reward(sample: Sample, **_) -> float | None:
    """None (a reward error) for a sample that no environment played: the config names `env` without `env.name`."""
    value = sample.info.get("env_return")
    return None if value is None else float(value)
