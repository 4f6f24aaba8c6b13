"""Policy losses beyond the PPO clip: HTPO, rollout-mismatch corrections (TIS, MIS, TRM), CISPO, SAPO.

Same contract as `losses.py`: `(LossInputs, **knobs) -> (per-token loss [B,T], metrics)`; each knob
keyword is named like the `AlgoConfig` field that sets it. Extra inputs come from `x.extras`:
HTPO reads `acc` and `group_acc` ([B] floats); the rollout corrections read `rollout_logp` ([B,T],
the inference engine's log-probs of the sampled tokens). Formulas, sources and deviations are in
docs/methods/{htpo,rollout_correction,trust_region_masking,cispo,sapo}.md.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lmrl.algos.losses import LOSSES, LossInputs, _masked_mean, clipped_surrogate, ppo_clip, zero_at_zero_advantage

SAFETY_BOUND = 20.0  # log-ratios are clamped to ±20 before exp, as in verl


def _log_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return (num - den).clamp(-SAFETY_BOUND, SAFETY_BOUND)


def _seq_frac(rejected_rows: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of the sequences with at least one valid token that `rejected_rows` [B] marks."""
    has_tokens = mask.sum(1) > 0
    return float((rejected_rows & has_tokens).sum() / has_tokens.sum().clamp(min=1))


# --- HTPO ---------------------------------------------------------------------------------------


def _kth(values: torch.Tensor, member: torch.Tensor, frac: float, largest: bool) -> torch.Tensor:
    """Per row, the k-th largest (or smallest) of `values` over `member`, k = max(⌊frac·n⌋, 1).

    Returns [B, 1]. A row with no members gets ∓inf, which selects nothing once ANDed with `member`.
    """
    n = member.sum(1, dtype=torch.float64)
    k = torch.floor(frac * n).clamp(min=1).long()
    fill = float("-inf") if largest else float("inf")
    ordered = values.masked_fill(~member, fill).sort(dim=1, descending=largest).values
    return ordered.gather(1, (k - 1).unsqueeze(1))


@LOSSES.register("htpo", "HTPO: difficulty x correctness x token-entropy cells, each with its own clip rule")
def htpo(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = 10.0,
         htpo_difficulty_threshold: float = 0.6, htpo_q1: float = 0.006, htpo_q2: float = 0.02,
         htpo_high_entropy_ratio: float = 0.2, **_):
    """HTPO (xcyao00/HTPO `compute_policy_loss_htpo`; spec §1). Confidence: high (authors' code).

    What: per sequence, the top `htpo_high_entropy_ratio` of valid tokens by entropy (k = max(⌊0.2n⌋, 1),
    ties at the threshold included) are "high", the rest "low". A prompt is hard when its group
    accuracy is below `htpo_difficulty_threshold`. Low tokens get the standard clip everywhere. High
    tokens: hard ∧ correct: ρ > 1+ε_hi → +(1+ε_hi)·A·r_id, ρ < 1−ε_lo → +sg[1/ρ]·A·r_id, else −Aρ;
    wrong (hard or easy): ρ < 1−ε_lo → (1−ε_lo)·A·r_id, else −Aρ; easy ∧ correct: standard clip.
    r_id = exp(logp − sg[logp]) (value 1, gradient 1). Clip-outs: hard ∧ correct zeroes the low
    tokens strictly below the k'-th smallest low entropy, k' = max(⌊q1·n_low⌋, 1) (so k'−1 tokens, an
    off-by-one kept from the code); easy ∧ correct zeroes the top k' = max(⌊q2·n_high⌋, 1) high tokens.
    Dual-clip (A < 0) applies last, to every cell.

    Why: HTPO balances exploration and exploitation by treating forking (high-entropy) tokens of
    correct vs wrong and hard vs easy samples differently. The positive signs in the hard ∧ correct
    branches push out-of-region high-entropy tokens of correct answers *down*; reproduced from the
    code as the spec instructs and flagged in docs/methods/htpo.md.

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

    log_ratio = _log_ratio(x.logp, x.old_logp)
    ratio = torch.exp(log_ratio)
    r_id = torch.exp(x.logp - x.logp.detach())
    unclipped = -adv * ratio
    standard, std_clipped = clipped_surrogate(ratio, adv, eps_low, eps_high, None)
    above, below = ratio > 1 + eps_high, ratio < 1 - eps_low

    inverse = torch.exp(-log_ratio).detach()  # sg[π_old/π], clamped like ρ
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
        "clip_frac": _masked_mean(clipped, x.mask),
        "ratio_mean": _masked_mean(ratio.detach(), x.mask),
        "htpo/hard_frac": float(hard.float().mean()),
        "htpo/high_entropy_frac": _masked_mean(high.float(), x.mask),
        "htpo/zeroed_frac": _masked_mean(zeroed.float(), x.mask),
    }
    return loss, metrics


# --- Rollout-mismatch corrections: truncated / masked importance sampling ------------------------


def _rollout_log_ratio(x: LossInputs) -> torch.Tensor:
    """log(π_train/π_rollout) per token, with π_train = x.old_logp (verl's decoupled mode)."""
    return _log_ratio(x.old_logp, x.extras["rollout_logp"])


def _seq_rollout_log_ratio(x: LossInputs) -> torch.Tensor:
    """[B] log(π_train(y)/π_rollout(y)): the token log-ratios summed over each sequence's valid tokens."""
    return ((x.old_logp - x.extras["rollout_logp"]) * x.mask).sum(1)


def _weighted_ppo(x: LossInputs, weight: torch.Tensor, extra: dict[str, float], eps_low: float,
                  eps_high: float, dual_clip: float | None):
    loss, metrics = ppo_clip(x, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    return loss * weight.detach(), {**metrics, **extra}


@LOSSES.register("ppo_clip_tis", "PPO clip x truncated IS weight min(π_old/π_rollout, C) (rollout mismatch)")
def ppo_clip_tis(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                 tis_cap: float = 2.0, **_):
    """Token-level truncated importance sampling (TIS; verl `rollout_is="token"`). Confidence: high.

    What: ℓ = w·ℓ_ppo with w = min(exp(logp_old − logp_roll), C), a constant (no gradient). Why: the
    inference engine samples from π_roll ≠ π_train (kernels, precision); w re-weights the tokens
    towards π_train and the cap C bounds the variance (biased, low variance).
    """
    rho = torch.exp(_rollout_log_ratio(x))
    weight = rho.clamp(max=tis_cap)
    extra = {"is_weight_mean": _masked_mean(weight, x.mask),
             "is_truncated_frac": _masked_mean((rho > tis_cap).float(), x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


@LOSSES.register("ppo_clip_mis_token", "PPO clip x token rollout IS weight, zeroed outside [lo, hi] (IcePop)")
def ppo_clip_mis_token(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                       dual_clip: float | None = None, mis_token_low: float = 0.5,
                       mis_token_high: float = 5.0, **_):
    """Token-level masked importance sampling (verl IcePop, `rollout_is_threshold="lo_hi"`). Confidence: high.

    What: ρ = exp(logp_old − logp_roll); w = ρ where lo ≤ ρ ≤ hi, else 0, so tokens the engine sampled
    far from π_train are masked out and the others are IS-corrected. Why: a cap (TIS) still trains
    on the worst-mismatched tokens at weight C; masking drops them from the update instead.
    """
    log_rho = _rollout_log_ratio(x)
    keep = (log_rho >= math.log(mis_token_low)) & (log_rho <= math.log(mis_token_high))
    weight = torch.exp(log_rho) * keep
    extra = {"is_weight_mean": _masked_mean(weight, x.mask),
             "masked_frac": _masked_mean((~keep).float(), x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


@LOSSES.register("ppo_clip_mis_seq", "PPO clip, sequences masked when the rollout IS ratio is out of bounds")
def ppo_clip_mis_seq(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                     dual_clip: float | None = None, mis_seq_low: float = 0.5, mis_seq_high: float = 2.0,
                     mis_seq_agg: str = "sum", **_):
    """Sequence-level masked IS / rejection (verl `seq_sum_k1` / `seq_mean_k1`; spec §10). Confidence: high.

    What: L_i = Σ_t (logp_old − logp_roll) over valid tokens (`mis_seq_agg="sum"`) or its mean
    (`"mean"`, the geometric-mean ratio); s_i = exp(L_i), clamped to e^±20. Sequence i is rejected
    (all its tokens weigh 0) unless lo ≤ s_i ≤ hi. Kept sequences weigh s_i in "sum" mode (Seq-MIS:
    s_i is the sequence's IS ratio) and 1 in "mean" mode (Geo-RS: the geometric mean is only a
    length-normalised filter, not an IS weight). Why: token corrections cannot bound a sequence-level
    mismatch that accumulates over many slightly-off tokens.
    """
    if mis_seq_agg not in ("sum", "mean"):
        raise ValueError(f"mis_seq_agg must be 'sum' or 'mean', got {mis_seq_agg!r}")
    total = _seq_rollout_log_ratio(x)
    log_s = total if mis_seq_agg == "sum" else total / x.mask.sum(1).clamp(min=1)
    log_s = log_s.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    keep = (log_s >= math.log(mis_seq_low)) & (log_s <= math.log(mis_seq_high))
    seq_weight = torch.exp(log_s) if mis_seq_agg == "sum" else torch.ones_like(log_s)
    weight = (seq_weight * keep).unsqueeze(1).expand_as(x.mask)
    extra = {"is_weight_mean": _masked_mean(weight, x.mask),
             "masked_frac": _masked_mean((~keep).float().unsqueeze(1).expand_as(x.mask), x.mask),
             "seq_masked_frac": _seq_frac(~keep, x.mask)}
    return _weighted_ppo(x, weight, extra, eps_low, eps_high, dual_clip)


@LOSSES.register("ppo_clip_tis_seq", "PPO clip x sequence IS weight min(π_old(y)/π_rollout(y), C) (Mutual RL's PRP)")
def ppo_clip_tis_seq(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                     tis_seq_cap: float = 2.0, **_):
    """Sequence-level truncated importance sampling (verl `rollout_is="sequence"`). Confidence: high.

    What: s_i = exp(Σ_t (logp_old − logp_roll)) over valid tokens (clamped to e^±20) and every token
    of sequence i weighs w_i = min(s_i, C), a constant. Why: the one rollout correction that needs
    only a sequence's total behaviour log-prob, so it also weights completions written by another
    policy with another tokenizer (Mutual RL's PRP: w = π_self(y)/π_peer(y), truncated;
    `data.demonstrations: peers`), where per-token ratios do not exist.
    """
    log_s = _seq_rollout_log_ratio(x).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    s = torch.exp(log_s)
    weight = s.clamp(max=tis_seq_cap).unsqueeze(1).expand_as(x.mask)
    extra = {"is_weight_mean": _masked_mean(weight, x.mask), "seq_truncated_frac": _seq_frac(s > tis_seq_cap, x.mask)}
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


@LOSSES.register("trust_region_masking", "TRM: PPO clip, sequences masked when a token strays > δ")
def trust_region_masking(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2,
                         dual_clip: float | None = None, trm_criteria: str = "seq_max_k2",
                         trm_threshold: float | Sequence[float] = 2.5, **_):
    """Trust Region Masking (arXiv 2512.23075; verl PR #4544; spec §10). Confidence: high.

    What: lr_t = clamp(logp_old − logp_roll, ±20). TRM-max keeps sequence i iff max_t k(lr_t) ≤ δ
    (`seq_max_k2` / `seq_max_k3`); `trm_criteria` may name any verl criterion (token_*, seq_sum_*,
    seq_mean_*, seq_max_*), comma-chained with AND; `trm_threshold` is one value for all or one per
    criterion. Rejected tokens get zero loss and zero gradient. Why: the sequence-level divergence
    that bounds the off-policy error is not controlled by per-token clipping; masking the sequences
    whose worst token diverges restores the trust region.
    """
    criteria = [c.strip() for c in trm_criteria.split(",") if c.strip()]
    if isinstance(trm_threshold, (int, float)):
        thresholds = [float(trm_threshold)] * len(criteria)
    else:
        thresholds = [float(t) for t in trm_threshold]
    if not criteria or len(thresholds) != len(criteria):
        raise ValueError(f"trm_threshold: give one value or one per criterion of {criteria}; "
                         f"got {trm_threshold!r}")
    log_ratio = _rollout_log_ratio(x)
    keep = torch.ones_like(x.mask, dtype=torch.bool)
    for criterion, threshold in zip(criteria, thresholds):
        keep &= trm_keep_mask(log_ratio, x.mask, criterion, threshold)
    valid = x.mask > 0
    extra = {"masked_frac": _masked_mean((~keep).float(), x.mask),
             "seq_masked_frac": _seq_frac((~keep & valid).any(1), x.mask)}
    return _weighted_ppo(x, keep.float(), extra, eps_low, eps_high, dual_clip)


# --- CISPO and SAPO -----------------------------------------------------------------------------


@LOSSES.register("cispo", "CISPO: -sg[clip(ρ)]·A·logp, clipped IS weight, every token keeps a gradient")
def cispo(x: LossInputs, eps_low: float = 1.0, eps_high: float = 0.28, **_):
    """CISPO (MiniMax-M1, arXiv 2506.13585; verl `compute_policy_loss_cispo`). Confidence: medium.

    What: ℓ = −sg[clip(ρ, 1−ε_lo, 1+ε_hi)]·A·logp. Why: the PPO clip zeroes the gradient of clipped
    tokens, which are often the rare "reflective" tokens; CISPO clips only the IS weight, so every
    token keeps the REINFORCE gradient −w·A·∇logp. MiniMax tunes only ε_hi and sets no lower bound
    (ε_lo large); ε_lo ≥ 1 means no lower clip since ρ > 0. The loss value is not comparable to
    ppo_clip's (it contains logp); only its gradient matters.
    """
    ratio = torch.exp(_log_ratio(x.logp, x.old_logp)).detach()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * x.advantages * x.logp
    metrics = {"clip_frac": _masked_mean((weight != ratio).float(), x.mask),
               "ratio_mean": _masked_mean(ratio, x.mask)}
    return loss, metrics


@LOSSES.register("sapo", "SAPO: smooth sigmoid gate (4/τ)σ(τ(ρ-1)) instead of the hard clip, τ by sign of A")
def sapo(x: LossInputs, sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05, **_):
    """SAPO (Qwen, arXiv 2511.20347; verl `compute_policy_loss_sapo`). Confidence: medium.

    What: ℓ = −A·f(ρ), f(ρ) = (4/τ)·σ(τ(ρ−1)), τ = τ_pos where A > 0 else τ_neg. Why: a hard clip
    drops the whole gradient of a token once ρ leaves the band; here dℓ/dlogp = −A·4σ(1−σ)·ρ, which
    is −A at ρ = 1 (as for the unclipped surrogate) and decays smoothly as ρ moves away, more
    sharply for negative advantages (τ_neg > τ_pos).
    """
    ratio = torch.exp(_log_ratio(x.logp, x.old_logp))
    tau = torch.full_like(x.advantages, sapo_tau_neg).masked_fill(x.advantages > 0, sapo_tau_pos)
    sig = torch.sigmoid(tau * (ratio - 1.0))
    loss = -x.advantages * sig * (4.0 / tau)
    gate_slope = (4.0 * sig * (1.0 - sig)).detach()
    metrics = {"ratio_mean": _masked_mean(ratio.detach(), x.mask),
               "sapo/gate_slope_mean": _masked_mean(gate_slope, x.mask)}
    return loss, metrics

htpo.needs_entropy = True  # the learner computes exact token entropies for it
zero_at_zero_advantage(htpo, ppo_clip_tis, ppo_clip_mis_token, ppo_clip_mis_seq, trust_region_masking, cispo, sapo)
