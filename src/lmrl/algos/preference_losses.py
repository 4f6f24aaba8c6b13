"""Preference, reward-model and distillation losses as pure tensor functions (no batch plumbing).

The objective terms that put them on a batch live in `algos/preference.py`; formulas, defaults,
sources and the differences from TRL and OpenRLHF are on docs/methods/preference.md. Notation: a
pair is (y_w chosen, y_l rejected); h = logπ(y) − logπ_ref(y) summed over the completion tokens,
z = h_w − h_l; ā = logπ(y)/|y| the average completion log-prob. Every loss here is per pair (or per
example for KTO); the caller averages.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# DPO's loss types, each of the margin z (β·z inside), β and the label-flip rate ε (cdpo and robust only)
DPO_LOSS_TYPES = {
    "sigmoid": lambda z, beta, eps: -F.logsigmoid(beta * z),
    "cdpo": lambda z, beta, eps: -(1 - eps) * F.logsigmoid(beta * z) - eps * F.logsigmoid(-beta * z),
    "robust": lambda z, beta, eps: (-(1 - eps) * F.logsigmoid(beta * z) + eps * F.logsigmoid(-beta * z)) / (1 - 2 * eps),
    "ipo": lambda z, beta, eps: (z - 1 / (2 * beta)) ** 2,
    "hinge": lambda z, beta, eps: torch.relu(1 - beta * z),
}
LENGTH_NORMALISED = frozenset({"ipo"})  # its margin is of per-token log-ratios when `ipo_length_norm`
SMOOTHED_LOSS_TYPES = frozenset({"cdpo", "robust"})  # the only DPO losses that read label_smoothing


def dpo_problem(beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> str | None:
    """Why these DPO knobs do not fit together, or None."""
    if loss_type not in DPO_LOSS_TYPES:
        return f"loss_type {loss_type!r} is not one of {list(DPO_LOSS_TYPES)}"
    if beta <= 0:
        return f"beta must be > 0 (got {beta})"
    if loss_type in SMOOTHED_LOSS_TYPES and not 0.0 <= label_smoothing < 0.5:
        return f"label_smoothing must lie in [0, 0.5) for loss_type {loss_type!r} (got {label_smoothing})"
    if loss_type not in SMOOTHED_LOSS_TYPES and label_smoothing != 0:
        return (f"loss_type {loss_type!r} has no label smoothing (got {label_smoothing}): "
                "use loss_type 'cdpo' (conservative) or 'robust'")
    return None


def dpo_loss(h_w: torch.Tensor, h_l: torch.Tensor, beta: float = 0.1, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0, len_w: torch.Tensor | None = None, len_l: torch.Tensor | None = None,
             ipo_length_norm: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO and its variants on per-pair log-ratios [P]; returns (loss [P], chosen reward β·h_w, rejected β·h_l).

    Confidence high (TRL `DPOTrainer._compute_loss`, OpenRLHF `DPOLoss`; spec §2.1–2.3):
    - sigmoid (DPO): −logσ(βz).
    - cdpo (conservative DPO, label-flip rate ε): −(1−ε)·logσ(βz) − ε·logσ(−βz), as OpenRLHF `DPOLoss`.
    - robust (unbiased under flips): [−(1−ε)·logσ(βz) + ε·logσ(−βz)] / (1−2ε), as TRL `"robust"`.
    - ipo: (Δ − 1/(2β))², Δ = h_w/|y_w| − h_l/|y_l| (TRL, needs `len_w`, `len_l`) or Δ = z with
      `ipo_length_norm=False` (OpenRLHF).
    - hinge: relu(1 − βz), as TRL `"hinge"`.
    Label smoothing is read by cdpo and robust only; elsewhere a non-zero ε is refused (`dpo_problem`).
    Reference-free DPO is the same loss with h = logπ(y) (the reference's log-probs taken as 0).
    """
    problem = dpo_problem(beta, loss_type, label_smoothing)
    if problem:
        raise ValueError(problem)
    z = h_w - h_l
    if loss_type in LENGTH_NORMALISED and ipo_length_norm:
        if len_w is None or len_l is None:
            raise ValueError("length-normalised IPO needs the completion lengths len_w and len_l")
        z = h_w / len_w.clamp(min=1) - h_l / len_l.clamp(min=1)
    return DPO_LOSS_TYPES[loss_type](z, beta, label_smoothing), beta * h_w.detach(), beta * h_l.detach()


def simpo_loss(avg_w: torch.Tensor, avg_l: torch.Tensor, beta: float = 0.1, gamma: float = 0.5,
               label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO on average completion log-probs [P]; returns (loss [P], β·ā_w, β·ā_l).

    L = −(1−ε)·logσ(β·Δā − γ) − ε·logσ(−(β·Δā − γ)), Δā = ā_w − ā_l. Confidence high (TRL
    `experimental/cpo` `CPOTrainer.cpo_loss`, `loss_type="simpo"`; spec §2.4). Defaults are TRL's
    (β = 0.1, γ = 0.5); the SimPO paper uses β ≈ 2–2.5 with γ/β ≈ 0.5.
    """
    logits = beta * (avg_w - avg_l) - gamma
    loss = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return loss, beta * avg_w.detach(), beta * avg_l.detach()


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x < 0, stable on both sides of −log 2 (Mächler 2012)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(avg_w: torch.Tensor, avg_l: torch.Tensor, nll_w: torch.Tensor,
              lam: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """ORPO per pair [P]: NLL(y_w) − λ·logσ(LOR); returns (loss, LOR), in fp32.

    log-odds(y) = ā − log(1 − e^ā) and LOR = log-odds(y_w) − log-odds(y_l), with log(1 − e^ā)
    computed by `log1mexp`. `nll_w` is the chosen completion's token-mean negative log-likelihood.
    λ is ORPOConfig's `beta` (default 0.1). Confidence high (TRL `experimental/orpo`
    `ORPOTrainer.odds_ratio_loss`; spec §2.6).
    """
    avg_w, avg_l = avg_w.float(), avg_l.float()
    log_odds_ratio = (avg_w - avg_l) - (log1mexp(avg_w) - log1mexp(avg_l))
    return nll_w.float() - lam * F.logsigmoid(log_odds_ratio), log_odds_ratio


def kto_reference_point(kl_log_ratios: torch.Tensor) -> torch.Tensor:
    """KTO's z₀ = max(mean of logπ(y′) − logπ_ref(y′) over mismatched completions y′, 0), detached (spec §2.5).

    The log-ratios are those of the whole batch (every rank of a data-parallel run provides the same batch),
    so the mean is the batch's, as TRL's gather-then-mean gives.
    """
    return kl_log_ratios.detach().mean().clamp(min=0)


def kto_loss(h: torch.Tensor, desirable: torch.Tensor, z0: torch.Tensor | float, beta: float = 0.1,
             desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """KTO per example [N] on log-ratios h [N]; returns (loss [N], reward β·h).

    Desirable: λ_D·(1 − σ(β(h − z₀))); undesirable: λ_U·(1 − σ(β(z₀ − h))); `desirable` [N] is 1 or 0
    and z₀ (`kto_reference_point`) carries no gradient. The loss is the mean over all examples.
    Confidence high (TRL `KTOTrainer._compute_loss`, `loss_type="kto"`; OpenRLHF `KTOLoss` @ 04898500;
    spec §2.5).
    """
    z0 = torch.as_tensor(z0, dtype=h.dtype, device=h.device).detach()
    good = desirable > 0.5
    loss = torch.where(good, desirable_weight * (1 - torch.sigmoid(beta * (h - z0))),
                       undesirable_weight * (1 - torch.sigmoid(beta * (z0 - h))))
    return loss, beta * h.detach()


def bradley_terry_loss(r_w: torch.Tensor, r_l: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coef: float | None = None) -> torch.Tensor:
    """Bradley–Terry reward-model loss per pair [P]: −logσ(r_w − r_l − m) + c·(r_w + r_l)².

    `margin` m is an optional per-pair column (absent: 0); the centering term (Eisenstein et al. 2023,
    TRL `center_rewards_coefficient`, recommended 0.01) is off when `center_coef` is None. The mean over
    pairs is TRL's loss. Confidence high (TRL `RewardTrainer.compute_loss`, OpenRLHF `PairWiseLoss`;
    spec §3.1).
    """
    diff = r_w - r_l if margin is None else r_w - r_l - margin
    loss = -F.logsigmoid(diff)
    if center_coef is not None:
        loss = loss + center_coef * (r_w + r_l) ** 2
    return loss


def pairwise_accuracy(r_w: torch.Tensor, r_l: torch.Tensor) -> torch.Tensor:
    """Share of pairs with r_w > r_l (ties count as wrong; spec §3.1)."""
    return (r_w.detach() > r_l.detach()).float().mean()


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                    temperature: float = 1.0) -> torch.Tensor:
    """GKD's generalised Jensen–Shannon divergence per token over the full vocabulary: [..., V] -> [...].

    p_S = softmax(z_S/T), p_T = softmax(z_T/T), M = β·p_T + (1−β)·p_S,
    JSD_β = β·KL(p_T‖M) + (1−β)·KL(p_S‖M); β = 0 is the forward KL(p_T‖p_S) and β = 1 the reverse
    KL(p_S‖p_T), written out since JSD_β vanishes at both ends. Computed in fp32. The caller masks
    the completion tokens and averages (TRL: sum over them / their count). Confidence high (TRL
    `experimental/gkd` `GKDTrainer.generalized_jsd_loss`; spec §4.1). GKDConfig's defaults are
    β = 0.5 and T = 0.9.
    """
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return (log_t.exp() * (log_t - log_s)).sum(-1)
    if beta == 1:
        return (log_s.exp() * (log_s - log_t)).sum(-1)
    log_m = torch.logsumexp(torch.stack([log_t + math.log(beta), log_s + math.log1p(-beta)]), dim=0)
    return (beta * (log_t.exp() * (log_t - log_m)) + (1 - beta) * (log_s.exp() * (log_s - log_m))).sum(-1)
