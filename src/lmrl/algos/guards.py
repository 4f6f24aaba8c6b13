"""Failure-mode guards for small-model PPO: detect a run going bad and roll it back (docs/guards.md).

Small policies trained with PPO-style losses fail in a few recognisable ways: the importance ratio
π_θ/π_behaviour explodes (many tokens far outside the trust region), a loss or gradient turns NaN
or infinite, or the token entropy collapses. `bad_signals` reads one step's metrics and names the
failures it shows; `Guard` counts bad steps in a row and trips after `patience` of them. The
rollback itself (restoring the last checkpoint saved before the bad streak, then `scale_lr`) is
the run's, not the algorithm's: `loops.run_state.RunState.rollback`, which restores the same list
of parts `--resume` does. After `max_rollbacks` rollbacks the next trip stops the run with a
`GuardError`.

The guard is a state of the algorithm (`algos/state.py`), built when `algo.guards.enabled`, so it
is saved in checkpoints and restored on resume like the method controllers. The loop's one call
is `RunState.guard_step` after each step's update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.config import GuardConfig

SIGNALS = ("ratio", "nonfinite", "entropy")
RATIO_METRIC = "guard/ratio_outside"
FINITE_METRICS = ("pg_loss", "grad_norm", "entropy", "kl", "mismatch_kl")


class GuardError(RuntimeError):
    """The guard tripped and no rollback is left (or possible): the run stops."""


def ratio_outside(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, bound: float) -> float:
    """Share of valid tokens whose importance ratio π_θ/π_behaviour lies outside [1/bound, bound].

    Non-finite log-ratios count as outside; 0.0 without valid tokens."""
    log_ratio = (logp.detach() - behaviour_logp).float()
    outside = ~(log_ratio.abs() <= math.log(bound))  # NaN compares False, so it counts as outside
    valid = mask > 0
    return float((outside & valid).sum() / valid.sum().clamp(min=1))


def bad_signals(metrics: dict[str, float], cfg: GuardConfig) -> list[str]:
    """The failures one step's metrics show, in `SIGNALS` order.

    ratio: `guard/ratio_outside` above `max_ratio_share`. nonfinite: the learner skipped an optimiser
    step for a non-finite loss or gradient (`skipped_updates` > 0 beside a `grad_norm`), or a loss,
    gradient norm, entropy or KL metric is NaN or infinite. entropy: `entropy` below `min_entropy`.
    A step without an update (no `grad_norm`) shows none.
    """
    out = []
    if metrics.get(RATIO_METRIC, 0.0) > cfg.max_ratio_share:
        out.append("ratio")
    updated = "grad_norm" in metrics
    if (updated and metrics.get("skipped_updates", 0.0) > 0) or any(
            not math.isfinite(metrics[k]) for k in FINITE_METRICS if k in metrics):
        out.append("nonfinite")
    entropy = metrics.get("entropy")
    if cfg.min_entropy is not None and entropy is not None and entropy < cfg.min_entropy:
        out.append("entropy")
    return out


@dataclass
class Verdict:
    """The guard's reading of one step: whether it tripped, why, and since which step things went bad."""

    tripped: bool
    reasons: tuple[str, ...]
    since: int | None  # first step of the current bad streak (None: the step was fine)
    metrics: dict[str, float] = field(default_factory=dict)


class Guard:
    """Counts consecutive bad steps; trips after `cfg.patience` of them (see `bad_signals`)."""

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.streak = 0
        self.since: int | None = None
        self.rollbacks = 0

    def token_metrics(self, logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """The per-token statistic the ratio check reads, logged from every training micro-batch."""
        return {RATIO_METRIC: ratio_outside(logp, behaviour_logp, mask, self.cfg.ratio_bound)}

    def check(self, step: int, metrics: dict[str, float]) -> Verdict:
        """Read step `step`'s metrics; a trip resets the streak (the rollback starts a new one)."""
        reasons = tuple(bad_signals(metrics, self.cfg))
        if reasons:
            self.streak += 1
            self.since = step if self.since is None else self.since
        else:
            self.streak, self.since = 0, None
        tripped = self.streak >= self.cfg.patience
        verdict = Verdict(tripped, reasons, self.since, {
            "guard/bad": float(bool(reasons)), "guard/streak": float(self.streak), "guard/tripped": float(tripped),
            "guard/rollbacks": float(self.rollbacks),
            **{f"guard/{s}": float(s in reasons) for s in SIGNALS}})
        if tripped:
            self.streak, self.since = 0, None
        return verdict

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "since": self.since, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak, self.since, self.rollbacks = int(state["streak"]), state["since"], int(state["rollbacks"])


def scale_lr(optimizer, scheduler, factor: float) -> None:
    """Multiply every parameter group's learning rate, and the schedule's base rates, by `factor`.

    The base rates are part of the scheduler's state, so checkpoints keep the lowered rate."""
    for group in optimizer.param_groups:
        group["lr"] *= factor
    scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
