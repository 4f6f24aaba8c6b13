"""Advantage estimators: pure tensor functions from rewards to per-token advantages.

Signature: `(token_rewards [B,T], group_index [B], mask [B,T], **knobs) -> advantages [B,T]`.
`token_rewards` holds the outcome reward at each sequence's last generated token (plus any
per-token terms such as a KL penalty folded into the reward); group estimators use its row sum.
"""
from __future__ import annotations

import torch

from lmrl.algos.declarations import AdvantageSpec
from lmrl.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator", declares=AdvantageSpec)


def outcome_to_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward on its last valid token."""
    token_rewards = torch.zeros_like(mask, dtype=torch.float)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)
    token_rewards[rows, last[rows]] = rewards[rows].float()
    return token_rewards


def group_mean_std(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of the row's group; singleton groups get mean 0, std 1."""
    groups, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(groups), dtype=values.dtype).index_add_(0, inverse, values)
    means = sums / counts
    sq = torch.zeros(len(groups), dtype=values.dtype).index_add_(0, inverse, (values - means[inverse]) ** 2)
    stds = torch.sqrt(sq / (counts - 1).clamp(min=1))
    single = counts == 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    return means[inverse], stds[inverse]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten over all valid tokens of the batch with the unbiased variance."""
    valid = values[mask > 0]
    mean = valid.mean()
    var = valid.var(unbiased=True) if valid.numel() > 1 else torch.zeros((), dtype=values.dtype)
    return (values - mean) * torch.rsqrt(var + eps) * mask


@ADVANTAGES.register("grpo", "GRPO: (r - group mean) / (group std + eps), broadcast to tokens")
def grpo(token_rewards, group_index, mask, eps: float = 1e-6, norm_by_std: bool = True, **_):
    scores = token_rewards.sum(dim=1)
    mean, std = group_mean_std(scores, group_index)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return adv.unsqueeze(1) * mask


@ADVANTAGES.register("dr_grpo", "Dr.GRPO: r - group mean, no std normalisation")
def dr_grpo(token_rewards, group_index, mask, **_):
    return grpo(token_rewards, group_index, mask, norm_by_std=False)


@ADVANTAGES.register("rloo", "RLOO: r_i minus the mean of the other samples of its group")
def rloo(token_rewards, group_index, mask, **_):
    scores = token_rewards.sum(dim=1)
    mean, _ = group_mean_std(scores, group_index)
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n = counts[inverse].float()
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return (factor * (scores - mean)).unsqueeze(1) * mask


@ADVANTAGES.register("reinforce_pp", "REINFORCE++: discounted return-to-go, whitened over the batch's tokens")
def reinforce_pp(token_rewards, group_index, mask, gamma: float = 1.0, **_):
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running * mask[:, t]
        returns[:, t] = running
    return masked_whiten(returns * mask, mask)


@ADVANTAGES.register(
    "reinforce_pp_baseline", "REINFORCE++ with a group-mean baseline, whitened over the batch's tokens"
)
def reinforce_pp_baseline(token_rewards, group_index, mask, **_):
    scores = token_rewards.sum(dim=1)
    mean, _ = group_mean_std(scores, group_index)
    return masked_whiten((scores - mean).unsqueeze(1) * mask, mask)
