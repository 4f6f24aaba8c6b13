"""The synchronous training loop: collect (sample prompts, roll out, score, filter, add samples), batch,
provide inputs, prepare, update, checkpoint.

Read top to bottom, this file is the algorithm-agnostic RL loop; every choice it makes comes
from a registry through `Stages`, and every per-sample input from the providers (docs/architecture.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from statistics import mean

from lmrl.config import Config, check_resume_config, load_run_config
from lmrl.data import InputContext
from lmrl.data.samplers import sampler_metrics
from lmrl.envs import expand_prompts, pooled, prompt_families, rollout
from lmrl.eval.evaluator import evaluate
from lmrl.learners.checkpoint import clean_partial
from lmrl.loops.batching import to_batch
from lmrl.loops.progress import StepProgress
from lmrl.loops.providers import provide, requested_inputs
from lmrl.loops.run_dir import RunDir
from lmrl.loops.run_state import RunState
from lmrl.dist import Parallel
from lmrl.loops.setup import Stages, build_stages, data_parallel
from lmrl.loops.stopping import stop_reason
from lmrl.eval.trackers import Trackers
from lmrl.models.threads import apply_threads
from lmrl.rewards.gaming import gaming_metrics
from lmrl.types import Group


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0  # wall time of the steps run in this process, evaluations excluded
    stopped: str | None = None  # why `trainer.stop_when` ended the run before `trainer.steps`


def roll_out_and_score(s: Stages, rows: list[dict], generator
                       ) -> tuple[list[Group], list[list[Group]], dict[str, float]]:
    """Roll `rows` out (as `envs.expand_prompts` expands them) and score them: the groups, the prompt families the
    group filter keeps (judged on their pooled samples), and the scorer's metrics."""
    groups = rollout(s.engine, s.tokenizer, expand_prompts(rows), s.cfg.rollout.group_size, s.params, generator,
                     s.cfg.env)
    metrics = s.scorer.score(groups)
    return groups, [f for f in prompt_families(rows, groups) if s.keep_group(pooled(f))], metrics


def collect_groups(s: Stages) -> tuple[list[Group], list[Group], dict[str, float]]:
    """Roll out until enough prompts pass the group filter (or the generation budget runs out), then
    add the samples of the run's sample source to the kept groups.

    Returns every group generated (for metrics), the kept groups (for the update) and metrics. A
    prompt may bring several groups (`envs.expand_prompts`); the filter judges and keeps or drops a
    prompt's groups together, on their pooled samples.
    """
    prompts = s.cfg.rollout.prompts_per_step
    kept: list[list[Group]] = []
    seen: list[Group] = []
    metrics: dict[str, float] = {}
    batches = 0
    while len(kept) < prompts and (s.cfg.data.max_gen_batches == 0 or batches < s.cfg.data.max_gen_batches):
        groups, families, scored = roll_out_and_score(s, s.sampler.next_prompts(prompts), s.generator)
        for k, v in scored.items():
            metrics[k] = metrics.get(k, 0.0) + v
        s.sampler.observe(groups)
        seen += groups
        kept += families
        batches += 1
    metrics = {k: v / batches for k, v in metrics.items()}
    metrics.update(sampler_metrics(s.sampler))
    metrics.update({"data/gen_batches": float(batches), "data/kept_groups": float(min(len(kept), prompts))})
    chosen, added = s.add_samples([g for f in kept[:prompts] for g in f], partial(source_rollout, s))
    metrics.update(added)
    return seen, chosen, metrics


def source_rollout(s: Stages, rows: list[dict], n: int, temperature: float | None = None) -> list[Group]:
    """`n` rollouts of each of `rows` with the run's engine: the sample source's own prompts (unscored),
    sampled at the run's temperature unless the source asks for another."""
    params = s.params if temperature is None else replace(s.params, temperature=temperature)
    return rollout(s.engine, s.tokenizer, rows, n, params, s.generator, s.cfg.env)


def rollout_metrics(groups: list[Group], accuracy_component: str) -> dict[str, float]:
    samples = [x for g in groups for x in g.samples]
    scored = [x for x in samples if x.excluded is None]
    lengths = [x.num_generated for x in samples]
    out = {
        "reward/mean": sum(x.reward for x in scored) / len(scored) if scored else float("nan"),
        "accuracy": sum(x.rewards.get(accuracy_component, 0.0) >= 1.0 for x in scored) / max(len(scored), 1),
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "truncated": sum(x.finish_reason == "length" for x in samples) / len(samples),
        # Monte-Carlo entropy of the sampling policy: mean -log p of the sampled tokens, every row
        "entropy/rollout": -sum(sum(x.behaviour_logprobs) for x in samples) / max(sum(lengths), 1),
    }
    out.update(gaming_metrics(scored, accuracy_component))  # rewarded answers that restate the question
    for name in sorted({k for x in samples for k in x.info.get("metrics", {})}):  # rollout's own (envs)
        out[name] = mean([x.info["metrics"][name] for x in samples if name in x.info.get("metrics", {})])
    names = {k for x in scored for k in x.rewards}
    for name in sorted(names):
        out[f"reward/{name}"] = sum(x.rewards.get(name, 0.0) for x in scored) / len(scored)
    return out


def batch_inputs(s: Stages, groups: list[Group], step: int) -> InputContext:
    """What the input providers may read for this step's batch of `groups`."""
    return InputContext(s.cfg, groups, requested_inputs(s.algorithm), step=step, learner=s.learner,
                        tokenizer=s.tokenizer, algorithm=s.algorithm)


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


def train(cfg: Config, resume: Path | None = None, stages: Stages | None = None) -> RunResult:
    """Run `cfg` to completion (or continue the run directory `resume` from its last complete checkpoint).

    Killed at any moment, a run resumed with `resume` ends with the same weights, optimiser state and
    logs as if it had never stopped: each step's evaluation happens before its checkpoint, and the
    checkpoint records how far the logs had got (docs/runs.md). With `dist.backend: ray` (and no
    `stages` given) the loop runs inside a Ray actor, beside its rollout actors (`loops.on_ray`).
    """
    if cfg.dist.backend == "ray" and stages is None:
        from lmrl.loops.on_ray import train_on_ray

        return train_on_ray(cfg, resume)
    return train_here(cfg, resume, stages)


def train_here(cfg: Config, resume: Path | None = None, stages: Stages | None = None) -> RunResult:
    """`train` in this process (one rank of a data-parallel run under torchrun)."""
    run = open_run(cfg, resume, stages.parallel if stages else data_parallel(cfg))
    with run.trackers:
        return run_steps(cfg, run, resume, stages or build_stages(cfg))


def learn(s: Stages, kept: list[Group], step: int) -> dict[str, float] | None:
    """One update on the kept groups: assemble the batch, provide its inputs, prepare, update, replay.
    None when no sample was scored (no update)."""
    inputs = batch_inputs(s, kept, step)
    batch = to_batch(inputs, s.engine.pad_token_id)
    if batch is None:
        return None
    provide(batch, inputs, with_learner=True)
    metrics = s.algorithm.prepare(batch)
    metrics.update(s.learner.update(batch, s.algorithm))
    metrics.update(s.algorithm.after_update(batch, metrics))
    for extra in s.algorithm.replays(batch):
        replayed = s.learner.update(extra, s.algorithm, step_scheduler=False)
        metrics.update({f"replay/{k}": v for k, v in replayed.items()})
    return metrics


def evaluate_now(s: Stages, run: RunDir, step: int, engine=None, progress: StepProgress | None = None
                 ) -> dict[str, float]:
    """Evaluate the held-out rows with `engine` (the run's own by default), show it on `progress`, log the result."""
    cfg = s.cfg
    with (progress or StepProgress(0, 0, enabled=False)).evaluation(step) as shown:
        metrics, groups = evaluate(engine or s.engine, s.tokenizer, s.eval_rows, s.scorer, cfg.eval,
                                   cfg.rollout.max_new_tokens, cfg.reward.accuracy_component, seed=cfg.trainer.seed,
                                   environment=cfg.env, advance=shown.advance)
        shown.finish(metrics)
    run.log(step, metrics)
    run.log_samples(step, [_sample_row(g, "eval") for g in groups[:3]])
    return metrics


def log_inputs_order(s: Stages, run: RunDir) -> None:
    if "reward_components" in requested_inputs(s.algorithm):  # the column order of [B, K]
        run.log(0, {"inputs/reward_components": ",".join(c.name for c in s.cfg.reward.components)})


def run_steps(cfg: Config, run: RunDir, resume: Path | None, s: Stages) -> RunResult:
    """The loop itself, on an open run directory (the asynchronous one when `rollout.max_staleness` is set)."""
    if cfg.rollout.max_staleness is not None:
        from lmrl.loops.async_ import run_async_steps

        return run_async_steps(cfg, run, resume, s)
    result = RunResult(run.path, cfg.trainer.steps)
    run_state = RunState(s, run, result)
    start, state = run_state.resume(resume)
    if state.get("stopped"):  # a run that `trainer.stop_when` ended stays ended
        result.steps, result.stopped = start, state["stopped"]
        return result
    if start == 0:
        log_inputs_order(s, run)
    progress = StepProgress(cfg.trainer.steps, start, enabled=cfg.run.progress and s.parallel.is_main)
    if start == 0 and cfg.eval.at_start and s.eval_rows:
        result.eval_before = evaluate_now(s, run, 0, progress=progress)
    boundary = run_state.boundary()
    done, saved, updates_at_boundary = start, start, s.learner.optimizer_steps
    try:
        with progress:
            for step in range(start + 1, cfg.trainer.steps + 1):
                t0 = time.perf_counter()
                threads = apply_threads(cfg.trainer.threads)
                scoring = s.scorer.seconds
                seen, kept, metrics = collect_groups(s)
                t_reward = s.scorer.seconds - scoring
                t_rollout = time.perf_counter() - t0 - t_reward
                s.scorer.check_error_rate(metrics, step)
                metrics.update(rollout_metrics(seen, cfg.reward.accuracy_component))
                generated = sum(x.num_generated for g in seen for x in g.samples)
                t1 = time.perf_counter()
                learned = learn(s, kept, step)
                if learned is None:
                    metrics["skipped_updates"] = 1.0
                else:
                    metrics.update(learned)
                    metrics.update(s.engine.update_weights(None, step))
                t_train = time.perf_counter() - t1
                result.train_seconds += time.perf_counter() - t0
                metrics.update({"timing/rollout_s": t_rollout, "timing/reward_s": t_reward, "timing/train_s": t_train,
                                "timing/step_s": time.perf_counter() - t0, "tokens_per_s": generated / t_rollout,
                                "timing/threads": float(threads),
                                **s.data_notes})
                metrics.update(run_state.guard_step(step, metrics))
                stopped = stop_reason(cfg.trainer.stop_when, metrics)
                run.log(step, {**metrics, **({"stopped": stopped} if stopped else {})})
                run.log_samples(step, [_sample_row(g, "train") for g in seen[:2]])
                run.log_rollouts(step, seen)
                progress.update(step, metrics)
                last = step == cfg.trainer.steps or stopped is not None
                if cfg.eval.every and step % cfg.eval.every == 0 and not last and s.eval_rows:
                    evaluate_now(s, run, step, progress=progress)
                if last and cfg.eval.at_end and s.eval_rows:
                    result.eval_after = evaluate_now(s, run, step, progress=progress)
                done, updates_at_boundary = step, s.learner.optimizer_steps
                boundary = {**run_state.boundary(), "stopped": stopped}
                if last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                    run_state.save(step, boundary)
                    saved = step
                if stopped:
                    result.steps, result.stopped = step, stopped
                    break
    except BaseException:
        # weights still match `boundary` (one process: the other ranks of a parallel run may be gone)
        if done > saved and s.learner.optimizer_steps == updates_at_boundary and s.parallel.world_size == 1:
            run_state.save(done, boundary)
        raise
    return result


def _sample_row(group: Group, split: str) -> dict:
    x = group.samples[0]
    return {"split": split, "prompt": group.row["question"], "completion": x.text, "reward": x.reward,
            "gold": str(group.row.get("answer")), "excluded": x.excluded}
