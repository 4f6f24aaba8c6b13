"""Clipped-ratio policy losses: PPO clip, GSPO, plain policy gradient, HTPO, Policy Split.

Signature of every loss in `LOSSES`: `(LossInputs, **knobs) -> (per-token loss [B,T], metrics)`;
each knob keyword is named like the `AlgoConfig` field or `algo.loss_params` key that sets it.
Aggregation to a scalar is a separate, independently chosen step (`aggregation.py`). Each loss
declares at registration what it needs and guarantees (`declarations.py`). Formulas:
docs/methods/{ppo,gspo,htpo,policy_split}.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lmrl.algos.declarations import LossSpec
from lmrl.registry import Registry
from lmrl.stats import masked_mean

LOSSES: Registry = Registry("policy loss", declares=LossSpec)

SAFETY_BOUND = 20.0  # log-ratios are clamped to ±20 before exp, as in verl


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


def log_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """log(num/den) from log-probs, clamped to ±`SAFETY_BOUND`."""
    return (num - den).clamp(-SAFETY_BOUND, SAFETY_BOUND)


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


@LOSSES.register("ppo_clip", "PPO clipped surrogate with separate low/high epsilon and optional dual-clip",
                 zero_at_zero_advantage=True)
def ppo_clip(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None, **_):
    ratio = torch.exp(log_ratio(x.logp, x.old_logp))
    loss, clipped = clipped_surrogate(ratio, x.advantages, eps_low, eps_high, dual_clip)
    metrics = {"clip_frac": masked_mean(clipped, x.mask), "ratio_mean": masked_mean(ratio.detach(), x.mask)}
    return loss, metrics


@LOSSES.register("gspo", "GSPO: sequence-level geometric-mean importance ratio, clipped per sequence",
                 zero_at_zero_advantage=True, sequence_ratio=True, default_aggregation="seq_mean_token_mean")
def gspo(x: LossInputs, eps_low: float = 3e-4, eps_high: float = 4e-4, **_):
    """GSPO (docs/methods/gspo.md): one length-normalised ratio per sequence, so dual-clip does not apply."""
    lengths = x.mask.sum(1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((x.logp - x.old_logp) * x.mask).sum(1, keepdim=True) / lengths
    log_s = seq_log_ratio.detach() + x.logp - x.logp.detach()
    ratio = torch.exp(log_s.clamp(max=10.0))
    loss, clipped = clipped_surrogate(ratio, x.advantages, eps_low, eps_high, None)
    metrics = {"clip_frac": masked_mean(clipped, x.mask), "ratio_mean": masked_mean(ratio.detach(), x.mask)}
    return loss, metrics


@LOSSES.register("pg", "plain policy gradient: -A ρ without clipping (REINFORCE when on-policy)",
                 zero_at_zero_advantage=True)
def policy_gradient(x: LossInputs, **_):
    ratio = torch.exp(log_ratio(x.logp, x.old_logp))
    return -x.advantages * ratio, {"ratio_mean": masked_mean(ratio.detach(), x.mask)}


# --- HTPO --------------------------------------------------------------------------------------


def _kth(values: torch.Tensor, member: torch.Tensor, frac: float, largest: bool) -> torch.Tensor:
    """Per row, the k-th largest (or smallest) of `values` over `member`, k = max(⌊frac·n⌋, 1).

    Returns [B, 1]. A row with no members gets ∓inf, which selects nothing once ANDed with `member`.
    """
    n = member.sum(1, dtype=torch.float64)
    k = torch.floor(frac * n).clamp(min=1).long()
    fill = float("-inf") if largest else float("inf")
    ordered = values.masked_fill(~member, fill).sort(dim=1, descending=largest).values
    return ordered.gather(1, (k - 1).unsqueeze(1))


@LOSSES.register("htpo", "HTPO: difficulty x correctness x token-entropy cells, each with its own clip rule",
                 needs_entropy=True, zero_at_zero_advantage=True, default_aggregation="token_mean")
def htpo(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = 10.0,
         htpo_difficulty_threshold: float = 0.6, htpo_q1: float = 0.006, htpo_q2: float = 0.02,
         htpo_high_entropy_ratio: float = 0.2, **_):
    """HTPO (xcyao00/HTPO `compute_policy_loss_htpo`; docs/methods/htpo.md). Confidence: high (authors' code).

    What: per sequence, the top `htpo_high_entropy_ratio` of valid tokens by entropy (k = max(⌊0.2n⌋, 1),
    ties at the threshold included) are "high", the rest "low". A prompt is hard when its group
    accuracy is below `htpo_difficulty_threshold`. Low tokens get the standard clip everywhere. High
    tokens: hard ∧ correct: ρ > 1+ε_hi → +(1+ε_hi)·A·r_id, ρ < 1−ε_lo → +sg[1/ρ]·A·r_id, else −Aρ;
    wrong (hard or easy): ρ < 1−ε_lo → (1−ε_lo)·A·r_id, else −Aρ; easy ∧ correct: standard clip.
    r_id = exp(logp − sg[logp]) (value 1, gradient 1). Clip-outs: hard ∧ correct zeroes the low
    tokens strictly below the k'-th smallest low entropy, k' = max(⌊q1·n_low⌋, 1) (so k'−1 tokens, an
    off-by-one kept from the code); easy ∧ correct zeroes the top k' = max(⌊q2·n_high⌋, 1) high tokens.
    Dual-clip (A < 0) applies last, to every cell. The paper aggregates with token-mean.

    Why: HTPO balances exploration and exploitation by treating forking (high-entropy) tokens of
    correct vs wrong and hard vs easy samples differently. The positive signs in the hard ∧ correct
    branches push out-of-region high-entropy tokens of correct answers *down*; reproduced from the
    authors' code and flagged in docs/methods/htpo.md.

    Reads `x.entropy` (only to rank tokens), `x.extras["acc"]` and `x.extras["group_acc"]` ([B]).
    """
    if x.entropy is None:
        raise ValueError("htpo ranks tokens by entropy: LossInputs.entropy must be set")
    valid = x.mask > 0
    ent = x.entropy.detach()
    adv = x.advantages
    hard = (x.extras["group_acc"] < htpo_difficulty_threshold).unsqueeze(1)
    correct = (x.extras["acc"] > 0.5).unsqueeze(1)

    high = valid & (ent >= _kth(ent, valid, htpo_high_entropy_ratio, largest=True))
    low = valid & ~high
    zero_low = hard & correct & low & (ent < _kth(ent, low, htpo_q1, largest=False))
    zero_high = ~hard & correct & high & (ent >= _kth(ent, high, htpo_q2, largest=True))
    zeroed = zero_low | zero_high

    lr = log_ratio(x.logp, x.old_logp)
    ratio = torch.exp(lr)
    r_id = torch.exp(x.logp - x.logp.detach())
    unclipped = -adv * ratio
    standard, std_clipped = clipped_surrogate(ratio, adv, eps_low, eps_high, None)
    above, below = ratio > 1 + eps_high, ratio < 1 - eps_low

    inverse = torch.exp(-lr).detach()  # sg[π_old/π], clamped like ρ
    hard_correct = torch.where(above, (1 + eps_high) * r_id * adv,
                               torch.where(below, inverse * r_id * adv, unclipped))
    wrong = torch.where(below, (1 - eps_low) * r_id * adv, unclipped)
    high_loss = torch.where(correct, torch.where(hard, hard_correct, standard), wrong)
    loss = torch.where(high, high_loss, standard).masked_fill(zeroed, 0.0)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)

    special = torch.where(correct, hard & (above | below), below)
    clipped = torch.where(high & ~(correct & ~hard), special.float(), std_clipped)
    metrics = {
        "clip_frac": masked_mean(clipped, x.mask),
        "ratio_mean": masked_mean(ratio.detach(), x.mask),
        "htpo/hard_frac": float(hard.float().mean()),
        "htpo/high_entropy_frac": masked_mean(high.float(), x.mask),
        "htpo/zeroed_frac": masked_mean(zeroed.float(), x.mask),
    }
    return loss, metrics


# --- Policy Split ------------------------------------------------------------------------------


@LOSSES.register("policy_split", "Policy Split: PPO clip, plus an entropy bonus beta·H on high-entropy-mode rows",
                 requires={"prompt_variant"}, needs_entropy=True)
def policy_split(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                 split_beta: float = 0.01, **_):
    """Policy Split (arXiv 2604.11510; docs/methods/policy_split.md). Confidence: low — reconstructed from
    the abstract and summaries.

    What: one policy, two modes sharing one prompt group. The normal mode samples from π(·|x), the
    high-entropy mode from π(·|x ⊕ p_H) (`task.prompt_variants`, preset `policy_split`). Advantages are GRPO over the
    pooled 2G rewards (the advantage stage with both modes in one group; use `grpo`). Loss: PPO clip
    on every row, minus β·H_t (`split_beta`, exact token entropy) on high-entropy-mode rows. Why:
    the exploring mode keeps diversity while both modes learn from each other's samples.

    Reads the row field `prompt_variant` ([B]; > 0 marks high-entropy-mode rows: the loop's
    `task.prompt_variants` rollouts) and `LossInputs.entropy`.
    Chosen where the source is silent: the entropy-term form (rather than an entropy-preference
    reward), β = 0.01 from the method page's example (summaries warn that a large β destabilises).
    """
    if x.entropy is None:
        raise ValueError("policy_split adds an entropy term: LossInputs.entropy must be set")
    if "prompt_variant" not in x.extras:
        raise ValueError("policy_split needs extras['prompt_variant'] ([B], > 0 for high-entropy-mode rows)")
    mode = (x.extras["prompt_variant"] > 0).to(x.logp.dtype).unsqueeze(1)
    loss, metrics = ppo_clip(x, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    high_rows = (mode > 0.5).float().expand_as(x.mask) * x.mask
    metrics = {**metrics, "split/high_entropy_rows": float((mode > 0.5).float().mean()),
               "split/high_mode_entropy": float((x.entropy.detach() * high_rows).sum() / high_rows.sum().clamp(min=1))}
    return loss - split_beta * mode * x.entropy, metrics
