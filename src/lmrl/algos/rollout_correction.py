"""Rollout-mismatch losses: truncated / masked importance sampling (TIS, MIS) and Trust Region Masking.

The inference engine samples from π_rollout ≠ π_train; these losses weigh the PPO clip by the
ratio π_old/π_rollout (`extras["rollout_logp"]`: the engine's log-probs of the sampled tokens), or
reject tokens and sequences where it strays. Formulas, sources and deviations:
docs/methods/rollout_correction.md and docs/methods/trust_region_masking.md.

A loss that rejects tokens declares a `token_mask(old_logp, rollout_logp, mask, **knobs) -> keep
[B,T] bool` that depends only on quantities known before the update's forward pass. With
`algo.rejected_tokens="drop"` (the default, verl's behaviour: the rejection mask multiplies
`response_mask`) the Algorithm multiplies the aggregation mask by it, so rejected tokens leave every
denominator (token-mean, per-sequence means, the sequence count); the learner builds each
mini-batch's denominators from that mask before any micro-batch runs, which keeps the update exact
under micro-batching. With `"keep"` rejected tokens stay in the denominators at zero loss.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lmrl.algos.losses import LOSSES, SAFETY_BOUND, LossInputs, log_ratio, ppo_clip
from lmrl.stats import masked_mean


def _seq_frac(rejected_rows: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of the sequences with at least one valid token that `rejected_rows` [B] marks."""
    has_tokens = mask.sum(1) > 0
    return float((rejected_rows & has_tokens).sum() / has_tokens.sum().clamp(min=1))


def sequence_log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       agg: str = "sum") -> torch.Tensor:
    """[B] log(π_old(y)/π_rollout(y)): the token log-ratios summed over each sequence's valid tokens
    (`agg="sum"`) or averaged (`"mean"`, the log of the geometric-mean ratio), clamped to ±20."""
    if agg not in ("sum", "mean"):
        raise ValueError(f"mis_seq_agg must be 'sum' or 'mean', got {agg!r}")
    total = ((old_logp - rollout_logp) * mask).sum(1)
    log_s = total if agg == "sum" else total / mask.sum(1).clamp(min=1)
    return log_s.clamp(-SAFETY_BOUND, SAFETY_BOUND)


def _weighted_ppo(x: LossInputs, weight: torch.Tensor, extra: dict[str, float], eps_low: float,
                  eps_high: float, dual_clip: float | None):
    loss, metrics = ppo_clip(x, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    return loss * weight.detach(), {**metrics, **extra}


@LOSSES.register("ppo_clip_tis", "PPO clip x truncated IS weight min(π_old/π_rollout, C) (rollout mismatch)",
                 zero_at_zero_advantage=True)
def ppo_clip_tis(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                 tis_cap: float = 2.0, **_):
    """Token-level truncated importance sampling (TIS; verl `rollout_is="token"`). Confidence: high.

    What: ℓ = w·ℓ_ppo with w = min(exp(logp_old − logp_roll), C), a constant (no gradient). Why: the
    inference engine samples from π_roll ≠ π_train (kernels, precision); w re-weights the tokens
    towards π_train and the cap C bounds the variance (biased, low variance).
    """
    rho = torch.exp(log_ratio(x.old_logp, x.extras["rollout_logp"]))
    weight = rho.clamp(max=tis_cap)
    extra = {"is_weight_mean": masked_mean(weight, x.mask),
             "is_truncated_frac": masked_mean((rho > tis_cap).float(), x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


def _mis_token_keep(log_rho: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return (log_rho >= math.log(low)) & (log_rho <= math.log(high))


def mis_token_token_mask(old_logp, rollout_logp, mask, mis_token_low: float = 0.5, mis_token_high: float = 5.0,
                         **_) -> torch.Tensor:
    """The tokens `ppo_clip_mis_token` keeps: lo <= π_old/π_rollout <= hi."""
    return _mis_token_keep(log_ratio(old_logp, rollout_logp), mis_token_low, mis_token_high)


@LOSSES.register("ppo_clip_mis_token", "PPO clip x token rollout IS weight, zeroed outside [lo, hi] (IcePop)",
                 token_mask=mis_token_token_mask, zero_at_zero_advantage=True)
def ppo_clip_mis_token(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                       dual_clip: float | None = None, mis_token_low: float = 0.5,
                       mis_token_high: float = 5.0, **_):
    """Token-level masked importance sampling (verl IcePop, `rollout_is_threshold="lo_hi"`). Confidence: high.

    What: ρ = exp(logp_old − logp_roll); w = ρ where lo ≤ ρ ≤ hi, else 0, so tokens the engine sampled
    far from π_train are masked out and the others are IS-corrected. Why: a cap (TIS) still trains
    on the worst-mismatched tokens at weight C; masking drops them from the update instead.
    """
    log_rho = log_ratio(x.old_logp, x.extras["rollout_logp"])
    keep = _mis_token_keep(log_rho, mis_token_low, mis_token_high)
    weight = torch.exp(log_rho) * keep
    extra = {"is_weight_mean": masked_mean(weight, x.mask),
             "masked_frac": masked_mean((~keep).float(), x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


def _mis_seq_keep(log_s: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return (log_s >= math.log(low)) & (log_s <= math.log(high))


def mis_seq_token_mask(old_logp, rollout_logp, mask, mis_seq_low: float = 0.5, mis_seq_high: float = 2.0,
                       mis_seq_agg: str = "sum", **_) -> torch.Tensor:
    """The tokens `ppo_clip_mis_seq` keeps: whole sequences whose rollout IS ratio lies in [lo, hi]."""
    keep = _mis_seq_keep(sequence_log_ratio(old_logp, rollout_logp, mask, mis_seq_agg), mis_seq_low, mis_seq_high)
    return keep.unsqueeze(1).expand_as(mask)


def _mis_seq_is_weight(knobs: dict[str, Any]) -> bool:
    """Seq-MIS weighs kept rows by the sequence ratio only with `mis_seq_agg="sum"` ("mean" only filters)."""
    return knobs.get("mis_seq_agg", "sum") == "sum"


@LOSSES.register("ppo_clip_mis_seq", "PPO clip, sequences masked when the rollout IS ratio is out of bounds",
                 token_mask=mis_seq_token_mask, zero_at_zero_advantage=True, sequence_is=True,
                 sequence_is_when=_mis_seq_is_weight)
def ppo_clip_mis_seq(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                     dual_clip: float | None = None, mis_seq_low: float = 0.5, mis_seq_high: float = 2.0,
                     mis_seq_agg: str = "sum", **_):
    """Sequence-level masked IS / rejection (verl `seq_sum_k1` / `seq_mean_k1`). Confidence: high.

    What: L_i = Σ_t (logp_old − logp_roll) over valid tokens (`mis_seq_agg="sum"`) or its mean
    (`"mean"`, the geometric-mean ratio); s_i = exp(L_i), clamped to e^±20. Sequence i is rejected
    (all its tokens weigh 0) unless lo ≤ s_i ≤ hi. Kept sequences weigh s_i in "sum" mode (Seq-MIS:
    s_i is the sequence's IS ratio, so other policies' completions can be weighed) and 1 in "mean"
    mode (Geo-RS: the geometric mean is only a length-normalised filter, not an IS weight). Why:
    token corrections cannot bound a sequence-level mismatch that accumulates over many slightly-off
    tokens.
    """
    log_s = sequence_log_ratio(x.old_logp, x.extras["rollout_logp"], x.mask, mis_seq_agg)
    keep = _mis_seq_keep(log_s, mis_seq_low, mis_seq_high)
    seq_weight = torch.exp(log_s) if mis_seq_agg == "sum" else torch.ones_like(log_s)
    weight = (seq_weight * keep).unsqueeze(1).expand_as(x.mask)
    extra = {"is_weight_mean": masked_mean(weight, x.mask),
             "masked_frac": masked_mean((~keep).float().unsqueeze(1).expand_as(x.mask), x.mask),
             "seq_masked_frac": _seq_frac(~keep, x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


@LOSSES.register("ppo_clip_tis_seq", "PPO clip x sequence IS weight min(π_old(y)/π_rollout(y), C) (Mutual RL's PRP)",
                 sequence_is=True)
def ppo_clip_tis_seq(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                     tis_seq_cap: float = 2.0, **_):
    """Sequence-level truncated importance sampling (verl `rollout_is="sequence"`). Confidence: high.

    What: s_i = exp(Σ_t (logp_old − logp_roll)) over valid tokens (clamped to e^±20) and every token
    of sequence i weighs w_i = min(s_i, C), a constant. Why: the one rollout correction that needs
    only a sequence's total behaviour log-prob, so it also weights completions written by another
    policy with another tokenizer (Mutual RL's PRP: w = π_self(y)/π_peer(y), truncated;
    `data.demonstrations: peers`), where per-token ratios do not exist.
    """
    s = torch.exp(sequence_log_ratio(x.old_logp, x.extras["rollout_logp"], x.mask))
    weight = s.clamp(max=tis_seq_cap).unsqueeze(1).expand_as(x.mask)
    extra = {"is_weight_mean": masked_mean(weight, x.mask), "seq_truncated_frac": _seq_frac(s > tis_seq_cap, x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


# --- Trust Region Masking -----------------------------------------------------------------------

_TRM_REDUCTIONS = ("token", "seq_sum", "seq_mean", "seq_max")


def trm_keep_mask(log_ratio: torch.Tensor, mask: torch.Tensor, criterion: str,
                  threshold: float) -> torch.Tensor:
    """Tokens kept by one TRM criterion, e.g. "seq_max_k2" (verl `compute_rollout_rejection_mask`).

    Estimators per token of lr = log(π_train/π_roll): k1 = −lr, k2 = ½lr², k3 = e^lr − 1 − lr. k1
    criteria keep the ratio in [1/u, u] (u = threshold); k2/k3 criteria keep the statistic ≤ δ.
    """
    reduction, _, estimator = criterion.rpartition("_")
    if reduction not in _TRM_REDUCTIONS or estimator not in ("k1", "k2", "k3") or criterion == "seq_max_k1":
        raise ValueError(f"unknown TRM criterion {criterion!r}: use token|seq_sum|seq_mean|seq_max "
                         "with _k1|_k2|_k3 (seq_max takes k2 or k3)")
    if estimator == "k1":
        stat = -log_ratio
    elif estimator == "k2":
        stat = 0.5 * log_ratio ** 2
    else:
        stat = torch.expm1(log_ratio) - log_ratio
    if reduction == "seq_sum":
        stat = (stat * mask).sum(1, keepdim=True)
    elif reduction == "seq_mean":
        stat = (stat * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    elif reduction == "seq_max":
        stat = stat.masked_fill(mask <= 0, float("-inf")).amax(1, keepdim=True).clamp(min=0.0)
    if estimator == "k1":
        bound = math.log(threshold)
        keep = (stat >= -bound) & (stat <= bound)
    else:
        keep = stat <= threshold
    return keep.expand_as(mask)


def trm_token_mask(old_logp, rollout_logp, mask, trm_criteria: str = "seq_max_k2",
                   trm_threshold: float | Sequence[float] = 2.5, **_) -> torch.Tensor:
    """The tokens `trust_region_masking` keeps: every criterion of `trm_criteria` ANDed."""
    criteria = [c.strip() for c in trm_criteria.split(",") if c.strip()]
    thresholds = ([float(trm_threshold)] * len(criteria) if isinstance(trm_threshold, (int, float))
                  else [float(t) for t in trm_threshold])
    if not criteria or len(thresholds) != len(criteria):
        raise ValueError(f"trm_threshold: give one value or one per criterion of {criteria}; got {trm_threshold!r}")
    lr = log_ratio(old_logp, rollout_logp)
    keep = torch.ones_like(mask, dtype=torch.bool)
    for criterion, threshold in zip(criteria, thresholds):
        keep &= trm_keep_mask(lr, mask, criterion, threshold)
    return keep


@LOSSES.register("trust_region_masking", "TRM: PPO clip, sequences masked when a token strays > δ",
                 token_mask=trm_token_mask, zero_at_zero_advantage=True)
def trust_region_masking(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                         dual_clip: float | None = None, trm_criteria: str = "seq_max_k2",
                         trm_threshold: float | Sequence[float] = 2.5, **_):
    """Trust Region Masking (arXiv 2512.23075; verl PR #4544; docs/methods/trust_region_masking.md).
    Confidence: high.

    What: lr_t = clamp(logp_old − logp_roll, ±20). TRM-max keeps sequence i iff max_t k(lr_t) ≤ δ
    (`seq_max_k2` / `seq_max_k3`); `trm_criteria` may name any verl criterion (token_*, seq_sum_*,
    seq_mean_*, seq_max_*), comma-chained with AND; `trm_threshold` is one value for all or one per
    criterion. Rejected tokens get zero loss and zero gradient. Why: the sequence-level divergence
    that bounds the off-policy error is not controlled by per-token clipping; masking the sequences
    whose worst token diverges restores the trust region.
    """
    keep = trm_token_mask(x.old_logp, x.extras["rollout_logp"], x.mask, trm_criteria, trm_threshold)
    valid = x.mask > 0
    extra = {"masked_frac": masked_mean((~keep).float(), x.mask),
             "seq_masked_frac": _seq_frac((~keep & valid).any(1), x.mask)}
    return _weighted_ppo(x, keep.float(), extra, eps_low, eps_high, dual_clip)
