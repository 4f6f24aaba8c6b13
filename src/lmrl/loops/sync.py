"""The synchronous training loop: sample prompts, roll out, score, filter, update, checkpoint.

Read top to bottom, this file is the algorithm-agnostic RL loop; every choice it makes comes
from a registry through `Stages`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmrl.algos.inputs import ROW_FIELD_INPUTS, canonical
from lmrl.config import Config, ConfigError, check_resume_config, load_run_config
from lmrl.data.demonstrations import DEMO_CODES, ON_POLICY_CODES, add_demonstrations
from lmrl.envs import rollout
from lmrl.envs.single_turn import with_variants
from lmrl.eval.evaluator import evaluate
from lmrl.learners.checkpoint import (clean_partial, latest_checkpoint, load_checkpoint, restore_rng, rng_state,
                                     save_checkpoint)
from lmrl.loops.pmi import pmi, pmi_field
from lmrl.models.threads import apply_threads
from lmrl.rewards.gaming import gaming_metrics
from lmrl.loops.progress import StepProgress
from lmrl.loops.run_dir import RunDir
from lmrl.loops.setup import Stages, build_stages
from lmrl.loops.trackers import Trackers
from lmrl.types import Group, collate


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0  # wall time of the steps run in this process, evaluations excluded


def collect_groups(s: Stages) -> tuple[list[Group], list[Group], dict[str, float]]:
    """Roll out until enough prompts pass the group filter (or the generation budget runs out).

    Returns every group generated (for metrics), the kept groups (for the update) and metrics. With
    `task.prompt_variants`, a prompt brings one group per variant; the filter judges and keeps or
    drops a prompt's groups together, on their pooled samples.
    """
    prompts, n = s.cfg.rollout.prompts_per_step, s.cfg.rollout.group_size
    family = 1 + len(s.cfg.task.prompt_variants)
    kept: list[list[Group]] = []
    seen: list[Group] = []
    metrics: dict[str, float] = {}
    batches = 0
    while len(kept) < prompts and (s.cfg.data.max_gen_batches == 0 or batches < s.cfg.data.max_gen_batches):
        groups = rollout(s.engine, s.tokenizer, with_variants(s.sampler.next_prompts(prompts)), n, s.params,
                         s.generator)
        for k, v in s.scorer.score(groups).items():
            metrics[k] = metrics.get(k, 0.0) + v
        seen += groups
        families = [groups[i: i + family] for i in range(0, len(groups), family)]
        kept += [f for f in families if s.keep_group(pooled(f))]
        batches += 1
    metrics = {k: v / batches for k, v in metrics.items()}
    metrics.update({"data/gen_batches": float(batches), "data/kept_groups": float(min(len(kept), prompts))})
    chosen = [g for f in kept[:prompts] for g in f]
    if s.cfg.data.demonstrations != "none":
        source = s.cfg.task.peer_rollouts if s.cfg.data.demonstrations == "peers" else s.cfg.task.demonstration
        chosen, added = add_demonstrations(chosen, s.cfg.data.demonstrations, source, s.tokenizer,
                                           s.scorer, s.cfg.reward.accuracy_component, s.tokenizer.eos_token_id)
        metrics.update(added)
    return seen, chosen, metrics


def pooled(groups: list[Group]) -> Group:
    """One prompt's groups (itself and its variants) as a single group, for the group filter."""
    if len(groups) == 1:
        return groups[0]
    return Group(uid=groups[0].uid, row=groups[0].row, samples=[x for g in groups for x in g.samples])


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
    names = {k for x in scored for k in x.rewards}
    for name in sorted(names):
        out[f"reward/{name}"] = sum(x.rewards.get(name, 0.0) for x in scored) / len(scored)
    return out


def row_field_tensor(values: list, name: str) -> torch.Tensor:
    """A task row field as a tensor: numbers give [B], lists give [B, P] padded with NaN (absent entries)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float if any(isinstance(v, float) for v in values) else torch.long)
    if all(isinstance(v, (list, tuple)) for v in values):
        out = torch.full((len(values), max((len(v) for v in values), default=0)), float("nan"))
        for i, v in enumerate(values):
            out[i, : len(v)] = torch.tensor([float("nan") if e is None else float(e) for e in v])
        return out
    raise ValueError(f"task field {name!r} must be a number or a list of numbers in every row")


def scored_samples(group: Group) -> list:
    """The samples of a group that enter the update, in batch order."""
    return [x for x in group.samples if x.excluded is None]


def to_batch(groups: list[Group], pad_id: int, accuracy_component: str | None = None,
             component_names: list[str] | None = None, row_fields: set[str] | frozenset = frozenset(),
             group_by: str | None = None):
    """Collate the scored samples with their per-sample inputs.

    `extras`: per-sample correctness and its group mean. `row_extras`: the reward components
    [B, K] in the order of `component_names` (NaN where a component gave none) and each task row
    field of `row_fields`. `group_by`: rows whose task rows share this field's value form one group
    (default: each prompt is a group).
    """
    samples, index, acc, group_acc, rows = [], [], [], [], []
    keys: dict = {}
    for gi, g in enumerate(groups):
        scored = scored_samples(g)
        correct = [float(x.rewards.get(accuracy_component, 0.0) >= 1.0) for x in scored]
        rescue = any(x.info.get("demonstration") == "rescue" for x in scored)
        key = ("rescue", gi) if rescue else gi if group_by is None else repr(g.row[group_by])
        group = keys.setdefault(key, len(keys))
        for x, c in zip(scored, correct):
            samples.append(x)
            index.append(group)
            acc.append(c)
            group_acc.append(sum(correct) / len(correct))
            rows.append(g.row)
    if not samples:
        return None
    batch = collate(samples, index, pad_id)
    batch.extras.update(acc=torch.tensor(acc), group_acc=torch.tensor(group_acc))
    if component_names:
        batch.row_extras["reward_components"] = torch.tensor(
            [[float("nan") if x.rewards.get(n) is None else float(x.rewards[n]) for n in component_names]
             for x in samples])
        batch.context["reward_component_names"] = list(component_names)
    for name in sorted(row_fields):
        batch.row_extras[name] = row_field_tensor([r[name] for r in rows], name)
    if any(x.info.get("demonstration") for x in samples):
        batch.row_extras["demonstration"] = torch.tensor([DEMO_CODES.get(x.info.get("demonstration"), 0.0)
                                                          for x in samples])
    return batch


def fill_inputs(s: Stages, batch, groups: list[Group], step: int) -> None:
    """The inputs the algorithm declares that need the model or the loop's state, before `prepare`:
    the step, reference log-probs, PMI, and the model outputs of a no-grad pass (values, hidden states,
    token entropies)."""
    batch.context.update(step=step, total_steps=s.cfg.trainer.steps)
    if "demonstration" in batch.row_extras:  # not sampled by the engine: the current policy's log-probs
        codes = batch.row_extras["demonstration"]
        rows = torch.isin(codes, torch.tensor(ON_POLICY_CODES)).nonzero().flatten().tolist()
        if rows:
            batch.behaviour_logprobs[rows] = s.learner.logprobs(batch, rows=rows)[rows]
    if s.algorithm.needs_reference:
        batch.extras["ref_logp"] = s.learner.logprobs(batch, reference=True)
    if "pmi" in s.algorithm.requires:
        rows = [g.row for g in groups for _ in scored_samples(g)]
        batch.extras["pmi"] = pmi(batch, rows, s.learner, s.tokenizer, s.cfg.task.system_prompt,
                                  pmi_field(s.cfg.algo.advantage_params))
    if s.algorithm.prepare_outputs:
        batch.extras.update(s.learner.model_outputs(batch, s.algorithm.prepare_outputs, s.algorithm.hidden_layer))


def step_boundary(s: Stages, gens: dict, run: RunDir) -> dict:
    """Everything besides the weights that a checkpoint at the end of this step must restore, including
    how far the logs had got (a resumed run rewinds them there and logs the rest again)."""
    return {"sampler": s.sampler.state_dict(), "rng": rng_state(gens), "algorithm": s.algorithm.state_dict(),
            "rewards": s.scorer.state_dict(), "logs": run.positions()}


def open_run(cfg: Config, resume: Path | None) -> RunDir:
    """The run directory: a new one, or `resume`, whose own config must match `cfg` (but for resumable keys)."""
    if resume is not None and (Path(resume) / "config.yaml").exists():
        check_resume_config(load_run_config(resume), cfg, resume)
    run = RunDir.new(cfg) if resume is None else RunDir(Path(resume))
    run.write_config(cfg)  # first thing: a run killed while it loads can already be resumed
    clean_partial(run.checkpoints)
    run.trackers = Trackers.from_config(cfg.run.trackers, run.path, cfg.model_dump(mode="json"))
    return run


def train(cfg: Config, resume: Path | None = None, stages: Stages | None = None) -> RunResult:
    """Run `cfg` to completion (or continue the run directory `resume` from its last complete checkpoint).

    Killed at any moment, a run resumed with `resume` ends with the same weights, optimiser state and
    logs as if it had never stopped: each step's evaluation happens before its checkpoint, and the
    checkpoint records how far the logs had got (docs/runs.md).
    """
    run = open_run(cfg, resume)
    with run.trackers:
        return run_steps(cfg, run, resume, stages or build_stages(cfg))


def run_steps(cfg: Config, run: RunDir, resume: Path | None, s: Stages) -> RunResult:
    """The loop itself, on an open run directory."""
    pad_id = s.engine.pad_token_id
    gens = {"rollout": s.generator, "shuffle": s.learner.shuffle}
    start = 0
    result = RunResult(run.path, cfg.trainer.steps)
    if resume and (ckpt := latest_checkpoint(run.checkpoints)) is None:
        run.rewind(None)  # killed before its first checkpoint: start over
    elif resume:
        state = load_checkpoint(ckpt, s.model, s.learner.optimizer, s.learner.scheduler, modules=s.learner.modules())
        start = state["step"]
        if start > cfg.trainer.steps:
            raise ConfigError(f"{ckpt} is at step {start}, past trainer.steps={cfg.trainer.steps}")
        s.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"], gens)
        s.algorithm.load_state_dict(state.get("algorithm", {}))
        s.scorer.load_state_dict(state.get("rewards", {}))
        result.eval_before, result.eval_after = state.get("eval_before", {}), state.get("eval_after", {})
        s.engine.update_weights(None, start)
        if "logs" in state:
            run.rewind(state["logs"])
        else:  # a checkpoint from a version that did not record log positions
            run.truncate_after(start)

    def evaluate_now(step: int) -> dict[str, float]:
        metrics, groups = evaluate(s.engine, s.tokenizer, s.eval_rows, s.scorer, cfg.eval, cfg.rollout.max_new_tokens,
                                   cfg.reward.accuracy_component, seed=cfg.trainer.seed)
        run.log(step, metrics)
        run.log_samples(step, [_sample_row(g, "eval") for g in groups[:3]])
        return metrics

    def checkpoint(step: int, boundary: dict) -> None:
        save_checkpoint(run.checkpoints, step, s.model, s.tokenizer, s.learner.optimizer, s.learner.scheduler,
                        {"step": step, "eval_before": result.eval_before, "eval_after": result.eval_after, **boundary},
                        keep=cfg.run.keep_checkpoints, modules=s.learner.modules())

    component_names = [c.name for c in cfg.reward.components]
    row_fields = s.algorithm.requires & ROW_FIELD_INPUTS
    if start == 0 and "reward_components" in canonical(s.algorithm.requires):
        run.log(0, {"inputs/reward_components": ",".join(component_names)})  # column order of [B, K]

    if start == 0 and cfg.eval.at_start and s.eval_rows:
        result.eval_before = evaluate_now(0)
    boundary = step_boundary(s, gens, run)
    done, saved, updates_at_boundary = start, start, s.learner.optimizer_steps
    progress = StepProgress(cfg.trainer.steps, start, enabled=cfg.run.progress)
    try:
        with progress:
            for step in range(start + 1, cfg.trainer.steps + 1):
                t0 = time.perf_counter()
                threads = apply_threads(cfg.trainer.threads)
                seen, kept, metrics = collect_groups(s)
                t_rollout = time.perf_counter() - t0
                metrics.update(rollout_metrics(seen, cfg.reward.accuracy_component))
                generated = sum(x.num_generated for g in seen for x in g.samples)
                batch = to_batch(kept, pad_id, cfg.reward.accuracy_component, component_names, row_fields,
                                 cfg.algo.group_by)
                t1 = time.perf_counter()
                if batch is not None:
                    fill_inputs(s, batch, kept, step)
                    metrics.update(s.algorithm.prepare(batch))
                    metrics.update(s.learner.update(batch, s.algorithm))
                    metrics.update(s.algorithm.after_update(batch, metrics))
                    for extra in s.algorithm.replays(batch):
                        replayed = s.learner.update(extra, s.algorithm, step_scheduler=False)
                        metrics.update({f"replay/{k}": v for k, v in replayed.items()})
                    s.engine.update_weights(None, step)
                else:
                    metrics["skipped_updates"] = 1.0
                t_train = time.perf_counter() - t1
                result.train_seconds += time.perf_counter() - t0
                metrics.update({"timing/rollout_s": t_rollout, "timing/train_s": t_train,
                                "timing/step_s": time.perf_counter() - t0, "tokens_per_s": generated / t_rollout,
                                "timing/threads": float(threads),
                                **s.data_notes})
                run.log(step, metrics)
                run.log_samples(step, [_sample_row(g, "train") for g in seen[:2]])
                progress.update(step, metrics)
                last = step == cfg.trainer.steps
                if cfg.eval.every and step % cfg.eval.every == 0 and not last and s.eval_rows:
                    evaluate_now(step)
                if last and cfg.eval.at_end and s.eval_rows:
                    result.eval_after = evaluate_now(step)
                done, updates_at_boundary = step, s.learner.optimizer_steps
                boundary = step_boundary(s, gens, run)
                if last or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
                    checkpoint(step, boundary)
                    saved = step
    except BaseException:
        if done > saved and s.learner.optimizer_steps == updates_at_boundary:  # weights still match `boundary`
            checkpoint(done, boundary)
        raise
    return result


def _sample_row(group: Group, split: str) -> dict:
    x = group.samples[0]
    return {"split": split, "prompt": group.row["question"], "completion": x.info["text"], "reward": x.reward,
            "gold": str(group.row.get("answer")), "excluded": x.excluded}
