"""Losses that bound the update without PPO's hard cut-off: CISPO, SAPO, GFT, Output Reset.

The PPO clip zeroes a token's whole gradient once its ratio leaves [1−ε, 1+ε]. These losses keep a
gradient everywhere and bound its size instead: CISPO clips only the detached importance weight,
SAPO gates the ratio with a smooth sigmoid, GFT caps supervised fine-tuning's 1/π weight at 1/τ, and
Output Reset lets a squared residual saturate once the log-ratio has crossed a margin. Formulas and
deviations: docs/methods/{cispo,sapo,gft,output_reset}.md.
"""
from __future__ import annotations

import torch

from lmrl.algos.losses import LOSSES, LossInputs, log_ratio
from lmrl.stats import masked_mean


@LOSSES.register("cispo", "CISPO: -sg[clip(ρ)]·A·logp, clipped IS weight, every token keeps a gradient",
                 zero_at_zero_advantage=True, default_aggregation="token_mean")
def cispo(x: LossInputs, eps_low: float = 1.0, eps_high: float = 0.28, **_):
    """CISPO (MiniMax-M1, arXiv 2506.13585; verl `compute_policy_loss_cispo`). Confidence: medium.

    What: ℓ = −sg[clip(ρ, 1−ε_lo, 1+ε_hi)]·A·logp. Why: the PPO clip zeroes the gradient of clipped
    tokens, which are often the rare "reflective" tokens; CISPO clips only the IS weight, so every
    token keeps the REINFORCE gradient −w·A·∇logp. MiniMax tunes only ε_hi and sets no lower bound
    (ε_lo large); ε_lo ≥ 1 means no lower clip since ρ > 0. The loss value is not comparable to
    ppo_clip's (it contains logp); only its gradient matters. The paper normalises per token
    (token-mean).
    """
    ratio = torch.exp(log_ratio(x.logp, x.old_logp)).detach()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * x.advantages * x.logp
    metrics = {"clip_frac": masked_mean((weight != ratio).float(), x.mask),
               "ratio_mean": masked_mean(ratio, x.mask)}
    return loss, metrics


@LOSSES.register("sapo", "SAPO: smooth sigmoid gate (4/τ)σ(τ(ρ-1)) instead of the hard clip, τ by sign of A",
                 zero_at_zero_advantage=True)
def sapo(x: LossInputs, sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05, **_):
    """SAPO (Qwen, arXiv 2511.20347; verl `compute_policy_loss_sapo`). Confidence: medium.

    What: ℓ = −A·f(ρ), f(ρ) = (4/τ)·σ(τ(ρ−1)), τ = τ_pos where A > 0 else τ_neg. Why: a hard clip
    drops the whole gradient of a token once ρ leaves the band; here dℓ/dlogp = −A·4σ(1−σ)·ρ, which
    is −A at ρ = 1 (as for the unclipped surrogate) and decays smoothly as ρ moves away, more
    sharply for negative advantages (τ_neg > τ_pos). The aggregation stays the run's choice (verl
    forces sequence-mean; docs/methods/sapo.md).
    """
    ratio = torch.exp(log_ratio(x.logp, x.old_logp))
    tau = torch.full_like(x.advantages, sapo_tau_neg).masked_fill(x.advantages > 0, sapo_tau_pos)
    sig = torch.sigmoid(tau * (ratio - 1.0))
    loss = -x.advantages * sig * (4.0 / tau)
    gate_slope = (4.0 * sig * (1.0 - sig)).detach()
    metrics = {"ratio_mean": masked_mean(ratio.detach(), x.mask),
               "sapo/gate_slope_mean": masked_mean(gate_slope, x.mask)}
    return loss, metrics


def gft_coefficients(probs: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """coef = π / max(π, τ) = min(1, π/τ): the weight on ∇π becomes min(1/π, 1/τ)."""
    return probs / torch.maximum(probs, torch.as_tensor(tau, dtype=probs.dtype))


GFT_BATCH_TAU = "gft_batch_tau"  # the `extras` key of the whole batch's quantile τ


def gft_batch_tau(rollout_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, gft_tau: float = 0.1,
                  gft_tau_quantile: float | None = None, **_) -> dict[str, float]:
    """τ = the q-quantile of the sampling policy's π over the whole batch's valid tokens with A ≠ 0.

    Computed once per prepared batch (`LossSpec.batch_statistics`), so every micro-batch divides by
    the same τ; `gft_tau` when no token carries an advantage.
    """
    if gft_tau_quantile is None or not 0 <= gft_tau_quantile <= 1:
        raise ValueError(f"gft_tau_quantile must lie in [0, 1], got {gft_tau_quantile}")
    live = rollout_logp.detach()[(mask > 0) & (advantages != 0)]
    return {GFT_BATCH_TAU: float(torch.quantile(live.exp().float(), gft_tau_quantile)) if live.numel() else gft_tau}


@LOSSES.register("gft", "GFT: -sg(pi/max(pi, tau))·A·logp, the policy gradient with the 1/pi weight capped at 1/tau",
                 zero_at_zero_advantage=True,  # row-local (τ counts only tokens with A ≠ 0) and zero where A = 0
                 batch_statistics=gft_batch_tau,
                 batch_statistics_when=lambda knobs: knobs.get("gft_tau_quantile") is not None)
def gft(x: LossInputs, gft_tau: float = 0.1, gft_tau_quantile: float | None = None, **_):
    """GFT, Group Fine-Tuning (arXiv 2604.14258; docs/methods/gft.md). Confidence: low — reconstructed
    from the abstract.

    What: SFT is a policy gradient with reward 1 on the demonstration, whose gradient (1/π)∇π
    explodes on unlikely tokens. Dynamic Coefficient Rectification replaces the weight by
    min(1/π, 1/τ): ℓ_t = −sg[π_t/max(π_t, τ)]·A_t·logp_t. Group Advantage Learning gives A: GRPO
    (the method page's example) or `rloo` (the "unbiased" leave-one-out reading) over a group of the
    demonstration plus samples — the demonstration row needs a rollout change; on model samples
    alone this is the rectified policy gradient.

    τ: the fixed `gft_tau` (0.1, from the method page's example), or, with `gft_tau_quantile` = q,
    the whole batch's quantile from `gft_batch_tau`, read from `extras` (the Algorithm puts it there
    when it prepares the batch). The coefficient has no gradient and no importance ratio (on-policy,
    as SFT).
    """
    probs = torch.exp(x.logp.detach())
    tau: float | torch.Tensor = gft_tau
    if gft_tau_quantile is not None:
        if GFT_BATCH_TAU not in x.extras:
            raise ValueError("gft with gft_tau_quantile reads the whole batch's quantile τ from "
                             f"extras[{GFT_BATCH_TAU!r}], which Algorithm.prepare computes (gft_batch_tau)")
        tau = x.extras[GFT_BATCH_TAU].to(probs.dtype)
    elif gft_tau <= 0:
        raise ValueError(f"gft_tau must be > 0, got {gft_tau}")
    coef = gft_coefficients(probs, tau)
    loss = -coef * x.advantages * x.logp
    metrics = {"gft/rectified_frac": masked_mean((coef < 1).float(), x.mask),
               "gft/tau": float(tau), "gft/coef_mean": masked_mean(coef, x.mask)}
    return loss, metrics


_OR_REFERENCES = ("rollout", "old")


def _reference_logp(x: LossInputs, reference: str) -> torch.Tensor:
    if reference == "old":
        return x.old_logp
    if reference != "rollout":
        raise ValueError(f"or_reference must be one of {_OR_REFERENCES}, got {reference!r}")
    if "rollout_logp" not in x.extras:
        raise ValueError("output_reset with or_reference='rollout' reads extras['rollout_logp'] (the inference "
                         "engine's log-probs); set or_reference='old' to measure against old_logp instead")
    return x.extras["rollout_logp"]


@LOSSES.register("output_reset", "Output Reset (PPO-OR/GRPO-OR): |A|·max(0, m − sign(A)·(logp − logp_roll))²",
                 zero_at_zero_advantage=True)
def output_reset(x: LossInputs, or_margin: float = 0.2, or_reference: str = "rollout", **_):
    """Output Reset, PPO-OR / GRPO-OR (docs/methods/output_reset.md). Confidence: low — reconstructed from
    the abstract.

    What: with ℓ_t = logp − logp_roll (the log-ratio to the rollout policy; `or_reference="old"`
    measures it against `old_logp` instead), s = sign(A) and margin m, the residual is
    e_t = max(0, m − s·ℓ_t) and the per-token loss L_t = |A|·e_t². Descent moves logp in the
    direction of A until the log-ratio has crossed the margin; from there the loss and its gradient
    are exactly zero ("the output is reset"). Why: a smooth one-sided saturation in place of the
    clip, whose gradient is not cut off abruptly at 1 ± ε but decays linearly to zero at the margin.

    Choices where the abstract is silent: the |A| scale (the abstract only says the sign sets the
    direction) and m = 0.2 (ε-like). At ℓ = 0 the gradient is −2m·A per token, 0.4× that of the
    PPO surrogate at ρ = 1 with m = 0.2; tokens with A = 0 get no loss.
    """
    if or_margin <= 0:
        raise ValueError(f"or_margin must be > 0, got {or_margin}")
    shift = x.logp - _reference_logp(x, or_reference)
    residual = (or_margin - torch.sign(x.advantages) * shift).clamp(min=0.0)
    loss = x.advantages.abs() * residual ** 2
    active = (residual > 0) & (x.advantages != 0)
    metrics = {"or/active_frac": masked_mean(active.float(), x.mask),
               "or/log_ratio_mean": masked_mean(shift.detach(), x.mask),
               "ratio_mean": masked_mean(torch.exp(log_ratio(x.logp, x.old_logp)).detach(), x.mask)}
    return loss, metrics
