"""Policy losses: pure tensor functions from log-probs and advantages to a per-token loss.

Signature: `(LossInputs, **knobs) -> (per-token loss [B,T], metrics)`. Aggregation to a scalar is
a separate, independently chosen step (see `aggregation.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lmrl.algos.declarations import LossSpec
from lmrl.registry import Registry

LOSSES: Registry = Registry("policy loss", declares=LossSpec)


@dataclass
class LossInputs:
    """What a policy loss may read. Per-token tensors share the shape [B, T]."""

    logp: torch.Tensor  # current policy, carries the gradient
    old_logp: torch.Tensor  # behaviour / proximal policy, no gradient
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A ρ, -A clip(ρ)); with dual-clip c, min(that, -A c) where A < 0. Returns (loss, clipped)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).float()
    if dual_clip is not None:
        lower = -adv * dual_clip
        dual = (adv < 0) & (loss > lower)
        loss = torch.where(adv < 0, torch.minimum(loss, lower), loss)
        was_clipped = torch.where(dual, torch.ones_like(was_clipped), was_clipped)
    return loss, was_clipped


@LOSSES.register("ppo_clip", "PPO clipped surrogate with separate low/high epsilon and optional dual-clip")
def ppo_clip(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None, **_):
    log_ratio = (x.logp - x.old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss, clipped = clipped_surrogate(ratio, x.advantages, eps_low, eps_high, dual_clip)
    metrics = {"clip_frac": _masked_mean(clipped, x.mask), "ratio_mean": _masked_mean(ratio.detach(), x.mask)}
    return loss, metrics


@LOSSES.register("gspo", "GSPO: sequence-level geometric-mean importance ratio, clipped per sequence")
def gspo(x: LossInputs, eps_low: float = 3e-4, eps_high: float = 4e-4, **_):
    lengths = x.mask.sum(1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((x.logp - x.old_logp) * x.mask).sum(1, keepdim=True) / lengths
    log_s = seq_log_ratio.detach() + x.logp - x.logp.detach()
    ratio = torch.exp(log_s.clamp(max=10.0))
    loss, clipped = clipped_surrogate(ratio, x.advantages, eps_low, eps_high, None)
    metrics = {"clip_frac": _masked_mean(clipped, x.mask), "ratio_mean": _masked_mean(ratio.detach(), x.mask)}
    return loss, metrics


@LOSSES.register("pg", "plain policy gradient: -A ρ without clipping (REINFORCE when on-policy)")
def policy_gradient(x: LossInputs, **_):
    ratio = torch.exp((x.logp - x.old_logp).clamp(-20.0, 20.0))
    return -x.advantages * ratio, {"ratio_mean": _masked_mean(ratio.detach(), x.mask)}


def zero_at_zero_advantage(*losses) -> None:
    """Mark losses whose per-row value and gradient vanish when the row's advantages are all 0.

    Each row's loss must depend on that row only and be proportional to its advantages; the
    learner then skips such rows (a GRPO group with equal rewards costs no forward/backward).
    """
    for fn in losses:
        fn.zero_at_zero_advantage = True


zero_at_zero_advantage(ppo_clip, gspo, policy_gradient)
