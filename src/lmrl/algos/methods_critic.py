"""Methods that read model outputs: PPO's GAE with a learned critic, EVPO (§8), ResRL (§5).

Estimators keep the signature of `advantages.py` and declare their model inputs in `.requires`
("values": the critic's value per generated position, "hidden": hidden states [B,T,H]); the
learner computes them in a no-grad pass before `Algorithm.prepare`. A critic-based estimator
(`.critic = True`) also gives the value targets (`.value_targets`) that the clipped value loss
regresses the value head on.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lmrl.algos.advantages import ADVANTAGES, masked_whiten


def _required(name: str, value):
    if value is None:
        raise ValueError(f"this advantage estimator needs the input {name!r}")
    return value


# --- GAE and the value loss (verl core_algos) ---------------------------------------------------

def gae_advantages_returns(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                           gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """verl `compute_gae_advantage_return` without the whitening: (advantages, returns = A + V).

    δ_t = r_t + γ V_{t+1} − V_t and A_t = δ_t + γλ A_{t+1}, over generated positions only (masked
    positions neither update the running value nor the running advantage).
    """
    rewards, values, mask = token_rewards.float(), values.float(), mask.float()
    next_value = torch.zeros(rewards.shape[0])
    running = torch.zeros(rewards.shape[0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        running = step * mask[:, t] + (1 - mask[:, t]) * running
        advantages[:, t] = running
    return advantages * mask, (advantages + values) * mask


def value_targets(token_rewards, values, mask, gamma: float = 1.0, lam: float = 1.0, **_) -> torch.Tensor:
    """The critic's regression targets: the GAE λ-returns."""
    return gae_advantages_returns(token_rewards, values, mask, gamma, lam)[1]


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """verl `compute_value_loss` per token: ½·max((V − R)², (clip(V, V_old ± c) − R)²), and where the clip bit."""
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """EV = 1 − Var(R − V) / Var(R) over valid positions; NaN when the returns do not vary."""
    valid = mask > 0
    r, v = returns[valid].float(), values[valid].float()
    if r.numel() < 2 or float(r.var()) == 0.0:
        return float("nan")
    return float(1 - (r - v).var() / r.var())


@ADVANTAGES.register("gae", "GAE (PPO): λ-returns from a learned critic's values, whitened over the batch's tokens")
def gae(token_rewards, group_index, mask, values=None, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
        **_):
    """PPO's generalised advantage estimation (verl `compute_gae_advantage_return`). Confidence: high.

    Needs the critic's values at every generated position (`algo.critic: true`). γ = λ = 1 as in
    verl's defaults; `whiten` normalises the advantages over all valid tokens of the batch.
    """
    adv, _ = gae_advantages_returns(token_rewards, _required("values", values), mask, gamma, lam)
    return masked_whiten(adv, mask) if whiten else adv


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Monte-Carlo return-to-go Σ_k γ^(k−t) r_k over generated positions."""
    returns = torch.zeros_like(token_rewards, dtype=torch.float)
    running = torch.zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t].float() + gamma * running * mask[:, t]
        returns[:, t] = running
    return returns * mask


@ADVANTAGES.register("evpo", "EVPO: critic (GAE) advantages when the critic's explained variance > 0, else batch-mean baseline")
def evpo(token_rewards, group_index, mask, values=None, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
         ev_threshold: float = 0.0, **_):
    """EVPO (arXiv 2604.19485, spec §8). Confidence: medium (gate and threshold explicit; per-token details are lmrl's).

    EV = 1 − Var(R − V)/Var(R) over the batch's valid tokens, R = the GAE λ-returns (the critic's
    targets). EV > `ev_threshold` (0): the critic reduces variance, use the GAE advantages (PPO,
    whitened when `whiten`). Otherwise the batch-mean baseline A_t = G_t − mean(G), G the
    Monte-Carlo return-to-go (= the outcome reward when γ = 1) and the mean over valid tokens.
    A batch whose returns do not vary has no EV and takes the baseline branch. The critic trains
    in both branches, so the gate can switch back.
    """
    values = _required("values", values)
    adv, returns = gae_advantages_returns(token_rewards, values, mask, gamma, lam)
    ev = explained_variance(returns, values, mask)
    if ev > ev_threshold:
        return masked_whiten(adv, mask) if whiten else adv
    mc = discounted_returns(token_rewards, mask, gamma)
    baseline = mc[mask > 0].mean() if (mask > 0).any() else torch.zeros(())
    return (mc - baseline) * mask


# --- ResRL (§5) ---------------------------------------------------------------------------------

def length_penalty_factor(lengths: torch.Tensor, start: float = 3500, end: float = 4096,
                          floor: float = 0.7) -> torch.Tensor:
    """1 up to `start` tokens, falling linearly to `floor` at `end`, `floor` beyond."""
    frac = ((lengths.float() - start) / (end - start)).clamp(0.0, 1.0)
    return 1 - (1 - floor) * frac


def distance_weights(d: torch.Tensor, q_low: float = 0.2, q_high: float = 0.8, min_weight: float = 0.1,
                     flat: float = 1e-5) -> torch.Tensor:
    """w = min_weight + (1 − min_weight)·clip((d − lo)/(hi − lo), 0, 1), lo/hi the q_low/q_high quantiles of d.

    When hi − lo < `flat` every token gets the midpoint weight (0.55 with the defaults).
    """
    lo, hi = torch.quantile(d.float(), torch.tensor([q_low, q_high])).tolist()
    if hi - lo < flat:
        return torch.full_like(d, min_weight + (1 - min_weight) * 0.5)
    return min_weight + (1 - min_weight) * ((d - lo) / (hi - lo)).clamp(0.0, 1.0)


def projection_distances(positive: torch.Tensor, negative: torch.Tensor, max_rank: int = 64,
                         max_tokens: int = 4096, generator: torch.Generator | None = None) -> torch.Tensor | None:
    """d = ‖e‖²/H of each negative token, e its residual off the top principal subspace of the positives.

    Both inputs [M, H] / [N, H] are layer-normalised (no affine) first; the positives are
    subsampled to `max_tokens` and centred; k = min(max_rank, M − 1, H). None under 4 positives.
    """
    hidden = positive.shape[1]
    x = F.layer_norm(positive.float(), (hidden,))
    if x.shape[0] > max_tokens:
        x = x[torch.randperm(x.shape[0], generator=generator)[:max_tokens]]
    if x.shape[0] < 4:
        return None
    mu = x.mean(0)
    k = min(max_rank, x.shape[0] - 1, hidden)
    _, _, basis = torch.pca_lowrank(x - mu, q=k, center=False, niter=4)
    h = F.layer_norm(negative.float(), (hidden,)) - mu
    residual = h - (h @ basis) @ basis.T
    return (residual ** 2).sum(-1) / hidden


def svd_token_weights(hidden: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor, group_index: torch.Tensor,
                      max_rank: int = 64, max_tokens: int = 4096, q_low: float = 0.2, q_high: float = 0.8,
                      min_weight: float = 0.1) -> torch.Tensor:
    """[B,T] weights of negative tokens (1 elsewhere) in groups with both positive and negative rows."""
    weights = torch.ones_like(mask, dtype=torch.float)
    valid = mask > 0
    for g in torch.unique(group_index):
        rows = group_index == g
        pos, neg = rows & positive, rows & ~positive
        if not pos.any() or not neg.any():
            continue
        pos_tokens = valid & pos.unsqueeze(1)
        neg_tokens = valid & neg.unsqueeze(1)
        if not neg_tokens.any():
            continue
        d = projection_distances(hidden[pos_tokens], hidden[neg_tokens], max_rank, max_tokens)
        if d is not None:
            weights[neg_tokens] = distance_weights(d, q_low, q_high, min_weight)
    return weights


@ADVANTAGES.register("resrl", "ResRL: negative tokens weighted by their residual off the positives' hidden-state subspace")
def resrl(token_rewards, group_index, mask, hidden=None, base: str = "grpo", positive_scale: float = 0.1,
          max_rank: int = 64, max_tokens: int = 4096, q_low: float = 0.2, q_high: float = 0.8,
          min_weight: float = 0.1, length_start: float = 3500, length_end: float = 4096, length_floor: float = 0.7,
          **knobs):
    """ResRL (1229095296/ResRL `dp_actor.py::_compute_svd_token_weights`, spec §5). Confidence: high.

    Negative responses keep exploring (as in NSR) except where their tokens repeat the positive
    reasoning: per group with a positive (score > 0) and a negative row, the positives' penultimate-
    layer hidden states span a subspace (PCA, rank ≤ 64); a negative token's weight grows with its
    residual distance off that subspace (`distance_weights`), so negative tokens that look like
    positive reasoning are pushed down only weakly (0.1). Positives of such groups get
    `positive_scale` × A. Positive rewards are length-penalised first (`length_penalty_factor`).
    A_t comes from the `base` estimator (GRPO) on the penalised rewards.
    """
    hidden = _required("hidden", hidden)
    scores = token_rewards.sum(dim=1)
    positive = scores > 0
    factor = torch.where(positive, length_penalty_factor(mask.sum(1), length_start, length_end, length_floor),
                         torch.ones_like(scores))
    adv = ADVANTAGES.get(base)(token_rewards * factor.unsqueeze(1), group_index, mask, **knobs)
    weights = svd_token_weights(hidden, mask, positive, group_index, max_rank, max_tokens, q_low, q_high, min_weight)
    groups_mixed = torch.zeros_like(positive)
    for g in torch.unique(group_index):
        rows = group_index == g
        if (rows & positive).any() and (rows & ~positive).any():
            groups_mixed |= rows
    scale = torch.where(groups_mixed & positive, torch.full_like(scores, positive_scale), torch.ones_like(scores))
    return adv * scale.unsqueeze(1) * weights * mask


for _fn in (gae, evpo):
    _fn.requires = {"values"}
    _fn.critic = True
    _fn.value_targets = value_targets
resrl.requires = {"hidden"}
resrl.hidden_layer = -2  # the penultimate layer's output, as in the reference (`hidden_states[-2]`)
