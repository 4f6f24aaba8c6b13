"""Feedback-control methods of specs/algorithms.md: Output Reset (§11), PIPO (§16), ACRL (§21).

All three are reconstructions from abstracts (confidence low; PIPO medium-low), so each docstring
says what was chosen where the source is silent; docs/methods/{output_reset,pipo,acrl}.md have
the formulas and deviations.

- `output_reset` (loss): a one-sided squared residual that stops pulling once the log-ratio to the
  rollout policy has crossed a margin in the advantage's direction.
- `acrl` (loss): PPO clip with a token trust band [1/c, c] on π_train/π_rollout; `AcrlController`
  adapts c from the measured train/inference discrepancy (held between steps by `algos/state.py`).
- `pipo` (advantage): the verdict ξ of a sliding window of batch-mean rewards times a base
  advantage, for the replay step on the previous batch; `PolicyImprovementMonitor` holds the window.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lmrl.algos.advantages import ADVANTAGES
from lmrl.algos.advantages_extra import _required
from lmrl.algos.losses import LOSSES, LossInputs, _masked_mean, ppo_clip
from lmrl.algos.losses_trust import _log_ratio

# §11 Output Reset (PPO-OR / GRPO-OR) --------------------------------------------------------------

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


@LOSSES.register("output_reset", "Output Reset (PPO-OR/GRPO-OR): |A|·max(0, m − sign(A)·(logp − logp_roll))²")
def output_reset(x: LossInputs, or_margin: float = 0.2, or_reference: str = "rollout", **_):
    """Output Reset, PPO-OR / GRPO-OR (spec §11). Confidence: low — reconstructed from the abstract.

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
    metrics = {"or/active_frac": _masked_mean(active.float(), x.mask),
               "or/log_ratio_mean": _masked_mean(shift.detach(), x.mask),
               "ratio_mean": _masked_mean(torch.exp(_log_ratio(x.logp, x.old_logp)).detach(), x.mask)}
    return loss, metrics


# §21 ACRL -----------------------------------------------------------------------------------------


def acrl_discrepancy(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """D = mean over valid tokens of k3(lr) = e^lr − 1 − lr, lr = log π_train − log π_rollout.

    k3 is the non-negative, unbiased estimator of KL(π_rollout ‖ π_train) from tokens sampled by
    the rollout engine.
    """
    lr = _log_ratio(train_logp.detach(), rollout_logp)
    return _masked_mean(torch.expm1(lr) - lr, mask)


def check_acrl_controller(d_low: float, d_high: float, kappa: float, band_min: float, band_max: float) -> None:
    if not (kappa > 1 and 1 < band_min <= band_max and 0 <= d_low <= d_high):
        raise ValueError(f"ACRL controller needs kappa > 1, 1 < band_min <= band_max, 0 <= d_low <= d_high; "
                         f"got kappa={kappa}, band=[{band_min}, {band_max}], d=[{d_low}, {d_high}]")


def acrl_next_band(band: float, discrepancy: float, d_low: float = 1e-3, d_high: float = 1e-2,
                   kappa: float = 1.25, band_min: float = 1.1, band_max: float = 10.0) -> float:
    """One controller step: c/κ when D > d_high (tighten), c·κ when D < d_low (widen), kept in bounds."""
    check_acrl_controller(d_low, d_high, kappa, band_min, band_max)
    if discrepancy > d_high:
        band = band / kappa
    elif discrepancy < d_low:
        band = band * kappa
    return min(max(band, band_min), band_max)


@dataclass
class AcrlController:
    """The ACRL band c between steps: `update(D)` after each batch, then pass `band` to the loss.

    A training loop holds one, feeds it the batch discrepancy (the `acrl/discrepancy` metric of the
    `acrl` loss, or `acrl_discrepancy`) and puts `band`, repeated per row, into
    `Batch.extras["acrl_band"]`.
    """

    band: float = 2.0
    d_low: float = 1e-3
    d_high: float = 1e-2
    kappa: float = 1.25
    band_min: float = 1.1
    band_max: float = 10.0

    def update(self, discrepancy: float) -> float:
        self.band = acrl_next_band(self.band, discrepancy, self.d_low, self.d_high, self.kappa,
                                   self.band_min, self.band_max)
        return self.band

    def state_dict(self) -> dict[str, float]:
        return {"band": self.band}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.band = float(state["band"])


@LOSSES.register("acrl", "ACRL: PPO clip, tokens masked when π_train/π_rollout leaves the band [1/c, c]")
def acrl(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
         acrl_band: float = 2.0, **_):
    """ACRL, adaptive control of the training-inference discrepancy (spec §21). Confidence: low —
    reconstructed from the abstract.

    What: ρ_roll = exp(logp_old − logp_roll) per token (π_train at the proximal policy, as the
    rollout corrections do); tokens with ρ_roll outside [1/c, c] get zero loss, the others the PPO
    clip. No importance weight: the mismatch is kept inside the band rather than corrected. Why:
    low-precision rollouts (e.g. FP8) drift from the trainer; a feedback controller on the band
    (`AcrlController`) tightens it when D = mean k3 is above d_high and widens it below d_low.

    The band c is `extras["acrl_band"]` ([B], one value per row; in the loop `AcrlBand` of
    `algos/state.py` sets it from its controller) when present, else the knob `acrl_band` (c = 2.0
    from the spec's example, also the controller's start). The metric `acrl/discrepancy` reports D,
    which the controller reads after the update.
    """
    band = x.extras.get("acrl_band", torch.tensor(acrl_band))
    band = torch.as_tensor(band, dtype=x.logp.dtype, device=x.logp.device)
    if bool((band <= 1).any()):
        raise ValueError(f"acrl_band must be > 1 (the band is [1/c, c]), got {band.tolist()}")
    if "rollout_logp" not in x.extras:
        raise ValueError("acrl reads extras['rollout_logp'] (the inference engine's log-probs)")
    log_rho = _log_ratio(x.old_logp, x.extras["rollout_logp"])
    log_band = torch.log(band).reshape(-1, 1) if band.dim() else torch.log(band)
    keep = (log_rho.abs() <= log_band).float()
    loss, metrics = ppo_clip(x, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    metrics = {**metrics, "masked_frac": _masked_mean(1.0 - keep, x.mask),
               "acrl/discrepancy": acrl_discrepancy(x.old_logp, x.extras["rollout_logp"], x.mask),
               "acrl/band": float(band.float().mean())}
    return loss * keep, metrics


# §16 PIPO -----------------------------------------------------------------------------------------


def pipo_verdict(window: Sequence[float] | torch.Tensor, current: float, eps: float = 1e-6,
                 verdict_clip: float | None = None) -> float:
    """ξ = (μ_now − mean(window)) / (population std(window) + eps); 0 with fewer than 2 past batches.

    ξ > 0: the last update helped ("reinforce"), ξ ≤ 0: it hurt ("rectify"). `verdict_clip`
    bounds |ξ| (off by default; a window of equal means gives σ = 0 and a large ξ).
    """
    values = torch.as_tensor(window, dtype=torch.float64).flatten()
    if values.numel() < 2:
        return 0.0
    xi = (float(current) - float(values.mean())) / (float(values.std(unbiased=False)) + eps)
    if verdict_clip is not None:
        xi = max(-verdict_clip, min(verdict_clip, xi))
    return xi


@dataclass
class PolicyImprovementMonitor:
    """The sliding window of the last `size` batch-mean rewards that PIPO judges updates against.

    Per step: `xi = monitor.verdict(mean_reward_now)` (against the window of earlier batches), then
    `monitor.push(mean_reward_now)`.
    """

    size: int = 4
    eps: float = 1e-6
    verdict_clip: float | None = None
    window: list[float] = field(default_factory=list)

    def __post_init__(self):
        if self.size < 2:
            raise ValueError(f"PIPO window size must be >= 2 (a std is taken over it), got {self.size}")

    def verdict(self, current: float) -> float:
        return pipo_verdict(self.window, current, self.eps, self.verdict_clip)

    def push(self, current: float) -> None:
        self.window = (self.window + [float(current)])[-self.size:]

    def state_dict(self) -> dict[str, list[float]]:
        return {"window": list(self.window)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.window = [float(v) for v in state["window"]][-self.size:]


@ADVANTAGES.register("pipo", "PIPO: base advantages, plus a replay of the previous batch with verdict ξ x its advantages")
def pipo(token_rewards, group_index, mask, reward_window=None, current_reward_mean=None, base: str = "grpo",
         eps: float = 1e-6, verdict_clip: float | None = 5.0, **knobs):
    """PIPO, Policy Improvement PO (arXiv 2604.00860; spec §16). Confidence: medium-low — μ_his and ξ
    from the project page, the PI-reward formula r^PI = ξ·Â is a reconstruction.

    What: for the replay step on the previous batch B_{t−1} (its rewards in `token_rewards`),
    A^PI = ξ_t·Â_{t−1}, Â from the `base` estimator (remaining knobs go to it) and ξ_t from
    `pipo_verdict(reward_window, current_reward_mean)`. Without those two inputs (the normal step
    on B_t) it returns Â. Why: a closed loop that checks whether the last update improved the batch
    reward and reinforces it (ξ > 0) or undoes it (ξ < 0).

    r^PI is used directly as the advantage (it is already centred per group; renormalising it would
    cancel the size of ξ). |ξ| is clipped at `verdict_clip` (5, lmrl's choice; the spec's example
    gives 3.13): a window of nearly equal means has σ ≈ 0 and would give an unbounded ξ. In the loop, `PipoReplay` (`algos/state.py`) keeps the window and
    B_{t−1} and asks for the replay update.
    """
    if base == "pipo":
        raise ValueError("pipo needs a different base estimator")
    advantages = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    if reward_window is None and current_reward_mean is None:
        return advantages
    xi = pipo_verdict(_required("reward_window", reward_window),
                      float(_required("current_reward_mean", current_reward_mean)), eps, verdict_clip)
    return xi * advantages


for _loss in (output_reset, acrl):
    _loss.zero_at_zero_advantage = True  # row-local and zero where A = 0: the learner may skip such rows
