"""Where a run's loop runs: in this process (`loops.loop.train_here`) or, with `dist.backend: ray`,
inside a Ray actor beside its rollout actors (`loops.on_ray`)."""
from __future__ import annotations

from pathlib import Path

from lmrl.config import Config
from lmrl.loops.loop import RunResult, train_here
from lmrl.loops.on_ray import train_on_ray
from lmrl.loops.setup import Stages


def train(cfg: Config, resume: Path | None = None, stages: Stages | None = None) -> RunResult:
    """Run `cfg` to completion (or continue the run directory `resume` from its last complete checkpoint).

    Killed at any moment, a run resumed with `resume` ends with the same weights, optimiser state and
    logs as if it had never stopped (docs/runs.md). With `dist.backend: ray` (and no `stages` given)
    the loop runs inside a Ray actor, beside its rollout actors.
    """
    if cfg.dist.backend == "ray" and stages is None:
        return train_on_ray(cfg, resume)
    return train_here(cfg, resume, stages)
