"""f-divergence regularisers D_f(π‖π_ref) and their closed-form optimal policies (docs/methods/f_divergence.md).

f-divergence-regularised RLHF (arXiv 2605.06977, ICML 2026) — confidence medium for the objective
and the closed form; the paper's exploration rules (optimism, derivative-as-uncertainty) are not
implemented (their bonus form was not retrieved, confidence low).

Objective J(π) = E_π[r] − η⁻¹ D_f(π‖π₀) with D_f(π‖π₀) = E_π₀[f(π/π₀)], f convex, f(1) = 0.
Its maximiser is π*(a) = π₀(a)·h(η(r(a) − λ)), h = (f′)⁻¹, λ normalising (`optimal_policy`).

Per-token sample estimators (`DIVERGENCES`, samples drawn from π, u = π/π₀ = exp(logp − ref_logp)):
- plain: f(u)/u, since E_π[f(u)/u] = E_π₀[f(u)]. For reverse KL this is k1.
- low-variance (default): (f(u) − f′(1)(u − 1))/u. Unbiased too (E_π₀[u − 1] = 0) and ≥ 0 by
  convexity; for reverse KL it is k3 = e^d − d − 1, d = ref_logp − logp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from lmrl.algos.kl import KL_ESTIMATORS
from lmrl.registry import Registry


@dataclass(frozen=True)
class FDivergence:
    """One generator f, given by f(u)/u as a function of t = log u, f′(1), and h = (f′)⁻¹."""

    per_sample: Callable[[torch.Tensor], torch.Tensor]  # t = log(π/π₀) ↦ f(e^t)/e^t
    f_prime_one: float
    h: Callable[[torch.Tensor], torch.Tensor]  # inverse of f′, increasing; +inf where unbounded

    def __call__(self, logp: torch.Tensor, ref_logp: torch.Tensor, low_variance: bool = True,
                 clamp: float | None = 10.0) -> torch.Tensor:
        """Per-token estimate of D_f(π‖π_ref); the log-ratio is clamped to ±20 and the result to ±clamp."""
        t = (logp - ref_logp).clamp(-20.0, 20.0)
        value = self.per_sample(t)
        if low_variance:
            value = value - self.f_prime_one * (1 - torch.exp(-t))
        return value if clamp is None else value.clamp(-clamp, clamp)


DIVERGENCES: Registry = Registry("f-divergence")

DIVERGENCES.register("reverse_kl", "reverse KL(π‖π_ref): f = u log u, h(z) = exp(z − 1) (softmax tilting)")(
    FDivergence(per_sample=lambda t: t, f_prime_one=1.0, h=lambda z: torch.exp(z - 1)))

DIVERGENCES.register("forward_kl", "forward KL(π_ref‖π): f = −log u, h(z) = −1/z for z < 0")(
    FDivergence(per_sample=lambda t: -t * torch.exp(-t), f_prime_one=-1.0,
                h=lambda z: torch.where(z < 0, -1 / z.clamp(max=-1e-300), torch.full_like(z, torch.inf))))

DIVERGENCES.register("chi2", "Pearson χ²: f = (u − 1)², h(z) = max(0, 1 + z/2)")(
    FDivergence(per_sample=lambda t: torch.exp(t) - 2 + torch.exp(-t), f_prime_one=0.0,
                h=lambda z: (1 + z / 2).clamp(min=0)))


def optimal_policy(pi0: torch.Tensor, r: torch.Tensor, eta: float, kind: str,
                   iters: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form maximiser of E_π[r] − η⁻¹ D_f(π‖π₀) over the simplex (last dim = actions).

    Returns (π*, λ) with π* = π₀·h(η(r − λ)); λ (shape [..., 1]) is found by bisection so that
    Σ π* = 1. The sum decreases in λ, and h(f′(1)) = 1 brackets λ in
    [min r − f′(1)/η, max r − f′(1)/η]. Actions with π₀ = 0 keep probability 0.
    """
    if eta <= 0:
        raise ValueError("eta must be positive")
    div = DIVERGENCES.get(kind)
    p0, rew = pi0.double(), r.double()

    def tilt(lam: torch.Tensor) -> torch.Tensor:
        return torch.where(p0 > 0, p0 * div.h(eta * (rew - lam)), torch.zeros_like(p0))

    lo = rew.min(dim=-1, keepdim=True).values - div.f_prime_one / eta
    hi = rew.max(dim=-1, keepdim=True).values - div.f_prime_one / eta
    for _ in range(iters):
        mid = (lo + hi) / 2
        too_much = tilt(mid).sum(dim=-1, keepdim=True) > 1
        lo, hi = torch.where(too_much, mid, lo), torch.where(too_much, hi, mid)
    lam = (lo + hi) / 2
    pi = tilt(hi)
    return (pi / pi.sum(dim=-1, keepdim=True)).to(pi0.dtype), lam.to(pi0.dtype)


def _as_regulariser(name: str):
    """D_f as a loss term: the low-variance estimate with an exact-in-expectation gradient.

    Samples come from π itself, so ∇E_π[g] = E_π[∇g + g·∇log π]: the term g + sg(g)·(logp − sg(logp))
    has the value g and that gradient (per token, each token's distribution taken on its own, as the
    KL terms of GRPO are). Used with `algo.kl_coef` = η⁻¹ through the KL estimator registry.
    """
    divergence = DIVERGENCES.get(name)

    def regulariser(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        value = divergence(logp, ref_logp)
        return value + value.detach() * (logp - logp.detach())

    return regulariser


for _name in DIVERGENCES.names():
    KL_ESTIMATORS.register(f"f_{_name}", f"f-divergence regulariser D_f(π‖π_ref), f = {_name}, "
                                         "low-variance estimate with the score-function gradient term")(
        _as_regulariser(_name))
