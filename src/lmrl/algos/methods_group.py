"""Group-structured methods of specs/algorithms.md: GEPO (§12), Policy Split (§13), GFT (§15), HARGO (§17).

All four are reconstructions from abstracts (confidence low), so each docstring says what was
chosen where the source is silent; docs/methods/{gepo,policy_split,gft,hargo}.md have the formulas
and deviations.

- `gepo` (advantage): a base advantage damped by α where the group's entropy is far from its
  history (positive advantages of low-entropy groups, negative ones of high-entropy groups);
  `GroupEntropyStats` keeps the exponentially weighted history.
- `policy_split` (loss): PPO clip plus an entropy bonus on rows sampled in the high-entropy mode
  (the loop's `task.prompt_variants` rollouts).
- `gft` (loss): −sg[π/max(π, τ)]·A·logp, the policy gradient with the 1/π weight bounded by 1/τ.
- `hargo` (advantage): GRPO advantages boosted in informative groups where the reference model is
  unsure, then re-weighted by a group softmax of their size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.advantages import ADVANTAGES, group_mean_std
from lmrl.algos.advantages_extra import _required, _scores, _to_tokens, group_normalise
from lmrl.algos.losses import LOSSES, LossInputs, _masked_mean, ppo_clip


def _group_slots(group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot of each row's group [B], rows per group [G])."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return inverse, counts


# §12 GEPO (group entropy-controlled) --------------------------------------------------------------


def _per_group_token_mean(values: torch.Tensor, group_index: torch.Tensor,
                          mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean of `values` [B,T] over each group's valid tokens [G], slot of each row's group [B])."""
    inverse, counts = _group_slots(group_index)
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


@ADVANTAGES.register("gepo", "GEPO: base advantage damped by alpha where the group entropy leaves mu ± kappa·sigma")
def gepo(token_rewards, group_index, mask, token_entropy=None, entropy_mean: float | None = None,
         entropy_std: float | None = None, kappa: float = 1.0, alpha: float = 0.5, base: str = "grpo", **knobs):
    """GEPO, group entropy-controlled PO (spec §12). Confidence: low — reconstructed from the abstract.

    What: H_g = mean token entropy over all valid tokens of the group's responses (`token_entropy`
    [B,T]; the sampled tokens' −logp is an unbiased Monte-Carlo stand-in). With history statistics
    μ_H, σ_H (`entropy_mean`, `entropy_std`, e.g. from `GroupEntropyStats`), τ_lo = μ − κσ and
    τ_hi = μ + κσ: a group below τ_lo has its positive advantages scaled by α (less
    over-exploitation); a group above τ_hi has its negative advantages scaled by α (exploration
    kept). Applied after the `base` estimator (GRPO by default; remaining knobs go to it). Why:
    mixtures of heterogeneous tasks sit at very different entropy levels.

    Chosen where the abstract is silent: token-weighted H_g; without history statistics, μ and σ
    (unbiased) are those of this batch's group entropies; κ = 1 and α = 0.5 from the spec's example.
    """
    if base == "gepo":
        raise ValueError("gepo needs a different base estimator")
    entropy = _required("token_entropy", token_entropy).to(token_rewards.dtype)
    per_group, inverse = _per_group_token_mean(entropy, group_index, mask)
    if entropy_mean is None or entropy_std is None:
        entropy_mean = float(per_group.mean())
        entropy_std = float(per_group.std()) if per_group.numel() > 1 else 0.0
    adv = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    return gepo_shape(adv, per_group[inverse], entropy_mean, entropy_std, kappa, alpha) * mask


# §13 Policy Split ---------------------------------------------------------------------------------

@LOSSES.register("policy_split", "Policy Split: PPO clip, plus an entropy bonus beta·H on high-entropy-mode rows")
def policy_split(x: LossInputs, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
                 split_beta: float = 0.01, **_):
    """Policy Split (arXiv 2604.11510; spec §13). Confidence: low — reconstructed from the abstract
    and summaries.

    What: one policy, two modes sharing one prompt group. The normal mode samples from π(·|x), the
    high-entropy mode from π(·|x ⊕ p_H) (`task.prompt_variants`, preset `policy_split`). Advantages are GRPO over the
    pooled 2G rewards (the advantage stage with both modes in one group; use `grpo`). Loss: PPO clip
    on every row, minus β·H_t (`split_beta`, exact token entropy) on high-entropy-mode rows. Why:
    the exploring mode keeps diversity while both modes learn from each other's samples.

    Reads the row field `prompt_variant` ([B]; > 0 marks high-entropy-mode rows: the loop's
    `task.prompt_variants` rollouts) and `LossInputs.entropy`.
    Chosen where the source is silent: the entropy-term form (rather than an entropy-preference
    reward), β = 0.01 from the spec's example (summaries warn that a large β destabilises).
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


# §15 GFT ------------------------------------------------------------------------------------------


def gft_coefficients(probs: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """coef = π / max(π, τ) = min(1, π/τ): the weight on ∇π becomes min(1/π, 1/τ)."""
    return probs / torch.maximum(probs, torch.as_tensor(tau, dtype=probs.dtype))


@LOSSES.register("gft", "GFT: -sg(pi/max(pi, tau))·A·logp, the policy gradient with the 1/pi weight capped at 1/tau")
def gft(x: LossInputs, gft_tau: float = 0.1, gft_tau_quantile: float | None = None, **_):
    """GFT, Group Fine-Tuning (arXiv 2604.14258; spec §15). Confidence: low — reconstructed from the
    abstract.

    What: SFT is a policy gradient with reward 1 on the demonstration, whose gradient (1/π)∇π
    explodes on unlikely tokens. Dynamic Coefficient Rectification replaces the weight by
    min(1/π, 1/τ): ℓ_t = −sg[π_t/max(π_t, τ)]·A_t·logp_t. Group Advantage Learning gives A: GRPO
    (the spec's example) or `rloo` (the "unbiased" leave-one-out reading) over a group of the
    demonstration plus samples — the demonstration row needs a rollout change; on model samples
    alone this is the rectified policy gradient.

    τ: the fixed `gft_tau` (0.1, from the spec's example), or, with `gft_tau_quantile` = q, the
    q-quantile of π over the micro-batch's valid tokens that carry an advantage (A ≠ 0). The
    coefficient has no gradient and no importance ratio (on-policy, as SFT).
    """
    probs = torch.exp(x.logp.detach())
    tau: float | torch.Tensor = gft_tau
    if gft_tau_quantile is not None:
        if not 0 <= gft_tau_quantile <= 1:
            raise ValueError(f"gft_tau_quantile must lie in [0, 1], got {gft_tau_quantile}")
        live = probs[(x.mask > 0) & (x.advantages != 0)]
        tau = torch.quantile(live.float(), gft_tau_quantile).to(probs.dtype) if live.numel() else gft_tau
    elif gft_tau <= 0:
        raise ValueError(f"gft_tau must be > 0, got {gft_tau}")
    coef = gft_coefficients(probs, tau)
    loss = -coef * x.advantages * x.logp
    metrics = {"gft/rectified_frac": _masked_mean((coef < 1).float(), x.mask),
               "gft/tau": float(tau), "gft/coef_mean": _masked_mean(coef, x.mask)}
    return loss, metrics


# §17 HARGO ----------------------------------------------------------------------------------------


def sequence_confidence(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """c_i = exp(mean of logp over the row's valid tokens): the geometric-mean token probability [B]."""
    mask = mask.to(logp.dtype)
    return torch.exp((logp * mask).sum(1) / mask.sum(1).clamp(min=1))


def hargo_modulate(advantages: torch.Tensor, discrimination: torch.Tensor | float, confidence: torch.Tensor,
                   lam: float = 1.0) -> torch.Tensor:
    """Ã_i = A_i·(1 + λ·D_g·(1 − c_i))."""
    return advantages * (1 + lam * discrimination * (1 - confidence))


def group_softmax_weights(scores: torch.Tensor, group_index: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """w_i = G_g·softmax over the row's group of scores/T: weights of mean 1 within each group."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    inverse, counts = _group_slots(group_index)
    z = scores / temperature
    top = torch.full((len(counts),), float("-inf"), dtype=z.dtype).scatter_reduce(0, inverse, z, reduce="amax")
    e = torch.exp(z - top[inverse])
    total = torch.zeros(len(counts), dtype=z.dtype).index_add_(0, inverse, e)
    return counts[inverse].to(z.dtype) * e / total[inverse]


@ADVANTAGES.register(
    "hargo", "HARGO: GRPO advantage boosted by group contrast x reference doubt, group-softmax weighted"
)
def hargo(token_rewards, group_index, mask, ref_logp=None, lam: float = 1.0, temperature: float = 1.0,
          eps: float = 1e-6, **_):
    """HARGO, heterogeneity-aware reward-guided optimisation (spec §17). Confidence: low —
    reconstructed from the abstract.

    What: A_i = GRPO; D_g = unbiased std of the group's rewards (0 for a singleton); c_i =
    `sequence_confidence(ref_logp)`; Ã_i = A_i·(1 + λ·D_g·(1 − c_i)) (boost where the group is
    informative and the reference unsure); w_i = G·softmax_g(|Ã_i|/T). Returns w_i·Ã_i per token:
    for a loss that scales with A by a positive factor (PPO clip, dual-clip, CISPO, GSPO) this is
    exactly Σ_i w_i·(loss of i with Ã_i). Why: tasks of very different lengths and reward spreads,
    without task labels.

    `ref_logp` [B,T]: the reference model's log-probs of the sampled tokens. λ = 1 from the spec's
    example, T = 1 (the source gives neither).
    """
    ref = _required("ref_logp", ref_logp).to(token_rewards.dtype)
    scores = _scores(token_rewards)
    _, std = group_mean_std(scores, group_index)
    inverse, counts = _group_slots(group_index)
    discrimination = torch.where(counts[inverse] > 1, std, torch.zeros_like(std))
    modulated = hargo_modulate(group_normalise(scores, group_index, eps), discrimination,
                               sequence_confidence(ref, mask), lam)
    weights = group_softmax_weights(modulated.abs(), group_index, temperature)
    return _to_tokens(weights * modulated, mask)


gepo.requires = {"token_entropy"}
hargo.requires = {"ref_logp"}
policy_split.requires = {"prompt_variant"}
policy_split.needs_entropy = True  # the learner computes exact token entropies for it
gft.zero_at_zero_advantage = True  # row-local (τ counts only tokens with A ≠ 0) and zero where A = 0
