"""Task mixtures: several tasks in one run, each with its own rows, rewards, environment and sampler.

A mixture's task is the run's config with the task's sections over it (`mixture_configs`), so everything a task
can say alone it says inside a mixture: its rows are loaded and encoded by its own `task` section
(`load_mixture`), and carry `task` (the entry's name) and a uid prefixed by it. How a step's prompts are split
among the tasks and how each is scored: `lmrl.data.mixture`; docs/mixtures.md.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from lmrl.config import Config, ConfigError, MixtureConfig
from lmrl.envs.prepare import encode_task
from lmrl.envs.tasks import TaskData, load_task
from lmrl.recipe_files import check_keys, merge_trees

TASK_FIELD = "task"  # the row field naming the mixture task a row belongs to
OWN_DATA_KEYS = ("sampler", "sampler_params")  # what of `data` a task may set; the rest is the run's


@dataclass
class MixtureEntry:
    """A task of the mixture: its name, weight and full config; its rows once loaded."""

    name: str
    weight: float
    cfg: Config
    train_rows: list[dict] = field(default_factory=list)
    eval_rows: list[dict] = field(default_factory=list)
    controller: Any = None  # what writes its rollouts' completions (`rollout.controller`); None: the engine


def mixture_configs(cfg: Config) -> list[MixtureEntry]:
    """Each mixture task's own config: the run's config without `mixture`, the task's sections over it.
    Empty for a run of one task. A bad key or value is a ConfigError naming `mixture.tasks[i].…`."""
    tasks = cfg.mixture.tasks
    if not tasks:
        return []
    names = [t.name for t in tasks]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigError(f"mixture.tasks: the name {doubled[0]!r} is used twice; each task needs its own name")
    if not any(t.weight > 0 for t in tasks) and cfg.mixture.sampling != "schedule":
        raise ConfigError("mixture.tasks: every weight is 0, so no task would be sampled")
    base = cfg.model_dump(mode="json", exclude={"mixture"})
    entries = []
    for i, task in enumerate(tasks):
        where = f"mixture.tasks[{i}] ({task.name})"
        extra = sorted(set(task.data) - set(OWN_DATA_KEYS))
        if extra:
            raise ConfigError(f"{where}.data.{extra[0]}: a task sets only its {' and '.join(OWN_DATA_KEYS)}; "
                              f"the rest of `data` is the run's (set it at the top level)")
        overlay = {k: getattr(task, k) for k in ("task", "reward", "env", "data") if getattr(task, k)}
        try:
            check_keys(overlay, Config, prefix=f"{where}.")
        except ConfigError as err:
            raise ConfigError(str(err)) from None
        if "data" in overlay and "sampler" in overlay["data"] and "sampler_params" not in overlay["data"]:
            overlay["data"]["sampler_params"] = {}  # another sampler's knobs are not this one's
        try:
            own = Config.model_validate(merge_trees(base, overlay))
        except ValidationError as err:
            lines = [f"{where}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
            raise ConfigError("invalid mixture task:\n  " + "\n  ".join(lines)) from None
        entries.append(MixtureEntry(task.name, task.weight, own))
    _check_schedule(cfg.mixture, names)
    return entries


def _check_schedule(mixture: MixtureConfig, names: list[str]) -> None:
    if mixture.sampling != "schedule":
        if mixture.schedule:
            raise ConfigError(f"mixture.schedule is set but mixture.sampling={mixture.sampling}: set "
                              "mixture.sampling=schedule to use it")
        return
    if not mixture.schedule:
        raise ConfigError("mixture.sampling=schedule needs mixture.schedule: a list of {step, weights}")
    steps = [p.step for p in mixture.schedule]
    if steps != sorted(set(steps)):
        raise ConfigError(f"mixture.schedule: the steps {steps} must increase")
    for point in mixture.schedule:
        unknown = sorted(set(point.weights) - set(names))
        if unknown:
            raise ConfigError(f"mixture.schedule at step {point.step}: no task {unknown[0]!r} "
                              f"(tasks: {', '.join(names)})")
        if any(w < 0 for w in point.weights.values()) or not any(w > 0 for w in point.weights.values()):
            raise ConfigError(f"mixture.schedule at step {point.step}: weights must be >= 0 with one > 0")


def tag_rows(rows: list[dict], name: str) -> list[dict]:
    """`rows` of task `name`: each with `task` and a uid that names the task (unique across the mixture)."""
    out = []
    for row in rows:
        row = copy.copy(row)
        row[TASK_FIELD] = name
        row["uid"] = f"{name}/{row['uid']}"
        out.append(row)
    return out


def load_mixture(cfg: Config, tokenizer) -> tuple[list[MixtureEntry], TaskData, dict[str, float]]:
    """Every task's rows, loaded and encoded by its own config and tagged (`tag_rows`); all of them as one
    TaskData (for the run's summary) and the data notes summed over the tasks. A task with fewer training rows
    than the most prompts a step can ask of it would repeat a prompt within a step: refused."""
    entries, notes = mixture_configs(cfg), {}
    for entry in entries:
        task = load_task(entry.cfg.task)
        train, held, own = encode_task(entry.cfg, tokenizer, task)
        entry.train_rows, entry.eval_rows = tag_rows(train, entry.name), tag_rows(held, entry.name)
        if not held and entry.cfg.task.num_eval != 0:
            raise ConfigError(f"mixture task {entry.name}: no held-out rows ({task.summary()}), so its evaluation "
                              "would be missing from every one; give it held-out rows (a larger space of problems, "
                              "task.params.eval_dataset) or set its task.num_eval: 0 to train it unevaluated")
        for k, v in own.items():
            notes[k] = notes.get(k, 0.0) + v
    n = cfg.rollout.prompts_per_step
    for entry in entries:
        most = min(n, math.ceil(most_share(cfg.mixture, entry, entries) * n) + 1)
        if len(entry.train_rows) < most:
            raise ConfigError(f"mixture task {entry.name}: {len(entry.train_rows)} training rows, fewer than the "
                              f"{most} prompts a step may draw from it (its share of rollout.prompts_per_step={n}); "
                              "give it more rows, a smaller weight, or lower rollout.prompts_per_step")
    train = [r for e in entries for r in e.train_rows]
    held = [r for e in entries for r in e.eval_rows]
    split = "; ".join(f"{e.name}: {len(e.train_rows)} + {len(e.eval_rows)} held out" for e in entries)
    return entries, TaskData(train, held, f"a mixture of {len(entries)} tasks, {split}"), notes


def most_share(mixture: MixtureConfig, entry: MixtureEntry, entries: list[MixtureEntry]) -> float:
    """The largest share of a step's prompts `entry` can get by `mixture.sampling` (its rows loaded); by
    progress, its floor of its weight share plus all the rest (`lmrl.data.mixture.LearningProgress`)."""
    steps = [p.step for p in mixture.schedule] if mixture.sampling == "schedule" else [1]
    most = max(task_shares(mixture, entries, step)[entry.name] for step in steps)
    return mixture.progress_floor * most + 1 - mixture.progress_floor if mixture.sampling == "progress" else most


def task_shares(mixture: MixtureConfig, entries: list[MixtureEntry], step: int) -> dict[str, float]:
    """p_k, each task's share of step `step`'s prompts (summing to 1): proportional, p ∝ weight; temperature,
    p ∝ (weight · training rows)^(1/temperature); schedule, p ∝ the weights at `step`, linear between the
    schedule's points and held before the first and after the last; progress, p ∝ weight here, the prior
    that the sampler moves by each task's learning progress (`lmrl.data.mixture.LearningProgress`)."""
    names = [e.name for e in entries]
    if mixture.sampling in ("proportional", "progress"):
        raw = {e.name: e.weight for e in entries}
    elif mixture.sampling == "temperature":
        raw = {e.name: (e.weight * len(e.train_rows)) ** (1.0 / mixture.temperature) for e in entries}
    else:
        raw = _scheduled(mixture, names, step)
    total = sum(raw.values())
    return {n: raw.get(n, 0.0) / total for n in names}


def _scheduled(mixture: MixtureConfig, names: list[str], step: int) -> dict[str, float]:
    points = mixture.schedule
    if step <= points[0].step:
        return dict(points[0].weights)
    for a, b in zip(points, points[1:]):
        if step <= b.step:
            t = (step - a.step) / (b.step - a.step)
            return {n: (1 - t) * a.weights.get(n, 0.0) + t * b.weights.get(n, 0.0) for n in names}
    return dict(points[-1].weights)
