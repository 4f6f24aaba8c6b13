"""Streaming consumption and multi-version batches of the background batch source (`loops.background`, docs/scaling.md).

With `rollout.stream_chunks: C` > 1 the producer draws a step's prompts at once, splits them into C
contiguous chunks, and rolls out and scores chunk by chunk, each from its own seed drawn from the
run's generator (the seeds and split of a pool of C rollout workers, so the tokens are those of
`dist.backend: local` with C workers); each chunk is queued as soon as it is scored. The learner
prepares each chunk and runs its forward and backward passes when it arrives, and steps the
optimiser after the last (`Learner.streamed`): the whole-batch update, provided the batch's
preparation is group-local and the objective has one denominator (`validation._streaming` refuses the rest).

With `rollout.versions: newest` each chunk (the whole batch when C = 1) is made from the newest
published version the staleness bound admits when it starts, so one batch may hold several versions.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from statistics import mean
import torch

from lmrl.algos import AGGREGATIONS
from lmrl.engines.workers import chunk_seeds, split_evenly
from lmrl.data.samplers import sampler_metrics
from lmrl.inputs import provide
from lmrl.loops.batching import to_batch
from lmrl.loops.collect import batch_inputs, observe, roll_out_and_score
from lmrl.loops.setup import Stages
from lmrl.loops.source import BatchSource, Rollout
from lmrl.types import Group


@dataclass
class StepPlan:
    """A step's prompts split into chunks, with one sampling seed per chunk; the groups made so far."""

    rows: list[list[dict]]
    seeds: list[int]
    seen: list[Group] = field(default_factory=list)


def plan_step(s: Stages, chunks: int) -> StepPlan:
    rows = s.sampler.next_prompts(s.cfg.rollout.prompts_per_step)
    return StepPlan([rows[a:b] for a, b in split_evenly(len(rows), chunks)], chunk_seeds(s.generator, chunks))


def collect_chunk(s: Stages, plan: StepPlan, chunk: int) -> tuple[list[Group], list[Group], dict[str, float]]:
    """Roll out and score chunk `chunk` of `plan`: (groups, kept groups, metrics), as `collect.collect_groups`
    with no group filter or sample source. The sampler (and a controller that learns) observes the step's groups after its last chunk."""
    generator = torch.Generator().manual_seed(plan.seeds[chunk])
    groups, families, metrics = roll_out_and_score(s, plan.rows[chunk], generator)
    plan.seen += groups
    kept = [g for f in families for g in f]
    if chunk == len(plan.rows) - 1:
        observe(s, plan.seen)
        metrics.update(sampler_metrics(s.sampler))
        metrics.update({"data/gen_batches": 1.0, "data/kept_groups": float(sum(map(len, plan.rows)))})
    return groups, kept, metrics


def weighted_means(parts: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Each metric's mean over the (metrics, weight) parts that report it, weighted."""
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    for metrics, w in parts:
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v * w
            weights[k] = weights.get(k, 0.0) + w
    return {k: v / max(weights[k], 1.0) for k, v in totals.items()}


def merged(chunks: list[Rollout]) -> Rollout:
    """The chunks of one step as one rollout: groups in order, metrics averaged weighted by samples,
    the oldest version, the seconds (scoring's among them) and tokens of all."""
    return dataclasses.replace(
        chunks[0], version=min(c.version for c in chunks), seen=[g for c in chunks for g in c.seen],
        kept=[g for c in chunks for g in c.kept], seconds=sum(c.seconds for c in chunks),
        metrics=weighted_means([(c.metrics, float(sum(len(g.samples) for g in c.seen))) for c in chunks]),
        generated=sum(c.generated for c in chunks), reward_seconds=sum(c.reward_seconds for c in chunks))


def learn_streamed(s: Stages, source: BatchSource, first: Rollout
                   ) -> tuple[Rollout, dict[str, float] | None, dict[str, float]]:
    """Train on `first`'s step chunk by chunk as `source` makes them, then step the optimiser.

    Returns the step's merged rollout, the update's metrics (None when no sample was scored) and the
    streaming metrics: `async/stream_wait_s` (waiting for later chunks), `async/stream_overlap_s`
    (learner compute done before the last chunk was queued) and `async/stream_lead_s` (how long
    before the last chunk was queued the learner started; negative: the batch was complete by then).
    """
    denominator = AGGREGATIONS.spec(s.cfg.algo.aggregation).denominator
    update = s.learner.streamed(s.algorithm, denominator)
    chunks, busy, waited, prepared = [first], [], 0.0, []
    while True:
        start = time.perf_counter()
        inputs = batch_inputs(s, chunks[-1].kept, first.step)
        batch = to_batch(inputs, s.engine.pad_token_id)
        if batch is not None:
            provide(batch, inputs, with_learner=True)
            prepared.append((s.algorithm.prepare(batch), float(batch.completion_mask.sum())))
            update.add(batch)
        busy.append((start, time.perf_counter()))
        if len(chunks) == first.chunks:
            break
        chunks.append(source.take(first.step))
        waited += time.perf_counter() - busy[-1][1]
    learned = {**weighted_means(prepared), **update.finish()} if prepared else None  # preparation: token-weighted
    complete = chunks[-1].made_at
    return merged(chunks), learned, {
        "async/stream_wait_s": waited, "async/stream_overlap_s": sum(max(0.0, min(b, complete) - a) for a, b in busy),
        "async/stream_lead_s": complete - busy[0][0]}


def version_metrics(step: int, groups: list[Group]) -> dict[str, float]:
    """The distinct policy versions of a step's samples, and their staleness step − 1 − version."""
    versions = [min(x.policy_version) for g in groups for x in g.samples if x.policy_version]
    if not versions:
        return {}
    gaps = [step - 1 - v for v in versions]
    return {"async/versions": float(len(set(versions))), "async/staleness_mean": float(mean(gaps)),
            "async/staleness_max": float(max(gaps))}
