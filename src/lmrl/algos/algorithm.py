"""An Algorithm is a named bundle of registry choices, built from `AlgoConfig`.

It turns a rollout batch into per-token advantages (`prepare`) and defines the objective the
learner minimises (`objective`). The learner only sees these two methods, never the names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.advantages import ADVANTAGES, outcome_to_token_rewards
from lmrl.algos.aggregation import AGGREGATIONS, AggScale
from lmrl.algos.kl import KL_ESTIMATORS, k1
from lmrl.algos.losses import LOSSES, LossInputs
from lmrl.algos.shaping import overlong_penalty
from lmrl.config import AlgoConfig
from lmrl.types import Batch


@dataclass
class Algorithm:
    cfg: AlgoConfig
    max_new_tokens: int

    def __post_init__(self):
        self.advantage_fn = ADVANTAGES.get(self.cfg.advantage)
        self.loss_fn = LOSSES.get(self.cfg.loss)
        self.aggregate = AGGREGATIONS.get(self.cfg.aggregation)
        self.kl_fn = KL_ESTIMATORS.get(self.cfg.kl_estimator)

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    @property
    def needs_entropy_grad(self) -> bool:
        """Exact per-token entropy is computed when the bonus or the loss itself uses it."""
        return self.cfg.entropy_coef != 0 or getattr(self.loss_fn, "needs_entropy", False)

    def inert_rows(self, batch: Batch) -> torch.Tensor:
        """[B] bool: rows whose loss and gradient are exactly zero, so the learner may skip them.

        True where every advantage of the row is 0, the loss is declared zero there
        (`zero_at_zero_advantage`: row-local and proportional to A), and no KL or entropy term
        would still pull on the row. Denominators stay those of the whole batch (`scale`).
        """
        rows = batch.completion_mask.shape[0]
        if (not getattr(self.loss_fn, "zero_at_zero_advantage", False) or self.cfg.entropy_coef != 0
                or (self.cfg.kl_coef > 0 and not self.cfg.kl_in_reward) or batch.advantages is None):
            return torch.zeros(rows, dtype=torch.bool)
        return ((batch.advantages != 0) & (batch.completion_mask > 0)).sum(1) == 0

    def scale(self, mask: torch.Tensor) -> AggScale:
        return AggScale.of(mask, self.cfg.horizon or self.max_new_tokens)

    def prepare(self, batch: Batch) -> dict[str, float]:
        """Shape rewards and fill `batch.advantages` (uses `batch.extras['ref_logp']` if present)."""
        mask = batch.completion_mask
        rewards = batch.sequence_rewards.clone()
        metrics: dict[str, float] = {}
        if self.cfg.overlong_buffer > 0:
            penalty = overlong_penalty(mask.sum(1), self.max_new_tokens, self.cfg.overlong_buffer,
                                       self.cfg.overlong_factor)
            rewards = rewards + penalty
            metrics["overlong_penalty"] = float(penalty.mean())
        batch.extras.setdefault("rollout_logp", batch.behaviour_logprobs)
        token_rewards = outcome_to_token_rewards(rewards, mask)
        if self.cfg.kl_in_reward:
            kl = k1(batch.behaviour_logprobs, batch.extras["ref_logp"]) * mask
            token_rewards = token_rewards - self.cfg.kl_coef * kl
            metrics["kl_in_reward"] = float(kl.sum() / mask.sum().clamp(min=1))
        batch.advantages = self.advantage_fn(token_rewards, batch.group_index, mask, **self.cfg.advantage_params)
        valid = batch.advantages[mask > 0]
        metrics["advantage/mean"] = float(valid.mean()) if valid.numel() else 0.0
        metrics["advantage/abs_mean"] = float(valid.abs().mean()) if valid.numel() else 0.0
        return metrics

    def objective(self, inputs: LossInputs, scale: AggScale) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss of one micro-batch, normalised by batch-level denominators."""
        token_loss, metrics = self.loss_fn(inputs, eps_low=self.cfg.eps_low, eps_high=self.cfg.eps_high,
                                           dual_clip=self.cfg.dual_clip, **self.cfg.loss_params)
        metrics = dict(metrics)
        metrics["pg_loss"] = float(self.aggregate(token_loss.detach(), inputs.mask, AggScale.of(inputs.mask)))
        if self.cfg.kl_coef > 0 and not self.cfg.kl_in_reward:
            kl = self.kl_fn(inputs.logp, inputs.ref_logp)
            token_loss = token_loss + self.cfg.kl_coef * kl
            metrics["kl"] = float((kl.detach() * inputs.mask).sum() / inputs.mask.sum().clamp(min=1))
        if self.cfg.entropy_coef != 0:
            token_loss = token_loss - self.cfg.entropy_coef * inputs.entropy
        return self.aggregate(token_loss, inputs.mask, scale), metrics
