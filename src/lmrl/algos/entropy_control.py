"""Advantage estimators that steer the policy's entropy: Entrocraft (a scheduled band), GEPO (group entropy history).

Entrocraft picks the sign mix of the advantage from the batch entropy against a band that moves
over training. GEPO damps a base estimator's advantages in groups whose entropy is far from the
history of group entropies, which its state `GepoHistory` keeps between steps (`algos/state.py`).
Formulas and deviations: docs/methods/entrocraft.md and docs/methods/gepo.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from lmrl.algos.advantages import ADVANTAGES, required, sequence_scores, to_tokens
from lmrl.stats import group_normalise, group_slots

# --- Entrocraft --------------------------------------------------------------------------------


def entropy_bounds(step: float, total_steps: float, lo: Sequence[float] = (0.6, 0.4),
                   hi: Sequence[float] = (0.7, 0.5), schedule: str = "linear") -> tuple[float, float]:
    """Entropy band [lo(s), hi(s)] moving from (lo[0], hi[0]) to (lo[1], hi[1]) over training."""
    frac = min(max(step / total_steps, 0.0), 1.0)
    if schedule == "cosine":
        frac = 0.5 * (1 - math.cos(math.pi * frac))
    elif schedule != "linear":
        raise ValueError(f"unknown entropy schedule {schedule!r} (linear | cosine)")
    return lo[0] + (lo[1] - lo[0]) * frac, hi[0] + (hi[1] - hi[0]) * frac


def entrocraft_mode(entropy: float, step: float, total_steps: float, **bounds) -> str:
    """'raft++' above the band (drop negatives), 'nsr' below it (drop positives), else 'grpo'."""
    low, high = entropy_bounds(step, total_steps, **bounds)
    entropy = float(entropy)
    return "raft++" if entropy > high else "nsr" if entropy < low else "grpo"


@ADVANTAGES.register("entrocraft", "Entrocraft: RAFT++ / NSR / GRPO by batch entropy vs a scheduled band",
                     requires={"entropy", "step", "total_steps"}, group_relative=True)
def entrocraft(token_rewards, group_index, mask, entropy=None, step=None, total_steps=None,
               lo: Sequence[float] = (0.6, 0.4), hi: Sequence[float] = (0.7, 0.5), schedule: str = "linear",
               binary_to_signed: bool = False, eps: float = 1e-6, **_):
    """Entrocraft `grpo_range_linear` (lblaoke/entrocraft; docs/methods/entrocraft.md) — confidence high for
    the released controller.

    Steers policy entropy along a schedule by choosing the advantage's sign mix: above hi(s) use
    RAFT++ A = max(r, 0) (rejecting negatives lowers entropy); below lo(s) use NSR A = min(r, 0)
    (rejecting positives raises it); inside the band plain GRPO. RAFT++/NSR use the raw reward,
    which must be signed (±1); `binary_to_signed` maps 0/1 rewards to −1/+1 first.
    """
    required("entropy", entropy)
    mode = entrocraft_mode(entropy, required("step", step), required("total_steps", total_steps),
                           lo=lo, hi=hi, schedule=schedule)
    scores = sequence_scores(token_rewards)
    if binary_to_signed:
        scores = 2 * scores - 1
    if mode == "raft++":
        adv = scores.clamp(min=0)
    elif mode == "nsr":
        adv = scores.clamp(max=0)
    else:
        adv = group_normalise(scores, group_index, eps)
    return to_tokens(adv, mask)


# --- GEPO --------------------------------------------------------------------------------------


def _per_group_token_mean(values: torch.Tensor, group_index: torch.Tensor,
                          mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean of `values` [B,T] over each group's valid tokens [G], slot of each row's group [B])."""
    inverse, counts = group_slots(group_index)
    mask = mask.to(values.dtype)
    sums = torch.zeros(len(counts), dtype=values.dtype).index_add_(0, inverse, (values * mask).sum(1))
    tokens = torch.zeros(len(counts), dtype=values.dtype).index_add_(0, inverse, mask.sum(1))
    return sums / tokens.clamp(min=1), inverse


def group_token_mean(values: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, the mean of `values` [B,T] over every valid token of the row's group ([B])."""
    per_group, inverse = _per_group_token_mean(values, group_index, mask)
    return per_group[inverse]


def gepo_shape(advantages: torch.Tensor, group_entropy: torch.Tensor, entropy_mean: float, entropy_std: float,
               kappa: float = 1.0, alpha: float = 0.5) -> torch.Tensor:
    """A ← α·A where (H_g < μ − κσ and A > 0) or (H_g > μ + κσ and A < 0); unchanged elsewhere.

    `advantages` [B] or [B,T]; `group_entropy` [B] (each row's group entropy H_g).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"GEPO alpha must lie in (0, 1), got {alpha}")
    h = group_entropy.reshape(-1, *([1] * (advantages.dim() - 1)))
    low = h < entropy_mean - kappa * entropy_std
    high = h > entropy_mean + kappa * entropy_std
    damp = (low & (advantages > 0)) | (high & (advantages < 0))
    return torch.where(damp, alpha * advantages, advantages)


@dataclass
class GroupEntropyStats:
    """Exponentially weighted mean and std of past group entropies, one decay step per batch.

    Per step: read `mean` / `std` for the thresholds, then `update(this batch's group entropies)`.
    Sums S₀ = Σw, S₁ = Σw·h, S₂ = Σw·h² decay by d per batch, and every group of a batch has weight
    1; mean = S₁/S₀, var = S₂/S₀ − mean². Normalising by S₀ makes the history unbiased from the
    first batch on (no drift from a zero or single-group start).
    """

    decay: float = 0.9
    weight: float = 0.0
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None

    @property
    def std(self) -> float:
        if self.weight <= 0:
            return 0.0
        return max(self.total_sq / self.weight - self.mean ** 2, 0.0) ** 0.5

    def update(self, group_entropies: torch.Tensor) -> None:
        h = torch.as_tensor(group_entropies, dtype=torch.float64).flatten()
        self.weight = self.decay * self.weight + h.numel()
        self.total = self.decay * self.total + float(h.sum())
        self.total_sq = self.decay * self.total_sq + float((h * h).sum())

    def state_dict(self) -> dict[str, float]:
        return {"weight": self.weight, "total": self.total, "total_sq": self.total_sq}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.weight, self.total, self.total_sq = (float(state[k]) for k in ("weight", "total", "total_sq"))


class GepoHistory:
    """GEPO's μ_H, σ_H: an exponentially weighted history of group entropies (`GroupEntropyStats`).

    Before each batch's advantages: the history so far becomes the thresholds' `entropy_mean` /
    `entropy_std` (none on the first batch: GEPO then uses this batch's own statistics), then this
    batch's group entropies join the history. Knob `entropy_decay` (0.9 per batch).
    """

    knobs = ("entropy_decay",)

    def __init__(self, entropy_decay: float = 0.9, **_):
        if not 0 <= entropy_decay < 1:
            raise ValueError(f"entropy_decay must be in [0, 1), got {entropy_decay}")
        self.stats = GroupEntropyStats(decay=entropy_decay)

    def before_prepare(self, batch) -> None:
        if self.stats.mean is not None:
            batch.context.update(entropy_mean=self.stats.mean, entropy_std=self.stats.std)
        per_group, _ = _per_group_token_mean(batch.extras["token_entropy"], batch.group_index, batch.completion_mask)
        self.stats.update(per_group)

    def after_update(self, batch, metrics: dict[str, float]) -> dict[str, float]:
        return {"gepo/entropy_mean": self.stats.mean, "gepo/entropy_std": self.stats.std}

    def state_dict(self) -> dict:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state)


@ADVANTAGES.register("gepo", "GEPO: base advantage damped by alpha where the group entropy leaves mu ± kappa·sigma",
                     requires={"token_entropy"}, state=GepoHistory, group_relative=True)
def gepo(token_rewards, group_index, mask, token_entropy=None, entropy_mean: float | None = None,
         entropy_std: float | None = None, kappa: float = 1.0, alpha: float = 0.5, base: str = "grpo", **knobs):
    """GEPO, group entropy-controlled PO (docs/methods/gepo.md). Confidence: low — reconstructed from the abstract.

    What: H_g = mean token entropy over all valid tokens of the group's responses (`token_entropy`
    [B,T]; the sampled tokens' −logp is an unbiased Monte-Carlo stand-in). With history statistics
    μ_H, σ_H (`entropy_mean`, `entropy_std`, e.g. from `GroupEntropyStats`), τ_lo = μ − κσ and
    τ_hi = μ + κσ: a group below τ_lo has its positive advantages scaled by α (less
    over-exploitation); a group above τ_hi has its negative advantages scaled by α (exploration
    kept). Applied after the `base` estimator (GRPO by default; remaining knobs go to it). Why:
    mixtures of heterogeneous tasks sit at very different entropy levels.

    Chosen where the abstract is silent: token-weighted H_g; without history statistics, μ and σ
    (unbiased) are those of this batch's group entropies; κ = 1 and α = 0.5 from the method page's
    example.
    """
    if base == "gepo":
        raise ValueError("gepo needs a different base estimator")
    entropy = required("token_entropy", token_entropy).to(token_rewards.dtype)
    per_group, inverse = _per_group_token_mean(entropy, group_index, mask)
    if entropy_mean is None or entropy_std is None:
        entropy_mean = float(per_group.mean())
        entropy_std = float(per_group.std()) if per_group.numel() > 1 else 0.0
    adv = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    return gepo_shape(adv, per_group[inverse], entropy_mean, entropy_std, kappa, alpha) * mask
