"""What every step does whatever its batch source: collect (sample prompts, roll out, score, filter, add
samples, pair them for a pair source), the rollout metrics, the update on a batch (provide inputs, prepare, update, replay), evaluation.

Every choice comes from a registry through `Stages`, and every per-sample input from the providers
(docs/architecture.md); the step loop itself is `loops.loop`.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from statistics import mean

from lmrl.data.samplers import sampler_metrics
from lmrl.data.sources import step_pairs
from lmrl.envs import expand_prompts, pooled, prompt_families, rollout
from lmrl.envs.mixture import TASK_FIELD
from lmrl.envs.roles import unrecorded
from lmrl.envs.tree_rollout import tree_metrics
from lmrl.eval.evaluator import evaluate
from lmrl.eval.metrics import across_tasks
from lmrl.inputs import InputContext, provide, requested_inputs
from lmrl.loops.batching import to_batch
from lmrl.loops.progress import StepProgress
from lmrl.loops.run_dir import RunDir
from lmrl.loops.setup import Stages
from lmrl.rewards.gaming import gaming_metrics
from lmrl.types import Group


def roll_out_and_score(s: Stages, rows: list[dict], generator
                       ) -> tuple[list[Group], list[list[Group]], dict[str, float]]:
    """Roll `rows` out (as `envs.expand_prompts` expands them) and score them: the groups, the prompt families the
    group filter keeps (judged on their pooled samples), and the scorer's metrics."""
    groups = rollout_rows(s, expand_prompts(rows), s.cfg.rollout.group_size, s.params, generator, controlled=True)
    metrics = s.scorer.score(groups)
    metrics.update(score_value_rollouts(s, groups))
    return groups, [f for f in prompt_families(rows, groups) if s.keep_group(pooled(f))], metrics


def score_value_rollouts(s: Stages, groups: list[Group]) -> dict[str, float]:
    """Score the groups' value-only rollouts (`Group.value_groups`) with the run's reward, apart from the
    groups' own samples: their scoring metrics as `value_rollouts/...`, with their count and generated tokens."""
    value = [v for g in groups for v in g.value_groups]
    if not value:
        return {}
    metrics = {f"value_rollouts/{k}": v for k, v in s.scorer.score(value).items()}
    samples = [x for v in value for x in v.samples]
    new_tokens = sum(len(x.completion_ids) - x.info["value_of"]["end"] for x in samples)
    metrics.update({"value_rollouts/samples": float(len(samples)), "value_rollouts/tokens": float(new_tokens)})
    return metrics


def collect_groups(s: Stages) -> tuple[list[Group], list[Group], dict[str, float]]:
    """Roll out until enough prompts pass the group filter (or the generation budget runs out), then
    add the samples of the run's sample source to the kept groups.

    Returns every group generated (for metrics), the kept groups (for the update; for a pair source
    each one's preference pair, `data.sources.step_pairs`) and metrics. A prompt may bring several
    groups (`envs.expand_prompts`); the filter judges and keeps or drops a prompt's groups together,
    on their pooled samples.
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
        observe(s, groups)
        seen += groups
        kept += families
        batches += 1
    metrics = {k: v / batches for k, v in metrics.items()}
    metrics.update(sampler_metrics(s.sampler))
    metrics.update({"data/gen_batches": float(batches), "data/kept_groups": float(min(len(kept), prompts))})
    chosen, added = s.add_samples([g for f in kept[:prompts] for g in f], partial(source_rollout, s))
    metrics.update(added)
    chosen, paired = step_pairs(s.cfg, chosen, s.learner, s.tokenizer)
    metrics.update(paired)
    return seen, chosen, metrics


def observe(s: Stages, groups: list[Group]) -> None:
    """Hand a step's scored groups to the sampler and to each rollout controller that learns from outcomes (has
    `observe`; a mixture's controller sees its task's groups)."""
    s.sampler.observe(groups)
    for task, controller in s.controllers().items():
        own = [g for g in groups if not task or g.row[TASK_FIELD] == task]
        if hasattr(controller, "observe") and own:
            controller.observe(own)


def source_rollout(s: Stages, rows: list[dict], n: int, temperature: float | None = None) -> list[Group]:
    """`n` rollouts of each of `rows` with the run's engine: the sample source's own prompts (unscored),
    sampled at the run's temperature unless the source asks for another."""
    params = s.params if temperature is None else replace(s.params, temperature=temperature)
    return rollout_rows(s, rows, n, params, s.generator)


def rollout_rows(s: Stages, rows: list[dict], n: int, params, generator, controlled: bool = False) -> list[Group]:
    """`envs.rollout` of `rows` in order, each row played by its task's environment (a mixture's task, named by the
    row, or the run's one); `controlled`: its completions written by the task's rollout controller."""
    if not s.mixture:
        controller = s.controller if controlled else None
        return rollout(s.engine, s.tokenizer, rows, n, params, generator, s.cfg.env, controller)
    groups: list[Group | None] = [None] * len(rows)
    for name, entry in s.mixture.items():
        at = [i for i, row in enumerate(rows) if row[TASK_FIELD] == name]
        if at:
            played = rollout(s.engine, s.tokenizer, [rows[i] for i in at], n, params, generator, entry.cfg.env,
                             entry.controller if controlled else None)
            for i, group in zip(at, played):
                groups[i] = group
    return groups


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
    out.update(tree_metrics(groups))  # tokens generated once per tree node against once per leaf
    for name in sorted({k for x in samples for k in x.info.get("metrics", {})}):  # rollout's own (envs)
        out[name] = mean([x.info["metrics"][name] for x in samples if name in x.info.get("metrics", {})])
    names = {k for x in scored for k in x.rewards}
    for name in sorted(names):
        out[f"reward/{name}"] = sum(x.rewards.get(name, 0.0) for x in scored) / len(scored)
    return out


def step_rollout_metrics(s: Stages, groups: list[Group]) -> dict[str, float]:
    """`rollout_metrics` of a step's groups; for a mixture each task's under `task/<name>/` by its own accuracy
    component, and the whole batch's accuracy and mean reward those of every task's samples together."""
    if not s.mixture:
        return rollout_metrics(groups, s.cfg.reward.accuracy_component)
    out = {k: v for k, v in rollout_metrics(groups, s.cfg.reward.accuracy_component).items()
           if not k.startswith(("reward/", "gaming/")) and k != "accuracy"}  # components and graders differ by task
    totals: dict[str, float] = {}
    for name, entry in s.mixture.items():
        own = [g for g in groups if g.row[TASK_FIELD] == name]
        if not own:
            continue
        metrics = rollout_metrics(own, entry.cfg.reward.accuracy_component)
        out.update({f"task/{name}/{k}": v for k, v in metrics.items()})
        scored = sum(x.excluded is None for g in own for x in g.samples)
        for key in ("accuracy", "reward/mean"):
            if scored:
                totals[key] = totals.get(key, 0.0) + metrics[key] * scored
        totals["scored"] = totals.get("scored", 0.0) + scored
    for key in ("accuracy", "reward/mean"):
        out[key] = totals[key] / totals["scored"] if totals.get("scored") else float("nan")
    return out


def batch_inputs(s: Stages, groups: list[Group], step: int) -> InputContext:
    """What the input providers may read for this step's batch of `groups`."""
    return InputContext(s.cfg, groups, requested_inputs(s.algorithm), step=step, learner=s.learner,
                        tokenizer=s.tokenizer, algorithm=s.algorithm)


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
    """Evaluate the held-out rows with `engine` (the run's own by default), show it on `progress`, log the result.
    The roles its episodes call answer without recording: nothing of an evaluation is trained on."""
    metrics, groups = {}, []
    if s.eval_rows:
        with (progress or StepProgress(0, 0, enabled=False)).evaluation(step) as shown, unrecorded():
            metrics, groups = held_out(s, engine or s.engine, shown.advance)
            shown.finish(metrics)
    if s.offline is not None and s.offline.eval:
        metrics.update(held_out_loss(s, step))
    run.log(step, metrics)
    run.log_samples(step, [sample_row(g, "eval") for g in groups[:3]])
    return metrics


def held_out(s: Stages, engine, advance) -> tuple[dict[str, float], list[Group]]:
    """`evaluate` on the held-out rows; for a mixture each task's rows by its own reward, accuracy component and
    environment, its metrics under `eval/task/<name>/…`, and each metric all tasks report also for the whole held-out
    set (`eval/accuracy`: weighted by each task's prompts)."""
    cfg, first = s.cfg, slice(0, s.cfg.eval.num_prompts)  # eval.num_prompts: of each task's rows
    tasks = [(None, s.eval_rows[first], s.scorer, cfg)] if not s.mixture else \
        [(name, e.eval_rows[first], s.scorer.scorers[name], e.cfg) for name, e in s.mixture.items() if e.eval_rows]
    total, done = sum(len(rows) for _, rows, _, _ in tasks), 0
    metrics, groups, per_task = {}, [], {}
    for name, rows, scorer, own in tasks:
        def shown(k: int, n: int, start: int = done, size: int = len(rows)) -> None:  # n = phases · size
            advance(start * n // size + k, total * n // size)

        got, played = evaluate(engine, s.tokenizer, rows, scorer, cfg.eval, cfg.rollout.max_new_tokens,
                               own.reward.accuracy_component, seed=cfg.trainer.seed, environment=own.env,
                               advance=shown)
        done += len(rows)
        groups += played
        if name is None:
            metrics = got
        else:
            per_task[name] = got
            metrics.update({f"eval/task/{name}/{k.removeprefix('eval/')}": v for k, v in got.items()})
    metrics.update(across_tasks(per_task, "eval/num_prompts"))
    return metrics, groups


def held_out_loss(s: Stages, step: int) -> dict[str, float]:
    """The objective and its terms' metrics on an offline source's held-out groups, without an update:
    `eval/loss` and `eval/<metric>`, in batches of `batches.size` groups, weighted by their tokens."""
    groups, size = s.offline.eval, s.cfg.batches.size
    starts = list(range(0, len(groups), size))
    if len(starts) > 1 and len(groups) - starts[-1] == 1:  # no batch of one row (KTO pairs rows with others)
        starts.pop()
    totals: dict[str, float] = {}
    weight = 0.0
    for start, end in zip(starts, starts[1:] + [len(groups)]):
        inputs = batch_inputs(s, groups[start: end], step)
        batch = to_batch(inputs, s.engine.pad_token_id)
        provide(batch, inputs, with_learner=True)
        s.algorithm.prepare(batch)
        tokens = float(batch.completion_mask.sum())
        for name, value in s.learner.evaluate(batch, s.algorithm).items():
            totals[name] = totals.get(name, 0.0) + value * tokens
        weight += tokens
    return {f"eval/{name}": value / max(weight, 1.0) for name, value in totals.items()}


def log_inputs_order(s: Stages, run: RunDir) -> None:
    if "reward_components" in requested_inputs(s.algorithm):  # the column order of [B, K]
        run.log(0, {"inputs/reward_components": ",".join(c.name for c in s.cfg.reward.components)})


def sample_row(group: Group, split: str) -> dict:
    """The first sample of `group` as a row of the samples log."""
    x = group.samples[0]
    return {"split": split, "prompt": group.row["question"], "completion": x.text, "reward": x.reward,
            "gold": str(group.row.get("answer")), "excluded": x.excluded}
