"""Single-turn tasks: rows with a prompt and a gold answer, split into train and held-out eval.

A row is a dict with at least `uid`, `question` and `answer`; tasks may add fields that rewards
read (reasoning-gym rows keep their generator entry for the dataset's own scorer).

A prompt field may hold text or a chat: a list of ``{"role", "content"}`` messages (the TRL / verl
format). A chat row keeps the validated list in ``prompt_messages`` (sent through the chat template as
given, see `lmrl.envs.single_turn.prompt_messages`) and its last user message as the readable
``question`` that logs and rewards read. docs/datasets.md has the rules.
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


CHAT_ROLES = ("system", "user", "assistant", "tool")
MESSAGES_FIELD = "prompt_messages"  # the row field holding a chat prompt's validated messages


def _check_rows(rows: list[dict[str, Any]], source: str) -> None:
    if not rows:
        raise TaskError(f"{source}: the dataset is empty")
    for i, row in enumerate(rows):
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            raise TaskError(f"{source}: row {i} has no prompt text (set task.prompt_field)")
        if row.get("answer") is None:
            raise TaskError(f"{source}: row {i} has no gold answer (set task.answer_field)")


def chat_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """Validate a chat prompt: a non-empty list of ``{"role", "content"}`` dicts, content a string.

    Roles are system, user, assistant or tool; at least one message is from the user and the last is
    not from the assistant (the model writes the next assistant turn). Keys whose value is None (which
    `datasets` adds to structs that lack them) are dropped; other extra keys (``name``, ``tool_call_id``)
    pass through to the chat template. `where` names the record in the errors.
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise TaskError(f"{where}: a chat prompt must be a non-empty list of {{role, content}} messages")
    messages = []
    for j, msg in enumerate(value):
        at = f"{where}: message {j}"
        if not isinstance(msg, dict):
            raise TaskError(f"{at} is {type(msg).__name__}, not a {{role, content}} object")
        msg = {k: v for k, v in msg.items() if v is not None}
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise TaskError(f"{at} has role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        content = msg.get("content")
        if not isinstance(content, str):
            kind = "missing" if content is None else f"a {type(content).__name__}"
            raise TaskError(f"{at} ({role}) content is {kind}, not a string (content parts and images "
                            "are not supported)")
        messages.append(msg)
    if not any(m["role"] == "user" for m in messages):
        raise TaskError(f"{where}: the chat prompt has no user message")
    if messages[-1]["role"] == "assistant":
        raise TaskError(f"{where}: the chat prompt ends with an assistant message; it must end with the "
                        "user (or tool) turn the model answers")
    return messages


def chat_question(messages: list[dict[str, Any]]) -> str:
    """The readable text of a chat prompt for logs and rewards: its last user message."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def _field_hint(rec: dict[str, Any], field: str, knob: str) -> str:
    """'(set task.prompt_field=prompt)' when a record lacks `field` but has a usual alternative."""
    usual = {"task.prompt_field": ("prompt", "question", "messages", "problem", "query", "input"),
             "task.answer_field": ("answer", "solution", "ground_truth", "target", "label", "output")}[knob]
    near = [f for f in usual if f in rec and f != field]
    return f" (set {knob}={near[0]})" if near else f" (set {knob})"


def _normalise(records: list[dict[str, Any]], cfg: TaskConfig, source: str) -> list[dict[str, Any]]:
    rows = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise TaskError(f"{source}: record {i} is not an object")
        for field, knob in ((cfg.prompt_field, "task.prompt_field"), (cfg.answer_field, "task.answer_field")):
            if field not in rec:
                raise TaskError(f"{source}: record {i} lacks field(s) {[field]}; present: {sorted(rec)}"
                                + _field_hint(rec, field, knob))
        if MESSAGES_FIELD in rec and cfg.prompt_field != MESSAGES_FIELD:
            raise TaskError(f"{source}: record {i} has a field {MESSAGES_FIELD!r}, which lmrl reserves for chat "
                            f"prompts; rename it, or set task.prompt_field={MESSAGES_FIELD} if it is the prompt")
        row = {k: v for k, v in rec.items() if k not in (cfg.prompt_field, cfg.answer_field)}
        prompt = rec[cfg.prompt_field]
        if isinstance(prompt, (list, tuple)):
            messages = chat_messages(prompt, f"{source}: record {i} field {cfg.prompt_field!r}")
            row[MESSAGES_FIELD] = messages
            prompt = chat_question(messages)
        elif prompt is not None and not isinstance(prompt, str):
            raise TaskError(f"{source}: record {i} field {cfg.prompt_field!r} is a {type(prompt).__name__}; "
                            "expected prompt text or a list of {role, content} messages")
        row.update(uid=str(rec.get("uid", rec.get("id", i))), question=prompt, answer=str(rec[cfg.answer_field]))
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


@TASKS.register("hf_dataset", "a Hugging Face dataset: a hub id (org/name), a save_to_disk directory or a data file")
def hf_dataset_task(cfg: TaskConfig) -> TaskData:
    """`task.dataset` is a local path (save_to_disk directory, .json/.jsonl/.csv/.parquet file) or a hub id.

    `task.params`: `split` (default train), and for hub ids `subset` (the dataset's config name, e.g.
    gsm8k's `main`) and `revision`.
    """
    import datasets

    from lmrl.models.loading import is_hub_id

    path = Path(cfg.dataset).expanduser()
    split = cfg.params.get("split", "train")
    source = str(path)
    if not path.exists() and is_hub_id(cfg.dataset):
        source = cfg.dataset
        ds = _load_hub_dataset(cfg.dataset, cfg.params.get("subset"), split, cfg.params.get("revision"))
    elif not path.exists():
        raise TaskError(f"task.dataset: no dataset at {path} (a save_to_disk directory, a data file, or a hub id "
                        "org/name)")
    elif path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        kind = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
        if kind is None:
            raise TaskError(f"task.dataset: unsupported file type {path.suffix!r}")
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    return _split(_normalise([dict(r) for r in ds], cfg, source), cfg, source)


def _load_hub_dataset(repo_id: str, subset: str | None, split: str, revision: str | None):
    """A hub dataset, local caches first when offline.

    Two caches can hold it: the hub cache (raw repo files, as `hf download --repo-type dataset` leaves
    them, under HF_HUB_CACHE) and `datasets`' own cache of prepared Arrow tables (HF_DATASETS_CACHE,
    filled by an earlier online `load_dataset`). Offline, the hub-cache snapshot is tried first; online,
    `datasets.load_dataset` goes to the hub as usual and the hub-cache snapshot is the fallback.
    """
    import datasets

    from lmrl.models.loading import cached_snapshot, first_line, hub_offline, hub_repo_folder, offline_hint

    def from_snapshot():
        folder = cached_snapshot(repo_id, "dataset")
        if folder is None or not [f for f in folder.rglob("*") if f.is_file() and f.name not in
                                  ("README.md", ".gitattributes")]:
            return None  # not cached, or only the dataset card that an online load_dataset leaves there
        return datasets.load_dataset(str(folder), name=subset, split=split)

    def from_datasets():
        return datasets.load_dataset(repo_id, name=subset, split=split, revision=revision)

    attempts = [from_snapshot, from_datasets] if hub_offline() else [from_datasets, from_snapshot]
    if revision is not None:
        attempts.remove(from_snapshot)  # the hub-cache snapshot is the one refs/main names
    errors = []
    for attempt in attempts:
        try:
            ds = attempt()
        except (KeyError, ValueError) as err:  # the dataset is there, but not this split or subset
            raise TaskError(f"task.dataset {repo_id!r} (task.params subset={subset!r}, split={split!r}): "
                            f"{first_line(err)}") from None
        except Exception as err:  # noqa: BLE001 - not found, gated, offline: reported below with the caches
            errors.append(first_line(err))
            continue
        if ds is not None:
            return ds
    folder = hub_repo_folder(repo_id, "dataset")
    raise TaskError(
        f"task.dataset {repo_id!r} is not a local path and could not be loaded as a hub dataset: searched the hub "
        f"cache {folder} ({'exists' if folder.exists() else 'does not exist'}; HF_HUB_CACHE / HF_HOME) and the "
        f"datasets cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_CACHE). {offline_hint(repo_id, 'dataset')}."
        + (f" datasets said: {'; '.join(errors)}" if errors else "")
    )


def load_task(cfg: TaskConfig) -> TaskData:
    return TASKS.get(cfg.name)(cfg)
