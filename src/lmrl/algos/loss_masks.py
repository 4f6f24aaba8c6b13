"""Token masks of rejection losses, computed before the forward so that rejected tokens leave the loss mask.

A loss that rejects tokens (zero loss and gradient) may carry a `.token_mask(old_logp, rollout_logp,
mask, **knobs) -> keep [B,T] bool` depending only on quantities known before the update's forward
pass. With `algo.rejected_tokens="drop"` (the default, verl's behaviour: the rejection mask
multiplies `response_mask`) the Algorithm multiplies the aggregation mask by it, so rejected tokens
leave every denominator (token-mean, per-sequence means, the sequence count). The learner computes
the denominators of each mini-batch from this mask before any micro-batch runs, which keeps the
update exact under micro-batching. With `"keep"` rejected tokens stay in the denominators at zero loss.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lmrl.algos.losses import LOSSES
from lmrl.algos.losses_trust import SAFETY_BOUND, trm_keep_mask


def _rollout_log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor) -> torch.Tensor:
    return (old_logp - rollout_logp).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def trm_token_mask(old_logp, rollout_logp, mask, trm_criteria: str = "seq_max_k2",
                   trm_threshold: float | Sequence[float] = 2.5, **_) -> torch.Tensor:
    """The tokens `trust_region_masking` keeps: every criterion of `trm_criteria` ANDed."""
    criteria = [c.strip() for c in trm_criteria.split(",") if c.strip()]
    thresholds = ([float(trm_threshold)] * len(criteria) if isinstance(trm_threshold, (int, float))
                  else [float(t) for t in trm_threshold])
    if not criteria or len(thresholds) != len(criteria):
        raise ValueError(f"trm_threshold: give one value or one per criterion of {criteria}; got {trm_threshold!r}")
    log_ratio = _rollout_log_ratio(old_logp, rollout_logp)
    keep = torch.ones_like(mask, dtype=torch.bool)
    for criterion, threshold in zip(criteria, thresholds):
        keep &= trm_keep_mask(log_ratio, mask, criterion, threshold)
    return keep


def mis_seq_token_mask(old_logp, rollout_logp, mask, mis_seq_low: float = 0.5, mis_seq_high: float = 2.0,
                       mis_seq_agg: str = "sum", **_) -> torch.Tensor:
    """The tokens `ppo_clip_mis_seq` keeps: whole sequences whose rollout IS ratio lies in [lo, hi]."""
    total = ((old_logp - rollout_logp) * mask).sum(1)
    log_s = total if mis_seq_agg == "sum" else total / mask.sum(1).clamp(min=1)
    log_s = log_s.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    keep = (log_s >= math.log(mis_seq_low)) & (log_s <= math.log(mis_seq_high))
    return keep.unsqueeze(1).expand_as(mask)


def mis_token_token_mask(old_logp, rollout_logp, mask, mis_token_low: float = 0.5, mis_token_high: float = 5.0,
                         **_) -> torch.Tensor:
    """The tokens `ppo_clip_mis_token` keeps: lo <= π_old/π_rollout <= hi."""
    log_rho = _rollout_log_ratio(old_logp, rollout_logp)
    return (log_rho >= math.log(mis_token_low)) & (log_rho <= math.log(mis_token_high))


LOSSES.get("trust_region_masking").token_mask = trm_token_mask
LOSSES.get("ppo_clip_mis_seq").token_mask = mis_seq_token_mask
LOSSES.get("ppo_clip_mis_token").token_mask = mis_token_token_mask
