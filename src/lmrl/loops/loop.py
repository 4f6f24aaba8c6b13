"""The step loop: take a step's batch from the batch source, learn, publish, log, evaluate, checkpoint.

Read top to bottom, `run_steps` is the one algorithm-agnostic loop of every mode: the source makes
the batches (inline, or in the background with bounded staleness, whole or in chunks:
`loops.source`), `loops.collect` does what every step does, and `RunState` saves, resumes and rolls
back (docs/architecture.md, "The loop").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from lmrl.config import Config, check_resume_config
from lmrl.dist import Parallel
from lmrl.learners.checkpoint import clean_partial
from lmrl.loading import load_run_config
from lmrl.loops.background import BackgroundSource
from lmrl.loops.collect import evaluate_now, learn, log_inputs_order, sample_row, step_rollout_metrics
from lmrl.loops.inline import InlineSource
from lmrl.loops.offline import OfflineSource
from lmrl.loops.progress import StepProgress
from lmrl.loops.run_dir import RunDir
from lmrl.loops.roles import collect_roles, learn_roles, policy_turn
from lmrl.loops.run_state import RunState
from lmrl.loops.setup import Stages, build_stages, data_parallel
from lmrl.loops.source import BatchSource
from lmrl.loops.stopping import StopWatch
from lmrl.loops.streaming import learn_streamed
from lmrl.models.threads import apply_threads
from lmrl.trackers import Trackers


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0  # wall time of the steps run in this process, evaluations and saves excluded
    stopped: str | None = None  # why `trainer.stop_when` ended the run before `trainer.steps`


def open_run(cfg: Config, resume: Path | None, parallel: Parallel | None = None) -> RunDir:
    """The run directory: a new one, or `resume`, whose own config must match `cfg` (but for resumable keys).
    In a data-parallel run rank 0 opens it and the other ranks get it muted."""
    parallel = parallel or Parallel()
    if resume is not None and (Path(resume) / "config.yaml").exists():
        check_resume_config(load_run_config(resume), cfg, resume)
    if not parallel.is_main:
        return RunDir(parallel.gather_objects(None)[0], muted=True)
    run = RunDir.new(cfg) if resume is None else RunDir(Path(resume))
    parallel.gather_objects(run.path)
    run.write_config(cfg)  # first thing: a run killed while it loads can already be resumed
    clean_partial(run.checkpoints)
    run.trackers = Trackers.from_config(cfg.run.trackers, run.path, cfg.model_dump(mode="json"))
    return run


def train_here(cfg: Config, resume: Path | None = None, stages: Stages | None = None) -> RunResult:
    """`train` in this process (one rank of a data-parallel run under torchrun)."""
    run = open_run(cfg, resume, stages.parallel if stages else data_parallel(cfg))
    with run.trackers:
        return run_steps(cfg, run, resume, stages or build_stages(cfg))


def open_source(s: Stages, start: int, saved: dict) -> BatchSource:
    """The run's batch source from step `start` on: an offline dataset's (`batches.source`), or rollouts in
    the background when `rollout.max_staleness` is set (with the batches a checkpoint queued,
    `saved["async"]`), else inline."""
    if s.offline is not None:
        return OfflineSource(s)
    if s.cfg.rollout.max_staleness is None:
        return InlineSource(s)
    return BackgroundSource(s, start, saved.get("async"))


def run_steps(cfg: Config, run: RunDir, resume: Path | None, s: Stages) -> RunResult:
    """The loop itself, on an open run directory.

    Killed at any moment, a resumed run ends as if it had never stopped: each step's evaluation
    happens before its checkpoint, the checkpoint records how far the logs had got, and a run that
    fails between checkpoints first saves the last step it finished (docs/runs.md).
    """
    result = RunResult(run.path, cfg.trainer.steps)
    run_state = RunState(s, run, result)
    start, saved_state = run_state.resume(resume)
    if saved_state.get("stopped"):  # a run that `trainer.stop_when` ended stays ended
        result.steps, result.stopped = start, saved_state["stopped"]
        return result
    source = run_state.source = open_source(s, start, saved_state)
    stops = StopWatch(cfg.trainer.stop_when)
    stops.load_state_dict(saved_state.get("stop_watch", {}))
    if start == 0:
        log_inputs_order(s, run)
    progress = StepProgress(cfg.trainer.steps, start, enabled=cfg.run.progress and s.parallel.is_main)
    done, saved, updates_at_boundary, boundary = start, start, s.learner.optimizer_steps, {}
    try:
        evaluates = bool(s.eval_rows or (s.offline and s.offline.eval))
        if start == 0 and cfg.eval.at_start and evaluates:
            result.eval_before = evaluate_now(s, run, 0, source.eval_engine, progress)
            stops.reason(result.eval_before, evaluation=True)  # a `drop` rule's best may be the start
        source.start()
        with progress:
            last_end = time.perf_counter()
            for step in range(start + 1, cfg.trainer.steps + 1):
                rollout = source.take(step)
                s.scorer.check_error_rate(rollout.metrics, step)  # the whole batch, or its first chunk
                if s.roles:  # what the roles sampled: scored; self-play groups join the policy's batch
                    joined, played = collect_roles(s.roles, step, [g.row for g in rollout.seen], cfg.env,
                                                   cfg.rollout.group_size)
                    rollout.kept, rollout.metrics = rollout.kept + joined, {**rollout.metrics, **played}
                t1 = time.perf_counter()
                threads = apply_threads(cfg.trainer.threads)
                if rollout.chunks == 1:
                    # (a policy outside its `trainer.train_steps` only generates: nothing to log)
                    rests = not cfg.trainer.trains_at(step)
                    with policy_turn(s.engine):
                        learned, stream = {} if rests else learn(s, rollout.kept, step), {}
                else:
                    rollout, learned, stream = learn_streamed(s, source, rollout)
                    s.scorer.check_error_rate(rollout.metrics, step)
                metrics = {**rollout.metrics,
                           **(step_rollout_metrics(s, rollout.seen) if rollout.seen else {})}
                metrics.update(learned if learned is not None else {"skipped_updates": 1.0})
                if s.roles:  # each role with weights of its own learns from its samples of the step
                    metrics.update(learn_roles(s.roles, step))
                metrics.update(source.after_update(step, s.model, learned is not None))
                step_s, waited = time.perf_counter() - last_end, t1 - last_end + stream.get("async/stream_wait_s", 0.0)
                generating = rollout.seconds - rollout.reward_seconds
                result.train_seconds += step_s
                metrics.update({**source.step_metrics(step, rollout, waited), **stream,
                                "timing/rollout_s": generating, "timing/reward_s": rollout.reward_seconds,
                                "timing/train_s": step_s - waited, "timing/step_s": step_s,
                                "timing/threads": float(threads), **s.data_notes})
                if rollout.generated:
                    metrics["tokens_per_s"] = rollout.generated / generating
                if rollout.trained:  # an offline batch: the tokens trained per second of the update
                    metrics["train/tokens_per_s"] = rollout.trained / max(step_s - waited, 1e-9)
                metrics.update(run_state.guard_step(step, metrics))
                stopped = stops.reason(metrics)
                run.log(step, {**metrics, **({"stopped": stopped} if stopped else {})})
                run.log_samples(step, [sample_row(g, "train") for g in rollout.seen[:2]])
                run.log_rollouts(step, rollout.seen)
                progress.update(step, metrics)
                step_end, paused = time.perf_counter(), 0.0  # evaluating and saving pause the run: not a step's time
                last = step == cfg.trainer.steps or stopped is not None
                if evaluates and ((cfg.eval.every and step % cfg.eval.every == 0 and not last)
                                    or (last and cfg.eval.at_end)):
                    with source.paused():  # waiting for a batch in the making counts
                        t_eval = time.perf_counter()
                        evaluated = evaluate_now(s, run, step, source.eval_engine, progress)
                        paused += time.perf_counter() - t_eval
                    why = stops.reason(evaluated, evaluation=True)  # the rules remember every evaluation
                    if why and not last:
                        stopped, last = why, True
                        run.log(step, {"stopped": stopped})  # this evaluation is the run's last
                    if last:
                        result.eval_after = evaluated
                done, updates_at_boundary = step, s.learner.optimizer_steps
                boundary = {**run_state.boundary(skip=source.live_parts), "stopped": stopped,
                            "stop_watch": stops.state_dict()}
                if last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                    checkpoint = {**boundary, **source.checkpoint_state(step, run_state.read)}
                    t_save = time.perf_counter()
                    run_state.save(step, checkpoint)
                    paused += time.perf_counter() - t_save
                    saved = step
                last_end = step_end + paused
                if stopped:
                    result.steps, result.stopped = step, stopped
                    break
    except BaseException:
        # weights still match `boundary` (one process: the other ranks of a parallel run may be gone)
        if done > saved and s.learner.optimizer_steps == updates_at_boundary and s.parallel.world_size == 1:
            run_state.save(done, {**boundary, **source.checkpoint_state(done, run_state.read)})
        raise
    finally:
        source.stop()
    return result
