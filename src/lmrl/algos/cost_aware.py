"""Cost-Aware GRPO: a sampler between the advantage and the loss that spends the update where it pays.

Not an estimator: after the advantages are known, `Algorithm` draws rows with probability ∝ |A_i|/√L_i
and reweights the drawn ones so the loss stays unbiased (the `cost_aware` shaper). Formula and
deviations: docs/methods/cost_aware_grpo.md.
"""
from __future__ import annotations

import torch


def cost_aware_probs(advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """p_i ∝ |A_i| / √L_i (gradient-norm proxy over the square root of the cost); zeros if all A = 0."""
    score = advantages.abs().float() / lengths.float().clamp(min=1).sqrt()
    total = score.sum()
    return score / total if total > 0 else torch.zeros_like(score)


def cost_aware_weights(advantages_per_seq: torch.Tensor, lengths: torch.Tensor, num_draws: int,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cost-Aware GRPO (arXiv 2604.28020) — confidence low-medium (distribution derived from the stated principle).

    Spends the update on responses with a high expected gradient per token: draw `num_draws`
    responses with replacement from `cost_aware_probs`, and return (selected [N] bool, weights [N])
    with w_i = count_i / (num_draws · p_i), 0 where not drawn. Σ_i w_i ℓ_i is then an unbiased
    estimate of Σ_i ℓ_i, so multiply each selected response's loss by w_i and keep the full batch's
    normaliser (row count or token count). With num_draws = N and single draws w_i = 1/(N p_i).
    """
    probs = cost_aware_probs(advantages_per_seq, lengths)
    if probs.sum() == 0 or num_draws <= 0:
        return torch.zeros_like(probs, dtype=torch.bool), torch.zeros_like(probs)
    draws = torch.multinomial(probs, num_draws, replacement=True, generator=generator)
    counts = torch.bincount(draws, minlength=len(probs)).to(probs.dtype)
    selected = counts > 0
    weights = torch.where(selected, counts / (num_draws * probs.clamp(min=1e-30)), torch.zeros_like(probs))
    return selected, weights
