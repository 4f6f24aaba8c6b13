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

from typing import Any, Callable

from lmrl.engines.workers import ray_session

Lookup = Callable[[str], tuple[Any, bool]]  # a component name -> (its function, whether it scores groups)


def _call(lookup: Lookup, name: str, params: dict[str, Any], arg: Any) -> Any:
    fn, _ = lookup(name)
    return fn(arg, **params)


def _warm(lookup: Lookup) -> bool:
    return callable(lookup)  # receiving it imported its module: the imports a first call would pay for


class RayRewardWorkers:
    """Submits component calls as Ray tasks of `cpus` CPUs each; `lookup` (the scorer's `find_component`,
    sent by reference) finds a component by name inside the worker."""

    def __init__(self, lookup: Lookup, workers: int = 1, cpus: float = 1.0):
        self.ray = ray_session()
        self.lookup = lookup
        self.task = self.ray.remote(num_cpus=cpus, max_retries=0)(_call)
        warm = self.ray.remote(num_cpus=cpus)(_warm)
        self.ray.get([warm.remote(lookup) for _ in range(workers)])  # start the workers before any timed call

    def run(self, name: str, params: dict[str, Any], arg: Any, timeout_s: float) -> tuple[Any, str | None]:
        """(raw value, None) or (None, problem), as the scorer's own calls report."""
        ref = self.task.remote(self.lookup, name, params, arg)
        try:
            return self.ray.get(ref, timeout=timeout_s), None
        except self.ray.exceptions.GetTimeoutError:
            self.ray.cancel(ref, force=True)  # kills the worker process running it
            return None, "timeout"
        except self.ray.exceptions.RayTaskError as err:
            cause = err.cause if err.cause is not None else err
            return None, f"error: {type(cause).__name__}: {cause}"
