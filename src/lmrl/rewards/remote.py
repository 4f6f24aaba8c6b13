"""Reward components scored by Ray tasks (`reward.workers: ray`): slow graders off the loop's process.

A stateless component (a registered function, per sample or per group; user files included) runs
as a Ray task that looks the function up by name in its own process and calls it with the
configured params; the workers are started (and lmrl imported in them) before the first call, so a
timeout does not pay for start-up. Its timeout is enforced for real: a task still running at `timeout_s` is
cancelled with its worker process killed, where a thread could only be abandoned. Stateful
components (registered classes: memories, reward models, judge clients) stay in the loop's process.
With `reward.concurrency` > 1, that many samples are scored at once, spread over the cluster.
"""
from __future__ import annotations

from typing import Any

from lmrl.engines.workers import _ray


def _call(name: str, params: dict[str, Any], arg: Any) -> Any:
    from lmrl.rewards.compute import find_component

    fn, _ = find_component(name)
    return fn(arg, **params)


def _warm() -> bool:
    import lmrl.rewards.compute  # noqa: F401  (the imports a first call would pay for, inside its timeout)

    return True


class RayRewardWorkers:
    """Submits component calls as Ray tasks of `cpus` CPUs each."""

    def __init__(self, workers: int = 1, cpus: float = 1.0):
        self.ray = _ray()
        self.task = self.ray.remote(num_cpus=cpus, max_retries=0)(_call)
        warm = self.ray.remote(num_cpus=cpus)(_warm)
        self.ray.get([warm.remote() for _ in range(workers)])  # start the workers before any timed call

    def run(self, name: str, params: dict[str, Any], arg: Any, timeout_s: float) -> tuple[Any, str | None]:
        """(raw value, None) or (None, problem), as the scorer's own calls report."""
        ref = self.task.remote(name, params, arg)
        try:
            return self.ray.get(ref, timeout=timeout_s), None
        except self.ray.exceptions.GetTimeoutError:
            self.ray.cancel(ref, force=True)  # kills the worker process running it
            return None, "timeout"
        except self.ray.exceptions.RayTaskError as err:
            cause = err.cause if err.cause is not None else err
            return None, f"error: {type(cause).__name__}: {cause}"
