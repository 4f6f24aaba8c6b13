"""Critic-based estimators (PPO's GAE, EVPO) and the clipped value loss that trains the value head.

A critic estimator declares `critic=True`, `requires={"values"}` (the value head's output at every
generated position, computed by the learner in a no-grad pass before `Algorithm.prepare`) and its
`value_targets`, the returns the clipped value loss regresses the value head on.
Formulas: docs/methods/ppo.md and docs/methods/evpo.md.
"""
from __future__ import annotations

import torch

from lmrl.algos.advantages import ADVANTAGES, discounted_returns, masked_whiten, required


def gae_advantages_returns(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                           gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """verl `compute_gae_advantage_return` without the whitening: (advantages, returns = A + V).

    δ_t = r_t + γ V_{t+1} − V_t and A_t = δ_t + γλ A_{t+1}, over generated positions only (masked
    positions neither update the running value nor the running advantage): t+1 is the row's next
    generated position, so a turn's advantage and return reach across an environment observation
    into the later turns, as `discounted_returns` does for reinforce_pp and EVPO's baseline.
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


@ADVANTAGES.register("gae", "GAE (PPO): λ-returns from a learned critic's values, whitened over the batch's tokens",
                     requires={"values"}, critic=True, value_targets=value_targets)
def gae(token_rewards, group_index, mask, values=None, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
        **_):
    """PPO's generalised advantage estimation (verl `compute_gae_advantage_return`). Confidence: high.

    Needs the critic's values at every generated position (`algo.critic: true`). γ = λ = 1 as in
    verl's defaults; `whiten` normalises the advantages over all valid tokens of the batch.
    """
    adv, _ = gae_advantages_returns(token_rewards, required("values", values), mask, gamma, lam)
    return masked_whiten(adv, mask) if whiten else adv


@ADVANTAGES.register("evpo", "EVPO: critic (GAE) advantages when the critic's explained variance > 0, else batch-mean baseline",
                     requires={"values"}, critic=True, value_targets=value_targets)
def evpo(token_rewards, group_index, mask, values=None, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True,
         ev_threshold: float = 0.0, **_):
    """EVPO (arXiv 2604.19485; docs/methods/evpo.md). Confidence: medium (gate and threshold explicit;
    per-token details are lmrl's).

    EV = 1 − Var(R − V)/Var(R) over the batch's valid tokens, R = the GAE λ-returns (the critic's
    targets). EV > `ev_threshold` (0): the critic reduces variance, use the GAE advantages (PPO,
    whitened when `whiten`). Otherwise the batch-mean baseline A_t = G_t − mean(G), G the
    Monte-Carlo return-to-go (`discounted_returns`: = the outcome reward when γ = 1; it flows across
    environment observations like the GAE returns) and the mean over valid tokens.
    A batch whose returns do not vary has no EV and takes the baseline branch. The critic trains
    in both branches, so the gate can switch back.
    """
    values = required("values", values)
    adv, returns = gae_advantages_returns(token_rewards, values, mask, gamma, lam)
    ev = explained_variance(returns, values, mask)
    if ev > ev_threshold:
        return masked_whiten(adv, mask) if whiten else adv
    mc = discounted_returns(token_rewards, mask, gamma)
    baseline = mc[mask > 0].mean() if (mask > 0).any() else torch.zeros(())
    return (mc - baseline) * mask
