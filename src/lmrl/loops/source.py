"""What the step loop (`loops.loop`) asks of a batch source, and the record a source hands it.

A source makes each step's batch: inline (`loops.inline`, made when the step asks) or in the
background (`loops.background`, made ahead from earlier policy versions, whole or in chunks). The
loop names neither: it takes a step's batch, learns, lets the source publish the new weights, pauses
it while evaluating, adds its state to each checkpoint and lets it restart after a guard rollback.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from lmrl.types import Group


@dataclass
class Rollout:
    """One step's batch (or one chunk of it), as its source made it."""

    step: int
    version: int  # the policy version that generated it
    seen: list[Group]
    kept: list[Group]
    metrics: dict[str, float]
    seconds: float  # making it, scoring included
    generated: int
    reward_seconds: float = 0.0  # of `seconds`, the time spent in the reward scorer
    chunk: int = 0  # its index among the step's `chunks`
    chunks: int = 1
    made_at: float = 0.0  # perf_counter when it was queued
    trained: int = 0  # an offline batch's trained tokens (a rollout's are `generated`)


class FollowingSource:
    """The parts of a batch source whose engine follows the learner's weights and which holds nothing between
    steps (`loops.inline`, `loops.offline`): no live parts, no state of its own in checkpoints; after a guard
    rollback the restored weights are published as after an update (`after_update`)."""

    live_parts: tuple[str, ...] = ()

    def start(self) -> None:
        pass

    def step_metrics(self, step: int, rollout: Rollout, waited: float) -> dict[str, float]:
        return {}

    def checkpoint_state(self, step: int, read_parts) -> dict[str, Any]:
        return {}

    @contextmanager
    def restarting(self, step: int):
        yield
        self.after_update(step, self.s.model, True)

    def stop(self) -> None:
        pass


class BatchSource(Protocol):
    """Where the step loop's batches come from.

    `live_parts`: the `RunState` parts the source moves on its own between steps (a background
    source keeps sampling); the loop reads them only through `checkpoint_state`."""

    eval_engine: Any  # the engine evaluation generates with
    live_parts: tuple[str, ...]

    def start(self) -> None:
        """Begin making batches (after the evaluation at start)."""

    def take(self, step: int) -> Rollout:
        """Step `step`'s batch, or its next chunk."""

    def after_update(self, step: int, model, updated: bool) -> dict[str, float]:
        """Publish `model`'s weights as version `step` (`updated`: the step changed them); metrics."""

    def step_metrics(self, step: int, rollout: Rollout, waited: float) -> dict[str, float]:
        """The source's own metrics of step `step` (`waited`: seconds the learner waited for its batch)."""

    def paused(self) -> AbstractContextManager:
        """While it is held the source makes nothing (evaluation shares the scorer)."""

    def checkpoint_state(self, step: int, read_parts) -> dict[str, Any]:
        """What a checkpoint after step `step` adds to the loop's boundary: the live parts, read by
        `read_parts(names)` when they are consistent with the batches the source still holds, and those."""

    def restarting(self, step: int) -> AbstractContextManager:
        """Around a guard rollback: stop, let the training state be restored, then go on making the
        batches of steps after `step` from the restored state and weights (published as version `step`)."""

    def stop(self) -> None:
        """Stop for good, releasing what the source holds."""
