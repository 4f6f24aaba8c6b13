"""Single-turn tasks: rows with a prompt and a gold answer, split into train and held-out eval.

A row is a dict with at least `uid`, `question` and `answer`; tasks may add fields that rewards
read (reasoning-gym rows keep their generator entry for the dataset's own scorer).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmrl.config import TaskConfig
from lmrl.registry import Registry

TASKS: Registry = Registry("task")


class TaskError(ValueError):
    """A dataset that cannot be used (missing, empty, malformed)."""


@dataclass
class TaskData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


def _check_rows(rows: list[dict[str, Any]], source: str) -> None:
    if not rows:
        raise TaskError(f"{source}: the dataset is empty")
    for i, row in enumerate(rows):
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            raise TaskError(f"{source}: row {i} has no prompt text (set task.prompt_field)")
        if row.get("answer") is None:
            raise TaskError(f"{source}: row {i} has no gold answer (set task.answer_field)")


def _normalise(records: list[dict[str, Any]], cfg: TaskConfig, source: str) -> list[dict[str, Any]]:
    rows = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise TaskError(f"{source}: record {i} is not an object")
        missing = [f for f in (cfg.prompt_field, cfg.answer_field) if f not in rec]
        if missing:
            raise TaskError(f"{source}: record {i} lacks field(s) {missing}; present: {sorted(rec)}")
        row = {k: v for k, v in rec.items() if k not in (cfg.prompt_field, cfg.answer_field)}
        row.update(uid=str(rec.get("uid", rec.get("id", i))), question=rec[cfg.prompt_field],
                   answer=str(rec[cfg.answer_field]))
        rows.append(row)
    _check_rows(rows, source)
    return rows


def _split(rows: list[dict[str, Any]], cfg: TaskConfig, source: str) -> TaskData:
    """Hold out the last `num_eval` rows (after a seeded shuffle) for evaluation."""
    import random

    rows = list(rows)
    random.Random(cfg.seed).shuffle(rows)
    n_eval = min(cfg.num_eval, len(rows) - 1)
    train, held = rows[n_eval:][: cfg.num_train], rows[:n_eval]
    if not train:
        raise TaskError(f"{source}: no rows left for training after holding out {n_eval} for evaluation")
    return TaskData(train, held)


@TASKS.register("reasoning_gym", "procedurally generated reasoning-gym tasks, scored by the generator's verifier")
def reasoning_gym_task(cfg: TaskConfig) -> TaskData:
    import reasoning_gym

    try:
        train_ds = reasoning_gym.create_dataset(cfg.dataset, size=cfg.num_train, seed=cfg.seed, **cfg.params)
        eval_ds = reasoning_gym.create_dataset(cfg.dataset, size=max(cfg.num_eval * 3, 1),
                                               seed=cfg.seed + 1_000_003, **cfg.params)
    except (KeyError, ValueError, TypeError, AssertionError) as err:
        raise TaskError(f"reasoning-gym dataset {cfg.dataset!r} with params {cfg.params}: {err}") from None

    def rows(ds, prefix):
        return [{"uid": f"{prefix}{i}", "question": e["question"], "answer": str(e["answer"]),
                 "source": cfg.dataset, "entry": e} for i, e in enumerate(ds)]

    train = rows(train_ds, "train-")
    seen = {r["question"] for r in train}
    held = [r for r in rows(eval_ds, "eval-") if r["question"] not in seen][: cfg.num_eval]
    _check_rows(train, f"reasoning_gym:{cfg.dataset}")
    return TaskData(train, held)


@TASKS.register("jsonl", "a JSON-lines file of records with a prompt field and a gold-answer field")
def jsonl_task(cfg: TaskConfig) -> TaskData:
    path = Path(cfg.dataset)
    if not path.is_file():
        raise TaskError(f"task.dataset: no file {path}")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise TaskError(f"{path}:{n}: not valid JSON ({err.msg})") from None
    return _split(_normalise(records, cfg, str(path)), cfg, str(path))


@TASKS.register("hf_dataset", "a local Hugging Face `datasets` directory (save_to_disk) or data file")
def hf_dataset_task(cfg: TaskConfig) -> TaskData:
    import datasets

    path = Path(cfg.dataset)
    if not path.exists():
        raise TaskError(f"task.dataset: no dataset at {path} (only local datasets can be loaded offline)")
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[cfg.params.get("split", "train")]
    else:
        kind = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
        if kind is None:
            raise TaskError(f"task.dataset: unsupported file type {path.suffix!r}")
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    return _split(_normalise([dict(r) for r in ds], cfg, str(path)), cfg, str(path))


def load_task(cfg: TaskConfig) -> TaskData:
    return TASKS.get(cfg.name)(cfg)
