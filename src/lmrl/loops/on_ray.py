"""Training on a Ray cluster: the loop and its learner in one actor, the rollout workers in others.

`train_on_ray` reserves one placement group: bundle 0 for the learner (`trainer.threads` CPUs, and
a GPU when `trainer.device` is CUDA), bundles 1…N for the N rollout workers (`dist.worker_threads`
CPUs each). The learner actor runs the same `train` as one process does; the `WorkerPool` it builds
finds the placement group it runs in and puts its rollout actors in the other bundles. The run
directory must be on a filesystem the learner's node sees (the driver's, on one machine). A local
cluster started here counts as many CPUs as the run reserves when that is more than the machine has
(the actors share its cores: the documented two-worker example runs on two cores); a cluster joined
through RAY_ADDRESS is taken as it is, and a reservation larger than it is refused at once.
"""
from __future__ import annotations

from pathlib import Path

from lmrl.config import Config, ConfigError
from lmrl.engines.workers import ray_session
from lmrl.loops.loop import RunResult, train_here
from lmrl.models.device import resolve_device
from lmrl.models.threads import choose_threads

PLACEMENT_TIMEOUT_S = 60


def check_fits(cluster: dict[str, float], bundles: list[dict[str, float]]) -> None:
    """Refuse at once a reservation larger than the whole cluster (rather than waiting for it)."""
    for resource in sorted({key for bundle in bundles for key in bundle}):
        need, have = sum(b.get(resource, 0) for b in bundles), cluster.get(resource, 0)
        if need > have:
            raise ConfigError(f"the run reserves {need:g} {resource} on Ray (learner {bundles[0]}, "
                              f"{len(bundles) - 1} rollout workers {bundles[1:2]} each) but the cluster has "
                              f"{have:g}: lower dist.rollout_workers, dist.worker_threads or trainer.threads")


class LearnerActor:
    """Runs the training loop where Ray placed it."""

    def train(self, cfg: Config, resume: Path | None) -> RunResult:
        return train_here(cfg, resume)


def train_on_ray(cfg: Config, resume: Path | None = None) -> RunResult:
    learner_cpus = choose_threads(cfg.trainer.threads)
    gpus = 1 if resolve_device(cfg.trainer.device).type == "cuda" else 0
    learner_bundle = {"CPU": learner_cpus, **({"GPU": gpus} if gpus else {})}
    workers = [{"CPU": cfg.dist.worker_threads}] * cfg.dist.rollout_workers
    ray = ray_session(cpus=learner_cpus + cfg.dist.worker_threads * cfg.dist.rollout_workers)
    check_fits(ray.cluster_resources(), [learner_bundle, *workers])
    group = ray.util.placement_group([learner_bundle, *workers], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"Ray could not place the learner ({learner_bundle}) and {len(workers)} rollout workers "
                           f"({workers[0]} each) within {PLACEMENT_TIMEOUT_S} s (other jobs hold the cluster's "
                           f"resources?); the cluster has {ray.cluster_resources()}")
    strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=0)
    actor = ray.remote(LearnerActor).options(num_cpus=learner_cpus, num_gpus=gpus, scheduling_strategy=strategy,
                                             max_restarts=0).remote()
    try:
        return ray.get(actor.train.remote(cfg, Path(resume) if resume else None))
    finally:
        ray.kill(actor)
        ray.util.remove_placement_group(group)
