"""Training on a Ray cluster: the loop and its learner in one actor, the rollout workers in others.

`train_on_ray` reserves one placement group: bundle 0 for the learner (`trainer.threads` CPUs, and
a GPU when `trainer.device` is CUDA), bundles 1…N for the N rollout workers (`dist.worker_threads`
CPUs each). The learner actor runs the same `train` as one process does; the `WorkerPool` it builds
finds the placement group it runs in and puts its rollout actors in the other bundles. The run
directory must be on a filesystem the learner's node sees (the driver's, on one machine).
"""
from __future__ import annotations

from pathlib import Path

from lmrl.config import Config
from lmrl.engines.workers import _ray
from lmrl.loops.sync import RunResult, train_here
from lmrl.models.device import resolve_device
from lmrl.models.threads import choose_threads

PLACEMENT_TIMEOUT_S = 60


class LearnerActor:
    """Runs the training loop where Ray placed it."""

    def train(self, cfg: Config, resume: Path | None) -> RunResult:
        return train_here(cfg, resume)


def train_on_ray(cfg: Config, resume: Path | None = None) -> RunResult:
    ray = _ray()
    learner_cpus = choose_threads(cfg.trainer.threads)
    gpus = 1 if resolve_device(cfg.trainer.device).type == "cuda" else 0
    learner_bundle = {"CPU": learner_cpus, **({"GPU": gpus} if gpus else {})}
    workers = [{"CPU": cfg.dist.worker_threads}] * cfg.dist.rollout_workers
    group = ray.util.placement_group([learner_bundle, *workers], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"Ray could not place the learner ({learner_bundle}) and {len(workers)} rollout workers "
                           f"({workers[0]} each) within {PLACEMENT_TIMEOUT_S} s; the cluster has "
                           f"{ray.cluster_resources()}. Lower dist.rollout_workers, dist.worker_threads or trainer.threads")
    strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=0)
    actor = ray.remote(LearnerActor).options(num_cpus=learner_cpus, num_gpus=gpus, scheduling_strategy=strategy,
                                             max_restarts=0).remote()
    try:
        return ray.get(actor.train.remote(cfg, Path(resume) if resume else None))
    finally:
        ray.kill(actor)
        ray.util.remove_placement_group(group)
