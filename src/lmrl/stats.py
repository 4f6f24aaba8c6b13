"""Reward statistics shared by the reward stage and the advantage estimators.

Group z-scores, SoftMin and DAPO's overlong penalty are used both to aggregate reward components
(`lmrl.rewards`) and to estimate advantages (`lmrl.algos`); they live here so that neither stage
imports the other's internals. Formulas: docs/methods/grpo.md (group normalisation),
docs/methods/gdpo.md and docs/methods/rvpo.md (per-component z-scores, SoftMin),
docs/methods/dapo.md (overlong penalty).
"""
from __future__ import annotations

import math

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of `x` over the positions where `mask` is set (0 when none is)."""
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def group_slots(group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot of each row's group [B], rows per group [G])."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return inverse, counts


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


def group_normalise(values: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """(v − group mean) / (group std + eps), with GRPO's singleton convention (mean 0, std 1)."""
    mean, std = group_mean_std(values, group_index)
    return (values - mean) / (std + eps)


def component_advantages(components: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """[B, K] per-reward group advantages A_{i,k} = (r_{i,k} − mean_g r_{·,k}) / (std_g + eps)."""
    components = components.float()
    return torch.stack([group_normalise(components[:, k], group_index, eps)
                        for k in range(components.shape[1])], dim=1)


def softmin_aggregate(adv: torch.Tensor, tau: float) -> torch.Tensor:
    """SoftMin over the last dim: −τ · log((1/K) Σ_k exp(−A_k/τ)), NaN components ignored.

    ≈ mean_k A_k − Var_k A_k / (2τ); τ → ∞ gives the mean, τ → 0 the minimum. All-NaN rows give 0.
    """
    present = torch.isfinite(adv)
    k = present.sum(dim=-1)
    z = torch.where(present, -adv / tau, -math.inf)
    out = -tau * (torch.logsumexp(z, dim=-1) - torch.log(k.clamp(min=1).to(adv.dtype)))
    return torch.where(k > 0, out, torch.zeros_like(out))


def overlong_fraction(lengths, max_len: int, buffer: int):
    """(L − (L_max − B)) / B: how far a length runs into the last B tokens of the budget L_max.

    ≤ 0 before the soft limit L_max − B, 1 at L_max. Takes an int or a tensor of lengths.
    """
    return (lengths - (max_len - buffer)) / buffer


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward: min(−(L − (L_max − B)) / B · factor, 0)."""
    return torch.clamp(-overlong_fraction(lengths.float(), max_len, buffer) * factor, max=0.0)
