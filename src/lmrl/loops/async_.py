"""The asynchronous training loop: rollouts run ahead of training, with bounded staleness.

A producer thread generates step j's batch with policy version v(j) = max(0, j − 1 − k), where k is
`rollout.max_staleness` and version v means the weights after v updates, while this thread trains on
earlier batches and publishes every new version through the weight transport (`engines.weight_sync`).
No batch is consumed more than k versions after the policy that produced it (AReaL's bound); k = 0
is the synchronous loop, step for step. The version is fixed by the step, not "the newest there
is", so a run reproduces and resumes bit for bit; when generation is the slower phase (as on CPU)
the newest version is that one anyway. Each sample records its version (`Sample.policy_version`).
With `rollout.versions: newest` a batch (or chunk) is made from the newest published version at
least v(j) instead: fresher samples, timing-dependent runs. With `rollout.stream_chunks` > 1 the
batch is made and queued in chunks and the learner trains on each as it arrives (`loops.streaming`).

Checkpoints: at a checkpoint step the learner lets the producer finish every batch the published
versions admit (it then waits for the next version) and saves those batches with the producer's
state, so a resumed run consumes them exactly as the uninterrupted one: nothing regenerated, lost or
consumed twice. docs/scaling.md.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from lmrl.config import Config
from lmrl.engines.build import async_engines
from lmrl.engines.weight_sync import build_transport
from lmrl.loops.progress import StepProgress
from lmrl.loops.run_dir import RunDir
from lmrl.loops.run_state import RunState
from lmrl.loops.setup import Stages
from lmrl.loops.stopping import stop_reason
from lmrl.loops.streaming import collect_chunk, learn_streamed, plan_step, version_metrics
from lmrl.loops.sync import (RunResult, _sample_row, collect_groups, evaluate_now, learn, log_inputs_order,
                             rollout_metrics)
from lmrl.models.threads import apply_threads
from lmrl.models.weights import inference_weights
from lmrl.types import Group


@dataclass
class Rollout:
    """One step's batch (or one chunk of it), as the producer made it."""

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
        return rollout

    def settle(self, version: int) -> list[Rollout]:
        """Wait until every batch that `version` admits is made; the batches not yet consumed."""
        upto = min(self.last, version + 1 + self.staleness)
        with self.changed:
            self.changed.wait_for(lambda: self.next_step > upto or self.error is not None)
            if self.error is not None:
                raise RuntimeError("the rollout thread failed") from self.error
            return list(self.queue)

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        self.thread.join()
        for parcel in self.parcels.values():
            self.transport.release(parcel)


def run_async_steps(cfg: Config, run: RunDir, resume: Path | None, s: Stages) -> RunResult:
    """The asynchronous loop on an open run directory: the learner's side of `Producer`."""
    result = RunResult(run.path, cfg.trainer.steps)
    run_state = RunState(s, run, result)
    start, state = run_state.resume(resume)
    if state.get("stopped"):  # a run that `trainer.stop_when` ended stays ended
        result.steps, result.stopped = start, state["stopped"]
        return result
    rollout_engine, eval_engine = async_engines(cfg, s.engine, s.model, s.tokenizer)
    producer = Producer(s, rollout_engine, start, cfg.rollout.max_staleness,
                        build_transport(cfg.rollout.weight_transport), state.get("async"))
    if start == 0:
        log_inputs_order(s, run)
    progress = StepProgress(cfg.trainer.steps, start, enabled=cfg.run.progress)
    if start == 0 and cfg.eval.at_start and s.eval_rows:
        result.eval_before = evaluate_now(s, run, 0, eval_engine, progress)
    producer.publish(start, s.model)
    producer.thread.start()
    last_end = time.perf_counter()
    try:
        with progress:
            for step in range(start + 1, cfg.trainer.steps + 1):
                rollout = producer.take(step)
                s.scorer.check_error_rate(rollout.metrics, step)  # the whole batch, or its first chunk
                t1 = time.perf_counter()
                threads = apply_threads(cfg.trainer.threads)
                if rollout.chunks == 1:
                    learned, stream = learn(s, rollout.kept, step), {}
                else:
                    rollout, learned, stream = learn_streamed(s, producer, rollout)
                    s.scorer.check_error_rate(rollout.metrics, step)
                metrics = {**rollout.metrics, **rollout_metrics(rollout.seen, cfg.reward.accuracy_component)}
                metrics.update(learned if learned is not None else {"skipped_updates": 1.0})
                producer.publish(step, s.model)
                step_s, waited = time.perf_counter() - last_end, t1 - last_end + stream.get("async/stream_wait_s", 0.0)
                generating = rollout.seconds - rollout.reward_seconds
                result.train_seconds += step_s
                metrics.update({"async/staleness": float(step - 1 - rollout.version), "async/wait_s": waited,
                                **version_metrics(step, rollout.seen), **stream, "timing/rollout_s": generating,
                                "timing/reward_s": rollout.reward_seconds, "timing/train_s": step_s - waited,
                                "timing/step_s": step_s, "tokens_per_s": rollout.generated / generating,
                                "timing/threads": float(threads), **s.data_notes})
                stopped = stop_reason(cfg.trainer.stop_when, metrics)
                run.log(step, {**metrics, **({"stopped": stopped} if stopped else {})})
                run.log_samples(step, [_sample_row(g, "train") for g in rollout.seen[:2]])
                run.log_rollouts(step, rollout.seen)
                progress.update(step, metrics)
                step_end, paused = time.perf_counter(), 0.0  # evaluating and saving pause the run: not a step's time
                last = step == cfg.trainer.steps or stopped is not None
                if s.eval_rows and ((cfg.eval.every and step % cfg.eval.every == 0 and not last)
                                    or (last and cfg.eval.at_end)):
                    with producer.working:  # waiting for the batch in the making counts: rollouts go on meanwhile
                        t_eval = time.perf_counter()
                        evaluated = evaluate_now(s, run, step, eval_engine, progress)
                        paused += time.perf_counter() - t_eval
                    if last:
                        result.eval_after = evaluated
                if last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                    queued = producer.settle(step)
                    t_save = time.perf_counter()
                    run_state.save(step, {**run_state.boundary(), "stopped": stopped,
                                          "async": {"queue": queued, "next_step": producer.next_step}})
                    paused += time.perf_counter() - t_save
                last_end = step_end + paused
                if stopped:
                    result.steps, result.stopped = step, stopped
                    break
    finally:
        producer.stop()
    return result
