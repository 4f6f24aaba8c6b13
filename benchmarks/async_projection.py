"""A discrete-event simulation of the async loop, driven by measured phase timings: throughput for 1–64
rollout workers, and which part (rollouts, the learner, weight transfer) bounds it.

    python benchmarks/async_projection.py --timings async.json [--transfer-s 0.55] [--steps 200]

`--timings` is the --json output of benchmarks/async_vs_sync.py; the one-core phases of its `async1`
mode are used: a batch's rollout time on one worker (each measured batch, resampled) and the
learner's update time. The model is the loop as built: a pool of N workers splits every batch into
N chunks (a chunk takes T/N times a factor drawn around 1 with the measured batches' spread, and the
batch ends with its slowest chunk); the pool starts step j's batch once it is free and version
max(0, j − 1 − k) is published; a new version reaches the workers by a tree broadcast
(`--transfer-s` per hop: send + receive of one version, benchmarks/weight_transport.py, ⌈log2(N+1)⌉
hops); one learner trains the batches in order and publishes after each update. Sync is k = 0.
What it leaves out: queueing inside a worker, generation interrupted mid-batch, several learner ranks.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path


def simulate(rollouts: list[float], train_s: float, transfer_s: float, workers: int, staleness: int, steps: int,
             seed: int = 0) -> dict:
    """Wall time of `steps` steps and the share of it the learner spent waiting."""
    rng = random.Random(seed)
    spread = statistics.pstdev(rollouts) / statistics.mean(rollouts) if len(rollouts) > 1 else 0.0
    hops = math.ceil(math.log2(workers + 1))
    published = {0: 0.0}
    pool_free = learner_free = waited = 0.0
    for step in range(1, steps + 1):
        version = max(0, step - 1 - staleness)
        batch = rng.choice(rollouts)
        chunks = [batch / workers * max(0.1, rng.gauss(1.0, spread)) for _ in range(workers)]
        start = max(pool_free, published[version] + transfer_s * hops)
        pool_free = start + max(chunks)
        begin = max(pool_free, learner_free)
        waited += begin - learner_free
        learner_free = begin + train_s
        published[step] = learner_free
    return {"wall_s": learner_free, "learner_idle": waited / learner_free}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timings", type=Path, required=True)
    ap.add_argument("--mode", default="async1", help="which measured mode's one-core phase timings to use")
    ap.add_argument("--transfer-s", type=float, default=0.55, help="one version's send + receive, seconds")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    measured = {r["mode"]: r for r in json.loads(a.timings.read_text())}[a.mode]
    rollouts, train_s = measured["rollout_times"], measured["train_s"]
    lines = [f"Phase timings from `{a.mode}`: rollout {statistics.mean(rollouts):.1f} s per batch on one worker "
             f"(spread {statistics.pstdev(rollouts):.1f} s), update {train_s:.1f} s; transfer {a.transfer_s:.2f} s "
             f"per broadcast hop; {a.steps} steps.", "",
             "| workers | sync steps/min | k=1 | k=2 | k=4 | best async / sync | learner idle (k=2) | bound by |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for workers in (1, 2, 4, 8, 16, 32, 64):
        runs = {k: simulate(rollouts, train_s, a.transfer_s, workers, k, a.steps) for k in (0, 1, 2, 4)}
        rate = {k: 60 * a.steps / r["wall_s"] for k, r in runs.items()}
        gen = statistics.mean(rollouts) / workers
        sync_hop = a.transfer_s * math.ceil(math.log2(workers + 1))
        # the pool's stage is transfer then generation; the learner's is the update; the slower one bounds
        bound = "learner" if train_s >= gen + sync_hop else ("weight transfer" if sync_hop > gen else "rollouts")
        lines.append(f"| {workers} | {rate[0]:.2f} | {rate[1]:.2f} | {rate[2]:.2f} | {rate[4]:.2f} | "
                     f"{max(rate[1], rate[2], rate[4]) / rate[0]:.2f}× | {runs[2]['learner_idle']:.0%} | {bound} |")
    print("\n".join(lines))
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
