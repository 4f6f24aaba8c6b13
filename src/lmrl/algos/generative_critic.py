"""GenAC's actor advantage (stages §7.2): A_i = r_i − v(x), v(x) a generative critic's value of the prompt.
Confidence: low — reconstructed from the abstract.

The value arrives as a reward component (`genac_value`, weight 0, in `lmrl.rewards.genac`): the estimator
reads its column of `reward_components` by the knob `value_component`. Sequence level only: every valid token
of sample i gets A_i. docs/methods/genac.md.
"""
from __future__ import annotations

import torch

from lmrl.algos.advantages import ADVANTAGES, required, sequence_scores, to_tokens


def critic_baseline_advantages(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B] A_i = r_i − v_i; a NaN value (the critic gave none) is a ValueError."""
    if torch.isnan(values).any():
        raise ValueError("genac: the critic value is missing for some samples (genac_value gave none)")
    return scores - values


@ADVANTAGES.register("genac", "GenAC: r_i minus a generative critic's value v(x) (the genac_value reward component)",
                     requires={"reward_components"})
def genac(token_rewards, group_index, mask, reward_components=None, reward_component_names=None,
          value_component: str = "genac_value", **_):
    components = required("reward_components", reward_components)
    names = list(reward_component_names or [])
    if value_component not in names:
        raise ValueError(f"genac: no reward component {value_component!r} among {names}: add "
                         f"{{name: {value_component}, weight: 0}} to reward.components (or set "
                         "algo.advantage_params.value_component)")
    values = components[:, names.index(value_component)].to(token_rewards.device).float()
    return to_tokens(critic_baseline_advantages(sequence_scores(token_rewards), values), mask)
