"""Training on a Ray cluster: the loop in learner actors, the rollout workers in others, placed by one group.

`train_on_ray` reserves one placement group with `dist.placement` as its strategy (PACK, SPREAD,
STRICT_PACK, STRICT_SPREAD): a bundle per learner rank (`trainer.threads` CPUs, and a GPU when
`trainer.device` is CUDA), then, with one rank, a bundle per rollout worker (`dist.worker_threads`
CPUs each). One rank runs the same `train` as one process does; the `WorkerPool` it builds finds the
placement group it runs in and puts its rollout actors in the other bundles. With
`dist.learner_ranks: N > 1` the N rank actors join one torch.distributed group (gloo, or NCCL on
GPUs) at a free port of rank 0's node, which rank 0's actor reports through Ray, and then run the
loop as torchrun ranks do: each generates its share of every batch on its own engine and trains its
share (`dist.data_parallel`). The run directory and `model.path` must be on a filesystem every
learner node sees (rank 0 writes, every rank reads the model and, on resume, the checkpoint). A local
cluster started here counts as many CPUs as the run reserves when that is more than the machine has
(the actors share its cores: the documented two-worker example runs on two cores); a cluster joined
through RAY_ADDRESS is taken as it is, and a reservation larger than it is refused at once.
"""
from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Iterator

from lmrl.config import Config, ConfigError
from lmrl.dist import default_backend, init_explicit, teardown
from lmrl.engines.workers import ray_session
from lmrl.loops.loop import RunResult, train_here
from lmrl.models.device import resolve_device
from lmrl.models.threads import choose_threads

PLACEMENT_TIMEOUT_S = 60


def bundles(cfg: Config) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The placement group's bundles: one per learner rank, then one per rollout worker (a pool needs one rank)."""
    gpus = {"GPU": 1} if resolve_device(cfg.trainer.device).type == "cuda" else {}
    ranks = [{"CPU": choose_threads(cfg.trainer.threads), **gpus} for _ in range(cfg.dist.learner_ranks)]
    workers = [{"CPU": cfg.dist.worker_threads} for _ in range(cfg.dist.rollout_workers if cfg.dist.rollout_pool else 0)]
    return ranks, workers


def check_fits(cluster: dict[str, float], ranks: list[dict[str, float]], workers: list[dict[str, float]]) -> None:
    """Refuse at once a reservation larger than the whole cluster (rather than waiting for it)."""
    everything = ranks + workers
    for resource in sorted({key for bundle in everything for key in bundle}):
        need, have = sum(b.get(resource, 0) for b in everything), cluster.get(resource, 0)
        if need > have:
            raise ConfigError(f"the run reserves {need:g} {resource} on Ray ({len(ranks)} learner ranks {ranks[:1]} "
                              f"each, {len(workers)} rollout workers {workers[:1]} each) but the cluster has "
                              f"{have:g}: lower dist.learner_ranks, dist.rollout_workers, dist.worker_threads or "
                              "trainer.threads")


class LearnerActor:
    """One learner rank, running the training loop where Ray placed it."""

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> str:
        """`tcp://host:port`: a free port on this actor's node, for the ranks to meet at."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def train(self, cfg: Config, resume: Path | None, rank: int = 0, world_size: int = 1,
              rendezvous: str | None = None) -> RunResult:
        if world_size == 1:
            return train_here(cfg, resume)
        backend = default_backend()
        if backend == "nccl":
            import torch

            torch.cuda.set_device(0)  # Ray shows each rank actor its own GPU only
        init_explicit(rank, world_size, rendezvous, backend)
        try:
            return train_here(cfg, resume)
        finally:
            teardown()


@contextlib.contextmanager
def placed_learners(cfg: Config) -> Iterator[list]:
    """The learner rank actors, placed with their rollout workers' bundles; removed on leaving."""
    ranks, workers = bundles(cfg)
    ray = ray_session(cpus=int(sum(b["CPU"] for b in ranks + workers)))
    check_fits(ray.cluster_resources(), ranks, workers)
    group = ray.util.placement_group(ranks + workers, strategy=cfg.dist.placement)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"Ray could not place {len(ranks)} learner ranks ({ranks[0]} each) and {len(workers)} "
                           f"rollout workers {workers[:1]} with strategy {cfg.dist.placement} within "
                           f"{PLACEMENT_TIMEOUT_S} s (other jobs hold the cluster's resources, or too few nodes for "
                           f"a STRICT_SPREAD?); the cluster has {ray.cluster_resources()}")
    actors = []
    for index, bundle in enumerate(ranks):
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index)
        actors.append(ray.remote(LearnerActor).options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                                       scheduling_strategy=strategy, max_restarts=0).remote())
    try:
        yield actors
    finally:
        for actor in actors:
            ray.kill(actor)
        ray.util.remove_placement_group(group)


def train_placed(actors: list, cfg: Config, resume: Path | None = None) -> RunResult:
    """Run the loop on the placed rank actors; rank 0's result."""
    import ray

    resume = Path(resume) if resume else None
    rendezvous = ray.get(actors[0].rendezvous.remote()) if len(actors) > 1 else None
    runs = [actor.train.remote(cfg, resume, rank, len(actors), rendezvous) for rank, actor in enumerate(actors)]
    return ray.get(runs)[0]


def train_on_ray(cfg: Config, resume: Path | None = None) -> RunResult:
    with placed_learners(cfg) as actors:
        return train_placed(actors, cfg, resume)
