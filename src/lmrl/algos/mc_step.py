"""Step advantages from Monte-Carlo step values (VinePPO; Math-Shepherd's on-policy values, specs §6.2).

A completion's steps s_1..s_m end at its step delimiters; V(s_j) is the mean outcome of the `k` value-only
continuations sampled from the end of step j (the `mc_steps` rollout controller; the input `mc_step_values`
carries them per token, `lmrl.inputs.mc_steps`), V(s_m) the completion's own reward and V(s_0) the mean reward
of the group's completions. Step j's advantage is

    A_j = V(s_j) − V(s_{j−1})    on the tokens of step j,

divided by the group's reward std with `normalise` (GRPO's scale). The steps' advantages of a completion sum to
r − mean_group r, Dr.GRPO's advantage, which is also what a completion without steps gets. `mc_step` is the
estimator; the shaper `mc_step_rewards` puts A_j as a token reward on step j's last token instead, for the
estimators that read token rewards (REINFORCE++'s returns, GAE). Formulas and costs: docs/methods/mc_step_values.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmrl.algos.advantages import ADVANTAGES, outcome_to_token_rewards, required, sequence_scores
from lmrl.algos.shapers import SHAPERS
from lmrl.stats import group_mean_std, group_slots


def step_advantages(values: Sequence[float]) -> list[float]:
    """The step advantages of one solution from the values V(s_0), …, V(s_m) of its step boundaries (the last:
    its outcome): A_j = V(s_j) − V(s_{j−1}) for the tokens of step j."""
    return [after - before for before, after in zip(values, values[1:])]


def group_means(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[B] the mean reward of each row's group (the row's own reward in a group of one)."""
    slot, counts = group_slots(group_index)
    return torch.zeros(len(counts)).index_add(0, slot, rewards.float())[slot] / counts[slot]


def mc_step_differences(rewards: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor,
                        mc_step_values: torch.Tensor, normalise: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """[B, T] V(s_j) − V(s_{j−1}) on each token of step j (`step_advantages` per token), 0 off the mask.

    `rewards` [B] are the rows' rewards (V(s_m)); `mc_step_values` [B, T, 3] is (j, V(s_{j−1}), V(s_j)) per
    token with NaN for V(s_0) (filled with the group's mean reward) and V(s_m) (the row's reward)."""
    rewards = rewards.float()
    before = torch.where(mc_step_values[..., 1].isnan(), group_means(rewards, group_index).unsqueeze(1),
                         mc_step_values[..., 1])
    after = torch.where(mc_step_values[..., 2].isnan(), rewards.unsqueeze(1), mc_step_values[..., 2])
    diff = (after - before) * mask
    if normalise:
        _, std = group_mean_std(rewards, group_index)
        diff = diff / (std + eps).unsqueeze(1)
    return diff


def step_last_tokens(mc_step_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] 1 at the last token of each step (where the next position holds another step or none), 0 elsewhere."""
    step = mc_step_values[..., 0] * (mask > 0)
    following = torch.cat([step[:, 1:], torch.zeros_like(step[:, :1])], dim=1)
    return ((step > 0) & (following != step)).float()


@ADVANTAGES.register("mc_step", "Monte-Carlo step values: V(s_j) - V(s_j-1) on step j's tokens, V from k value-only "
                     "continuations per step (VinePPO)", requires={"mc_step_values"}, group_relative=True,
                     group_local=True)
def mc_step(token_rewards, group_index, mask, mc_step_values=None, normalise: bool = False, eps: float = 1e-6, **_):
    """VinePPO's Monte-Carlo step advantage (module docstring; docs/methods/mc_step_values.md). Confidence: medium.

    Needs the `mc_steps` rollout controller's value-only continuations for step values; a batch without them
    gives every completion one step, A = r − group mean (divided by the group std with `normalise`)."""
    values = required("mc_step_values", mc_step_values)
    return mc_step_differences(sequence_scores(token_rewards), group_index, mask, values, normalise, eps)


@SHAPERS.register("mc_step_rewards", "Monte-Carlo step values as token rewards: V(s_j) - V(s_j-1) at step j's "
                  "last token instead of the outcome at the last", stage="token_rewards",
                  inputs={"mask", "group_index", "mc_step_values"})
def mc_step_rewards(token_rewards: torch.Tensor, inputs: dict[str, Any], normalise: bool = False, eps: float = 1e-6):
    """The outcome r (the row sum of the token rewards) leaves the last token and each step's end gets
    V(s_j) − V(s_{j−1}) (`mc_step_differences`): the row sum becomes r − V(s_0), a return with the group's
    baseline; other per-token terms stay where they are."""
    mask = inputs["mask"]
    rewards = sequence_scores(token_rewards)
    diff = mc_step_differences(rewards, inputs["group_index"], mask, inputs["mc_step_values"], normalise, eps)
    ends = step_last_tokens(inputs["mc_step_values"], mask)
    shaped = token_rewards - outcome_to_token_rewards(rewards, mask) + diff * ends
    return shaped, {"mc_step/steps_per_row": float(ends.sum() / max(mask.shape[0], 1))}
