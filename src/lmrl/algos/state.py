"""State an estimator or loss keeps between training steps: controllers, running statistics, replays.

Some methods are not a function of one batch: GEPO thresholds group entropies against their
history, ACRL adapts its trust band from the discrepancy it measured, PIPO judges the last update
by the reward window and replays the previous batch. Such a function declares `fn.state`, a class
built once per run from the function's knobs (`algo.advantage_params` or `algo.loss_params`; the
names in its `knobs` tuple are consumed by the state and not passed to the function). The
`Algorithm` calls its hooks; the loop and the learner never see which method runs:

- `before_prepare(batch)`: put inputs into the batch (`context`, `extras`) before its advantages;
- `after_update(batch, metrics) -> dict`: learn from the finished update (its averaged metrics);
  returns metrics to log;
- `replay(batch) -> Batch | None`: a batch for one extra update after this one (its advantages are
  computed by the same estimator, with the inputs the state put into it);
- `state_dict()` / `load_state_dict(state)`: saved in checkpoints, so resume continues the state.

Every hook is optional.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from lmrl.algos.methods_control import AcrlController, PolicyImprovementMonitor, check_acrl_controller, pipo_verdict
from lmrl.algos.methods_group import GroupEntropyStats, _per_group_token_mean


def state_knobs(fn) -> tuple[str, ...]:
    """Knob names the function's state consumes (empty without a state)."""
    return tuple(getattr(getattr(fn, "state", None), "knobs", ()))


def build_state(fn, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(state object or None, the knobs left for the function itself)."""
    cls = getattr(fn, "state", None)
    if cls is None:
        return None, dict(params)
    return cls(**params), {k: v for k, v in params.items() if k not in cls.knobs}


class GepoHistory:
    """GEPO's μ_H, σ_H: an exponentially weighted history of group entropies (`GroupEntropyStats`).

    Before each batch's advantages: the history so far becomes the thresholds' `entropy_mean` /
    `entropy_std` (none on the first batch: GEPO then uses this batch's own statistics), then this
    batch's group entropies join the history. Knob `entropy_decay` (0.9 per batch).
    """

    knobs = ("entropy_decay",)

    def __init__(self, entropy_decay: float = 0.9, **_):
        if not 0 <= entropy_decay < 1:
            raise ValueError(f"entropy_decay must be in [0, 1), got {entropy_decay}")
        self.stats = GroupEntropyStats(decay=entropy_decay)

    def before_prepare(self, batch) -> None:
        if self.stats.mean is not None:
            batch.context.update(entropy_mean=self.stats.mean, entropy_std=self.stats.std)
        per_group, _ = _per_group_token_mean(batch.extras["token_entropy"], batch.group_index, batch.completion_mask)
        self.stats.update(per_group)

    def after_update(self, batch, metrics: dict[str, float]) -> dict[str, float]:
        return {"gepo/entropy_mean": self.stats.mean, "gepo/entropy_std": self.stats.std}

    def state_dict(self) -> dict:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state)


class AcrlBand:
    """ACRL's trust band c, adapted after every update from the measured discrepancy D.

    The band goes to the loss as `extras["acrl_band"]` (one value per row); after the update,
    `acrl/discrepancy` (mean k3 of the rollout vs the trained policy) moves it: c/κ above
    `acrl_d_high`, c·κ below `acrl_d_low`, kept in [`acrl_band_min`, `acrl_band_max`]. It starts
    at the loss knob `acrl_band`. `acrl_adaptive: false` keeps the band fixed.
    """

    knobs = ("acrl_d_low", "acrl_d_high", "acrl_kappa", "acrl_band_min", "acrl_band_max", "acrl_adaptive")

    def __init__(self, acrl_band: float = 2.0, acrl_d_low: float = 1e-3, acrl_d_high: float = 1e-2,
                 acrl_kappa: float = 1.25, acrl_band_min: float = 1.1, acrl_band_max: float = 10.0,
                 acrl_adaptive: bool = True, **_):
        self.adaptive = acrl_adaptive
        check_acrl_controller(acrl_d_low, acrl_d_high, acrl_kappa, acrl_band_min, acrl_band_max)
        if acrl_adaptive and not acrl_band_min <= acrl_band <= acrl_band_max:
            raise ValueError(f"acrl_band={acrl_band} must lie in [acrl_band_min, acrl_band_max] = "
                             f"[{acrl_band_min}, {acrl_band_max}] when the band adapts")
        self.controller = AcrlController(acrl_band, acrl_d_low, acrl_d_high, acrl_kappa, acrl_band_min, acrl_band_max)

    def before_prepare(self, batch) -> None:
        batch.extras["acrl_band"] = torch.full((batch.num_rows,), float(self.controller.band))

    def after_update(self, batch, metrics: dict[str, float]) -> dict[str, float]:
        discrepancy = metrics.get("acrl/discrepancy")
        if self.adaptive and discrepancy is not None and math.isfinite(discrepancy):
            self.controller.update(discrepancy)
        return {"acrl/next_band": self.controller.band}

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


class PipoReplay:
    """PIPO's closed loop: the window of batch-mean rewards and the previous batch to replay.

    Step t: the batch B_t gets the base advantages (no verdict inputs); after its update, B_{t−1}
    comes back for one extra update with `reward_window` (the K earlier batch means) and
    `current_reward_mean` μ_t, so `pipo` gives it ξ_t·Â_{t−1}. No replay until the window holds 2
    means, and none while the verdict is 0 (it would only move Adam's momentum). μ_t is the mean
    reward of the sampled rows (demonstration rows left out). The replay does not advance the
    learning-rate schedule. Knob `pipo_window` (K = 4). The window is checkpointed; the stored batch
    is not, so the first step after a resume has no replay.
    """

    knobs = ("pipo_window",)

    def __init__(self, pipo_window: int = 4, eps: float = 1e-6, verdict_clip: float | None = 5.0, **_):
        self.monitor = PolicyImprovementMonitor(size=int(pipo_window), eps=eps, verdict_clip=verdict_clip)
        self.previous = None
        self.current: float | None = None

    def before_prepare(self, batch) -> None:
        sampled = batch.row_extras.get("demonstration", torch.zeros(batch.num_rows)) == 0
        self.current = float(batch.sequence_rewards[sampled].mean())

    def replay(self, batch):
        previous, self.previous = self.previous, batch
        window = list(self.monitor.window)
        self.monitor.push(self.current)
        if previous is None or len(window) < 2:
            return None
        if pipo_verdict(window, self.current, self.monitor.eps, self.monitor.verdict_clip) == 0:
            return None
        previous.context.update(reward_window=window, current_reward_mean=self.current)
        previous.extras.pop("old_logp", None)  # the replay's proximal policy is the current one
        return previous

    def after_update(self, batch, metrics: dict[str, float]) -> dict[str, float]:
        window = self.monitor.window
        return {"pipo/verdict": self.monitor.verdict(self.current) if len(window) >= 2 else 0.0}

    def state_dict(self) -> dict:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.monitor.load_state_dict(state)


def _attach() -> None:
    from lmrl.algos.methods_control import acrl, pipo
    from lmrl.algos.methods_group import gepo

    gepo.state, acrl.state, pipo.state = GepoHistory, AcrlBand, PipoReplay


_attach()
