"""The background batch source: rollouts run ahead of training, with bounded staleness.

A producer thread generates step j's batch with policy version v(j) = max(0, j − 1 − k), where k is
`rollout.max_staleness` and version v means the weights after v updates, while the loop trains on
earlier batches and publishes every new version through the weight transport (`engines.weight_sync`).
No batch is consumed more than k versions after the policy that produced it (AReaL's bound); k = 0
is the inline source, step for step. The version is fixed by the step, not "the newest there
is", so a run reproduces and resumes bit for bit; when generation is the slower phase (as on CPU)
the newest version is that one anyway. Each sample records its version (`Sample.policy_version`).
With `rollout.versions: newest` a batch (or chunk) is made from the newest published version at
least v(j) instead: fresher samples, timing-dependent runs. With `rollout.stream_chunks` > 1 the
batch is made and queued in chunks and the learner trains on each as it arrives (`loops.streaming`).

Checkpoints: at a checkpoint step (and in the save made when the run fails) the learner lets the
producer finish every batch the published versions admit (it then waits for the next version) and
saves those batches, with the one the failed step had taken, and the producer's state, so a resumed
run consumes them exactly as the uninterrupted one: nothing regenerated, lost or consumed twice.
A guard rollback stops the producer and drops its batches (made from the weights rolled back),
restores the training state, then starts a new producer from the restored sampler and weights at
the next step, as a resumed run extended past its steps does. docs/scaling.md.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any

from lmrl.engines.build import async_engines
from lmrl.engines.weight_sync import build_transport
from lmrl.loops.collect import collect_groups
from lmrl.loops.setup import Stages
from lmrl.loops.source import Rollout
from lmrl.loops.streaming import collect_chunk, plan_step, version_metrics
from lmrl.models.threads import apply_threads
from lmrl.models.weights import inference_weights


class Producer:
    """Generates the batches of steps `first`..`last` in a thread, each from a version its step admits."""

    def __init__(self, s: Stages, engine, start: int, staleness: int, transport, queued: dict | None = None):
        self.s, self.engine, self.staleness, self.transport = dataclasses.replace(s, engine=engine), engine, staleness, transport
        queued = queued or {}
        self.next_step, self.last = queued.get("next_step", start + 1), s.cfg.trainer.steps
        self.chunks, self.newest = s.cfg.rollout.stream_chunks, s.cfg.rollout.versions == "newest"
        self.chunk, self.plan = 0, None  # the next chunk of `next_step`, and that step's plan
        self.oldest = start  # the first version this process has: a run extended past its steps starts there
        now = time.perf_counter()  # restored rollouts count as made now
        self.queue: deque[Rollout] = deque(dataclasses.replace(r, made_at=now) for r in queued.get("queue", []))
        self.taken: list[Rollout] = []  # the rollouts of the step the learner is on (its chunks so far)
        self.parcels: dict = {}
        self.loaded: int | None = None
        self.error: BaseException | None = None
        self.stopping = False
        self.changed = threading.Condition()
        self.working = threading.Lock()  # held while a batch is made; evaluation takes it too (one scorer)
        self.thread = threading.Thread(target=self._run, name="lmrl-rollout", daemon=True)

    def version_for(self, step: int) -> int:
        return max(self.oldest, step - 1 - self.staleness)

    def admitted(self) -> int | None:
        """The version the next chunk is made from: its step's, or under `versions: newest` the newest
        published one not older; None while it is not published."""
        floor = self.version_for(self.next_step)
        if self.newest:
            return max((v for v in self.parcels if v >= floor), default=None)
        return floor if floor in self.parcels else None

    def publish(self, version: int, model) -> None:
        """Send the learner's weights as `version`; drop parcels no batch to come will use."""
        parcel = self.transport.send(inference_weights(model), version)
        with self.changed:
            self.parcels[version] = parcel
            for old in [v for v in self.parcels if v < min(version, self.version_for(self.next_step))]:
                self.transport.release(self.parcels.pop(old))
            self.changed.notify_all()

    def _run(self) -> None:
        try:
            while self.next_step <= self.last:
                with self.changed:
                    self.changed.wait_for(lambda: self.admitted() is not None or self.stopping)
                    if self.stopping:
                        return
                    version = self.admitted()
                    parcel = self.parcels[version]
                with self.working:
                    self.queue_rollout(self.make(version, parcel))
        except BaseException as err:  # handed to the learner, which raises it
            with self.changed:
                self.error = err
                self.changed.notify_all()

    def make(self, version: int, parcel) -> Rollout:
        t0, scoring = time.perf_counter(), self.s.scorer.seconds
        apply_threads(self.s.cfg.trainer.threads)
        synced = {}
        if self.loaded != version:
            synced = self.engine.update_weights(self.transport.receive(parcel), version)
            self.loaded = version
        if self.chunks == 1:
            seen, kept, metrics = collect_groups(self.s)
        else:
            if self.chunk == 0:
                self.plan = plan_step(self.s, self.chunks)
            seen, kept, metrics = collect_chunk(self.s, self.plan, self.chunk)
        metrics.update(synced)
        generated = sum(x.num_generated for g in seen for x in g.samples)
        return Rollout(self.next_step, version, seen, kept, metrics, time.perf_counter() - t0, generated,
                       self.s.scorer.seconds - scoring, self.chunk, self.chunks)

    def queue_rollout(self, rollout: Rollout) -> None:
        with self.changed:
            self.queue.append(dataclasses.replace(rollout, made_at=time.perf_counter()))
            self.chunk = (self.chunk + 1) % self.chunks
            self.next_step += self.chunk == 0
            self.changed.notify_all()

    def take(self, step: int) -> Rollout:
        with self.changed:
            self.changed.wait_for(lambda: self.queue or self.error is not None)
            if self.error is not None:
                raise RuntimeError("the rollout thread failed") from self.error
            rollout = self.queue.popleft()
        assert rollout.step == step, f"the rollout of step {rollout.step} arrived for step {step}"
        self.taken = [r for r in self.taken if r.step == step] + [rollout]
        return rollout

    def settle(self, version: int) -> list[Rollout]:
        """Wait until every batch that `version` admits is made; the batches of the steps after `version`
        not yet consumed (those of a step the learner had taken but not finished first)."""
        upto = min(self.last, version + 1 + self.staleness)
        with self.changed:
            self.changed.wait_for(lambda: self.next_step > upto or self.error is not None or self.stopping)
            if self.error is not None:
                raise RuntimeError("the rollout thread failed") from self.error
            if self.stopping:
                raise RuntimeError("the rollout thread was stopped before the batches to save were made")
            return [r for r in self.taken if r.step > version] + list(self.queue)

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        if self.thread.ident is not None:  # started
            self.thread.join()
        for parcel in self.parcels.values():
            self.transport.release(parcel)
        self.parcels.clear()


class BackgroundSource:
    """The batch source of `rollout.max_staleness`: a `Producer` thread with its own rollout engine,
    fed the learner's weights through the weight transport; evaluation uses the learner's module."""

    live_parts = ("sampler", "rng", "rewards", "sample_source")  # the producer draws on them between steps

    def __init__(self, s: Stages, start: int, queued: dict | None):
        self.s = s
        self.engine, self.eval_engine = async_engines(s.cfg, s.engine, s.model, s.tokenizer)
        self.transport = build_transport(s.cfg.rollout.weight_transport)
        self.start_version = start
        self.producer = Producer(s, self.engine, start, s.cfg.rollout.max_staleness, self.transport, queued)

    def start(self) -> None:
        self.producer.publish(self.start_version, self.s.model)
        self.producer.thread.start()

    def take(self, step: int) -> Rollout:
        return self.producer.take(step)

    def after_update(self, step: int, model, updated: bool) -> dict[str, float]:
        self.producer.publish(step, model)  # a skipped update publishes the same weights: the versions go on
        return {}

    def step_metrics(self, step: int, rollout: Rollout, waited: float) -> dict[str, float]:
        return {"async/staleness": float(step - 1 - rollout.version), "async/wait_s": waited,
                **version_metrics(step, rollout.seen)}

    def paused(self):
        return self.producer.working  # waiting for the batch in the making counts: rollouts go on meanwhile

    def checkpoint_state(self, step: int, read_parts) -> dict[str, Any]:
        queued = self.producer.settle(step)
        return {**read_parts(self.live_parts), "async": {"queue": queued, "next_step": self.producer.next_step}}

    @contextmanager
    def restarting(self, step: int):
        self.producer.stop()
        if self.producer.error is not None:  # a failure while making the next batch is not rolled back
            raise RuntimeError("the rollout thread failed") from self.producer.error
        yield
        self.start_version = step
        self.producer = Producer(self.s, self.engine, step, self.s.cfg.rollout.max_staleness, self.transport)
        self.start()

    def stop(self) -> None:
        self.producer.stop()
