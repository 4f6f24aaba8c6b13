"""REGEN: offline RL on recycled rollouts (yunjie-sysu/REGEN `regen_trainer.py`; docs/methods/regen.md).

ℓ = −A·ρ·log π_θ(y|x), log π summed over the completion's tokens (or averaged, `regen_length_normalize`),
batch mean over sequences. ρ = 1 for positive samples (A > 0); for negative ones
ρ = min(α, exp(min(log π_θ(y|x) − log μ(y|x), log cap))), detached, where μ is the policy that wrote the
rollout (its recorded behaviour log-probs, `rollout_logp`). Why: positives are imitated in full, while
negatives, which only push probability away, are down-weighted once the current policy has already
moved away from them, which keeps the offline update from diverging.
"""
from __future__ import annotations

import math

import torch

from lmrl.algos.aggregation import AGGREGATIONS, AggScale
from lmrl.algos.losses import LOSSES, LossInputs


@AGGREGATIONS.register("seq_mean_token_sum", "mean over sequences of each sequence's token sum (REGEN)")
def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, scale: AggScale) -> torch.Tensor:
    return (loss * mask).sum() / max(scale.num_seqs, 1.0)


def regen_weights(logp: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, alpha: float, cap: float,
                  length_normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (the capped sequence ratio π/μ, the negative samples' weight min(α, that ratio)); detached."""
    norm = mask.sum(1).clamp(min=1) if length_normalize else torch.ones(mask.shape[0], device=mask.device)
    log_ratio = ((logp.detach() - behaviour) * mask).sum(1) / norm
    ratio = torch.exp(log_ratio.clamp(max=math.log(cap)))
    return ratio, ratio.clamp(max=alpha)


@LOSSES.register("regen", "REGEN offline RL: -A·ρ·log π(y|x); ρ = 1 for A > 0, else min(α, π/μ) per sequence "
                 "(detached, μ = the recorded behaviour policy)", zero_at_zero_advantage=True, sequence_ratio=True,
                 default_aggregation="seq_mean_token_sum")
def regen(x: LossInputs, regen_alpha: float = 1.0, regen_ratio_cap: float = 10.0,
          regen_length_normalize: bool = False, **_):
    """Per token −A_t·ρ·log π_t (÷ length when normalised): with `seq_mean_token_sum` the batch mean of ℓ.

    Reads μ from `extras["rollout_logp"]` (the batch's behaviour log-probs; recorded ones for replayed
    rows), not `old_logp`, which is the proximal policy when a batch takes several optimiser steps.
    """
    if regen_alpha <= 0 or regen_ratio_cap <= 0:
        raise ValueError("regen needs regen_alpha > 0 and regen_ratio_cap > 0")
    behaviour = x.extras.get("rollout_logp", x.old_logp)
    ratio, weight = regen_weights(x.logp, behaviour, x.mask, regen_alpha, regen_ratio_cap, regen_length_normalize)
    negative = x.advantages <= 0
    rho = torch.where(negative, weight.unsqueeze(1), torch.ones_like(x.advantages))
    length = x.mask.sum(1, keepdim=True).clamp(min=1) if regen_length_normalize else 1.0
    loss = -x.advantages * rho * x.logp / length
    rows = x.mask.sum(1) > 0
    neg_rows = ((x.advantages < 0) & (x.mask > 0)).any(1)
    metrics = {"regen/ratio_mean": float(ratio[rows].mean()) if rows.any() else 1.0,
               "regen/negative_frac": float(neg_rows.sum() / rows.sum().clamp(min=1))}
    if neg_rows.any():
        metrics["regen/negative_weight"] = float(weight[neg_rows].mean())
        metrics["regen/capped_frac"] = float((ratio[neg_rows] > regen_alpha).float().mean())
    return loss, metrics
