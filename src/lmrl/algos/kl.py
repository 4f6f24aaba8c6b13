"""KL estimators between the policy and a reference, per token (Schulman's k1/k2/k3)."""
from __future__ import annotations

import torch

from lmrl.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")


@KL_ESTIMATORS.register("k1", "k1: log p - log p_ref (unbiased, high variance)")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


@KL_ESTIMATORS.register("k2", "k2: 0.5 (log p - log p_ref)^2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3", "k3 (low-variance KL): exp(d) - d - 1 with d = log p_ref - log p, clamped to [-10, 10]")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(-10.0, 10.0)
