"""Rollouts spread over workers, each an `hf` engine with its own copy of the weights (`dist:` config).

`WorkerPool` is an engine like the others: `generate` splits the prompts into one contiguous chunk
per worker and samples each chunk from a seed drawn from the run's generator, so the tokens depend
on the seeds and the split, never on where or when a worker runs: workers in this process
(`dist.backend: local`) and Ray actors (`ray`) give the same tokens. `update_weights` sends one
version to every worker (for actors, through Ray's object store, put once). A worker that dies (its
process killed, its node gone) is started again from the model it was built with, given the current
version, and its chunk runs again with the same seed: the same tokens, and the run goes on.
docs/scaling.md.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from lmrl.engines.hf import HFEngine
from lmrl.models.weights import detached_copy, inference_weights

SEED_LIMIT = 2**62


class RolloutWorker:
    """One worker: an `hf` engine over its own model, sampling a chunk of prompts from a given seed."""

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool, threads: int):
        self.engine = HFEngine(model, eos_token_ids, pad_token_id, bf16=bf16)
        self.threads = threads

    def load(self, weights: dict[str, torch.Tensor], version: int) -> int:
        self.engine.update_weights(weights, version)
        return version

    def generate(self, prompts, n, params, seed: int):
        torch.set_num_threads(self.threads)
        return self.engine.generate(prompts, n, params, torch.Generator().manual_seed(seed))


class WorkerPool:
    """The `Engine` protocol over `workers` rollout workers, in this process or as Ray actors."""

    shares_module = False  # each worker holds its own weights, loaded by update_weights

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, bf16: bool, *, workers: int = 2,
                 threads: int = 1, backend: str = "local", max_restarts: int = 3):
        self.model, self.pad_token_id, self.backend, self.max_restarts = model, pad_token_id, backend, max_restarts
        self.version, self.restarts, self.weights = 0, 0, None
        self.args = (eos_token_ids, pad_token_id, bf16, threads)
        if backend == "ray":
            self.ray = ray_session()
            self.actor_class = self.ray.remote(num_cpus=threads, max_restarts=0)(RolloutWorker)
            self.model_ref = self.ray.put(detached_copy(model))
            self.placement, self.first_bundle, self.own_placement = _placement(self.ray, workers, threads)
        elif backend == "local":
            self.threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout-worker")
        else:
            raise ValueError(f"dist.backend must be local or ray for a worker pool, got {backend!r}")
        self.workers = [self._start(i) for i in range(workers)]

    def _start(self, index: int):
        if self.backend == "local":
            return RolloutWorker(detached_copy(self.model), *self.args)
        strategy = self.ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=self.placement, placement_group_bundle_index=self.first_bundle + index)
        return self.actor_class.options(scheduling_strategy=strategy).remote(self.model_ref, *self.args)

    def update_weights(self, named_tensors: dict[str, torch.Tensor] | None, version: int) -> dict[str, float]:
        """Send `named_tensors` (None: the learner's module now) to every worker as `version`."""
        weights = named_tensors if named_tensors is not None else dict(inference_weights(self.model))
        self.weights = self.ray.put(weights) if self.backend == "ray" else weights
        self.version = version
        self._wait([self._call(w, "load", self.weights, version) for w in self.workers])
        return {}

    def generate(self, prompts, n, params, generator: torch.Generator | None = None):
        if not prompts:
            return []
        results = self._run(chunk_jobs(prompts, n, params, generator, len(self.workers)))
        return [group for i in sorted(results) for group in results[i]]

    def _run(self, jobs: dict) -> dict:
        """Every job's result; a worker that dies is started again, given the weights, and its job re-run."""
        pending = {i: self._call(self.workers[i], "generate", *job) for i, job in jobs.items()}
        results = {}
        while pending:
            i, future = next(iter(pending.items()))
            try:
                results[i] = self._wait([future])[0]
                del pending[i]
            except Exception as err:
                if not self._died(err) or self.restarts >= self.max_restarts:
                    raise
                self.restarts += 1
                say_restart("rollout worker", i, err, self.restarts, self.max_restarts)
                self.workers[i] = self._start(i)
                if self.weights is not None:
                    self._wait([self._call(self.workers[i], "load", self.weights, self.version)])
                pending[i] = self._call(self.workers[i], "generate", *jobs[i])
        return results

    def _call(self, worker, method: str, *args):
        if self.backend == "ray":
            return getattr(worker, method).remote(*args)
        return self.threads.submit(getattr(worker, method), *args)

    def _wait(self, futures: list) -> list:
        return self.ray.get(futures) if self.backend == "ray" else [f.result() for f in futures]

    def _died(self, err: Exception) -> bool:
        return self.backend == "ray" and isinstance(err, (self.ray.exceptions.RayActorError,
                                                          self.ray.exceptions.WorkerCrashedError))

    def close(self) -> None:
        if self.backend == "ray":
            for w in self.workers:
                self.ray.kill(w)
            if self.own_placement:
                self.ray.util.remove_placement_group(self.placement)
        else:
            self.threads.shutdown()


def chunk_jobs(prompts: list, n: int, params, generator: torch.Generator | None, workers: int) -> dict[int, tuple]:
    """Worker index -> (its contiguous chunk of `prompts`, n, params, its seed): a batch split over `workers`,
    each chunk sampled from a seed drawn from the run's generator (empty chunks left out)."""
    chunks = split_evenly(len(prompts), workers)
    seeds = chunk_seeds(generator, len(chunks))
    return {i: (prompts[a:b], n, params, seed) for i, ((a, b), seed) in enumerate(zip(chunks, seeds)) if b > a}


def say_restart(what: str, index: int, reason, restarts: int, limit: int) -> None:
    """Show, when it happens, that a worker or server died and was started again (its chunk re-run)."""
    print(f"{what} {index} died ({str(reason).splitlines()[0] if str(reason) else type(reason).__name__}); "
          f"started again, its prompts re-run with the same seed (restart {restarts} of "
          f"dist.max_restarts={limit})", file=sys.stderr, flush=True)


def chunk_seeds(generator: torch.Generator | None, chunks: int) -> list[int]:
    """One sampling seed per chunk of a batch, drawn from the run's generator."""
    return torch.randint(SEED_LIMIT, (chunks,), generator=generator).tolist()


def split_evenly(items: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous (start, end) ranges covering `items`, sizes differing by at most one."""
    size, extra = divmod(items, parts)
    bounds, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        bounds.append((start, end))
        start = end
    return bounds


def _placement(ray, workers: int, threads: int):
    """(placement group, its first bundle for the workers, whether the pool made it): the group this
    process's actor runs in when it has a bundle per worker after its own (`loops.on_ray`), else a new one."""
    current = ray.util.get_current_placement_group()
    if current is not None and len(current.bundle_specs) == workers + 1:
        return current, 1, False
    group = ray.util.placement_group([{"CPU": threads}] * workers, strategy="PACK")
    ray.get(group.ready())
    return group, 0, True


def ray_session(cpus: int = 0):
    """Ray, joined or started: a cluster named by RAY_ADDRESS is joined as it is; a local one started here
    counts `cpus` logical CPUs when the run reserves more than the machine has (its actors then share cores)."""
    try:
        import ray
    except ImportError as err:
        raise ImportError("dist.backend: ray needs Ray: pip install 'lmrl[ray]'") from err
    if not ray.is_initialized():
        local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": max(os.cpu_count() or 1, cpus)}
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **local)
    return ray
