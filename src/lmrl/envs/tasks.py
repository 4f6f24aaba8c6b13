"""Single-turn tasks: rows with a prompt and a gold answer, split into train and held-out eval.

A row is a dict with at least `uid`, `question` and `answer`; tasks may add fields that rewards
read (reasoning-gym rows keep their generator entry for the dataset's own scorer). A row read from a
dataset keeps every field of its record under the record's own name; `question` and `answer` also
hold its prompt text and its gold answer (as a string), the names lmrl's rewards read.

The held-out rows: `task.eval_dataset` (or, for hf_dataset, `task.params.eval_split`) when given;
otherwise `task.num_eval` rows of the dataset, and when that is unset 10% of its rows, at most 100.

A prompt field may hold text or a chat: a list of ``{"role", "content"}`` messages (the TRL / verl
format). A chat row keeps the validated list in ``prompt_messages`` (sent through the chat template as
given, see `lmrl.envs.single_turn.prompt_messages`) and its last user message as the readable
``question`` that logs and rewards read. docs/datasets.md has the rules.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from lmrl.config import TaskConfig
from lmrl.recipe_files import shipped_or_local
from lmrl.registry import Registry

DEFAULT_NUM_EVAL = 100  # held-out rows when task.num_eval is unset: what generated tasks make, the most a share takes
EVAL_SHARE = 10  # ... a fixed dataset holds out one row in EVAL_SHARE (10%)



@dataclass(frozen=True)
class TaskSpec:
    """What a task declares. `splits_rows`: it splits a fixed set of rows with `split_rows`, which reads an
    unset task.num_eval as a share of them; a task that does not gets task.num_eval=100 when it is unset."""

    splits_rows: bool = False


TASKS: Registry = Registry("task", declares=TaskSpec)


class TaskError(ValueError):
    """A dataset that cannot be used (missing, empty, malformed)."""


@dataclass
class TaskData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    held_out_from: str = ""  # how the held-out rows were chosen, for the run's first line and --dry-run

    def summary(self) -> str:
        """'36 training rows, 4 held out (10% of the 40 rows, …)': what a run prints before it trains."""
        how = f" ({self.held_out_from})" if self.held_out_from else ""
        return f"{len(self.train)} training rows, {len(self.eval)} held out{how}"


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


def chat_message(msg: Any, at: str) -> dict[str, Any]:
    """One validated chat message: a dict with a known role and string content (keys whose value is None, which
    `datasets` adds to structs that lack them, dropped). An assistant message with `tool_calls` (a list) may lack
    content; it gets "". `at` names the message in the errors."""
    if not isinstance(msg, dict):
        raise TaskError(f"{at} is {type(msg).__name__}, not a {{role, content}} object")
    msg = {k: v for k, v in msg.items() if v is not None}
    role = msg.get("role")
    if role not in CHAT_ROLES:
        raise TaskError(f"{at} has role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
    if "tool_calls" in msg and (role != "assistant" or not isinstance(msg["tool_calls"], (list, tuple))):
        raise TaskError(f"{at} ({role}) has tool_calls; only an assistant message may, as a list of calls")
    if "tool_calls" in msg:
        msg.setdefault("content", "")
    content = msg.get("content")
    if not isinstance(content, str):
        kind = "missing" if content is None else f"a {type(content).__name__}"
        raise TaskError(f"{at} ({role}) content is {kind}, not a string (content parts and images "
                        "are not supported)")
    return msg


def chat_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """Validate a chat prompt: a non-empty list of ``{"role", "content"}`` dicts, content a string.

    Roles are system, user, assistant or tool; at least one message is from the user and the last is
    not from the assistant (the model writes the next assistant turn). Keys whose value is None (which
    `datasets` adds to structs that lack them) are dropped; other extra keys (``name``, ``tool_call_id``)
    pass through to the chat template. `where` names the record in the errors.
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise TaskError(f"{where}: a chat prompt must be a non-empty list of {{role, content}} messages")
    messages = [chat_message(msg, f"{where}: message {j}") for j, msg in enumerate(value)]
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


def _canonical_clash(rec: dict[str, Any], name: str, value: str, field: str, knob: str, at: str) -> None:
    """A record's own field named `question` / `answer` that is not its prompt / gold would be hidden by lmrl's."""
    if name != field and name in rec and str(rec[name]) != value:
        what = "prompt text" if name == "question" else "gold answer"
        raise TaskError(f"{at} has a field {name!r} besides {knob}={field!r}: lmrl puts the {what} under {name!r}, "
                        f"which would hide the record's own; rename that field, or set {knob}={name}")


def _normalise(records: list[dict[str, Any]], cfg: TaskConfig, source: str, lines: list[int] | None = None,
               uid_prefix: str = "") -> list[dict[str, Any]]:
    """Rows from records: every field kept under its own name, plus `uid`, `question` (the prompt text) and
    `answer` (the gold, as a string). `lines`: each record's line in the file, for the errors."""
    rows = []
    for i, rec in enumerate(records):
        at = f"{source}:{lines[i]}: record {i}" if lines else f"{source}: record {i}"
        if not isinstance(rec, dict):
            raise TaskError(f"{at} is not an object")
        for field, knob in ((cfg.prompt_field, "task.prompt_field"), (cfg.answer_field, "task.answer_field")):
            if field not in rec:
                raise TaskError(f"{at} lacks field(s) {[field]}; present: {sorted(rec)}" + _field_hint(rec, field, knob))
        if MESSAGES_FIELD in rec and cfg.prompt_field != MESSAGES_FIELD:
            raise TaskError(f"{at} has a field {MESSAGES_FIELD!r}, which lmrl reserves for chat "
                            f"prompts; rename it, or set task.prompt_field={MESSAGES_FIELD} if it is the prompt")
        row = dict(rec)
        prompt = rec[cfg.prompt_field]
        if isinstance(prompt, (list, tuple)):
            row[MESSAGES_FIELD] = chat_messages(prompt, f"{at} field {cfg.prompt_field!r}")
            prompt = chat_question(row[MESSAGES_FIELD])
        elif prompt is not None and not isinstance(prompt, str):
            raise TaskError(f"{at} field {cfg.prompt_field!r} is a {type(prompt).__name__}; "
                            "expected prompt text or a list of {role, content} messages")
        gold = rec[cfg.answer_field]
        if gold is None:
            raise TaskError(f"{at} has no gold answer: field {cfg.answer_field!r} is null (every row needs one; "
                            "drop the row or fill it in)")
        if prompt is not None:
            _canonical_clash(rec, "question", prompt, cfg.prompt_field, "task.prompt_field", at)
        _canonical_clash(rec, "answer", str(gold), cfg.answer_field, "task.answer_field", at)
        row.update(uid=str(rec.get("uid", rec.get("id", f"{uid_prefix}{i}"))), question=prompt, answer=str(gold))
        rows.append(row)
    _check_rows(rows, source)
    return rows


def _held_out_size(cfg: TaskConfig, n: int, source: str) -> tuple[int, str]:
    """How many of a dataset's `n` rows are held out, and how that was decided (for the run's first line)."""
    if cfg.num_eval is None:
        size = min(DEFAULT_NUM_EVAL, n // EVAL_SHARE)
        return size, f"{100 // EVAL_SHARE}% of the {n} rows, at most {DEFAULT_NUM_EVAL}: task.num_eval unset"
    if cfg.num_eval >= n:
        raise TaskError(f"task.num_eval={cfg.num_eval} holds out all {n} rows of {source}, leaving none to train on; "
                        f"lower it, unset it ({100 // EVAL_SHARE}% of the rows, at most {DEFAULT_NUM_EVAL}) or give "
                        "the held-out rows their own file (task.params.eval_dataset)")
    return cfg.num_eval, f"task.num_eval={cfg.num_eval} of the {n} rows"


def split_rows(rows: list[dict[str, Any]], cfg: TaskConfig, source: str) -> TaskData:
    """Hold out the first rows of a seeded shuffle for evaluation (`task.num_eval`, unset: a tenth, at most
    100); up to `task.num_train` of the others train."""
    rows = list(rows)
    random.Random(cfg.seed).shuffle(rows)
    n_eval, how = _held_out_size(cfg, len(rows), source)
    return TaskData(rows[n_eval:][: cfg.num_train], rows[:n_eval], how)


def _with_held_out(rows: list[dict[str, Any]], held: list[dict[str, Any]], cfg: TaskConfig, source: str) -> TaskData:
    """Every dataset row may train (a seeded shuffle, up to `task.num_train`); the held-out rows are the first
    `task.num_eval` (unset: 100) of their own source, in its order."""
    rows = list(rows)
    random.Random(cfg.seed).shuffle(rows)
    cap = DEFAULT_NUM_EVAL if cfg.num_eval is None else cfg.num_eval
    note = f"the first {cap} of its {len(held)}" if len(held) > cap else f"its {len(held)}"
    return TaskData(rows[: cfg.num_train], held[:cap], f"{note} rows of {source}")


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
    return TaskData(train, held, "generated apart, none of the training questions")


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a UTF-8 text file with their numbers, read one at a time; invalid UTF-8 names the
    file, the line and the byte."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise TaskError(f"{path}:{n}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                f"{err.start + 1}); save the file as UTF-8") from None
            if line.strip():
                yield n, line


def read_jsonl(path: Path, key: str) -> tuple[list[Any], list[int]]:
    """A JSON-lines file's records and their line numbers."""
    if not path.is_file():
        raise TaskError(f"{key}: no such file {path}")
    records, lines = [], []
    for n, line in text_lines(path):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise TaskError(f"{path}:{n}: not valid JSON ({err.msg})") from None
        lines.append(n)
    return records, lines


@TASKS.register("jsonl", "a JSON-lines file of records with a prompt field and a gold-answer field", splits_rows=True)
def jsonl_task(cfg: TaskConfig) -> TaskData:
    """`task.dataset` is the file. `task.params.eval_dataset`, a second such file, holds the held-out rows;
    without it they are taken from the dataset (`split_rows`)."""
    path = shipped_or_local(cfg.dataset)
    records, lines = read_jsonl(path, "task.dataset")
    rows = _normalise(records, cfg, str(path), lines)
    if cfg.params.get("eval_dataset") is None:
        return split_rows(rows, cfg, str(path))
    held_path = Path(cfg.params["eval_dataset"])
    records, lines = read_jsonl(held_path, "task.params.eval_dataset")
    return _with_held_out(rows, _normalise(records, cfg, str(held_path), lines, uid_prefix="eval-"), cfg,
                          str(held_path))


HF_FILE_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def hf_records(name: str, key: str, params: dict[str, Any], split: str) -> tuple[list[dict], str]:
    """The records of one Hugging Face dataset source (`name`: a hub id, a save_to_disk directory or a data file)
    and the name errors give it. `params`: `subset` and `revision` for hub ids; `key` names the setting in errors."""
    import datasets

    from lmrl.models.loading import first_line, is_hub_id

    path = Path(name).expanduser()
    source = str(path)
    if not path.exists() and is_hub_id(name):
        source = f"{name} (split {split!r})"
        ds = _load_hub_dataset(name, params.get("subset"), split, params.get("revision"), key)
    elif not path.exists():
        raise TaskError(f"{key}: no dataset at {name}: no such file or directory (a save_to_disk directory, a data "
                        "file, or a hub id org/name)")
    elif path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise TaskError(f"{path}: no split {split!r}; it has: {', '.join(ds)}")
            ds, source = ds[split], f"{path} (split {split!r})"
    else:
        kind = HF_FILE_KINDS.get(path.suffix)
        if kind is None:
            raise TaskError(f"{key}: unsupported file type {path.suffix!r} ({', '.join(HF_FILE_KINDS)})")
        if split != "train":
            raise TaskError(f"{path}: a data file has one split, so there is no split {split!r}; give the held-out "
                            "rows their own file with task.params.eval_dataset")
        if path.stat().st_size == 0 or (kind != "parquet" and not sum(1 for _ in text_lines(path))):
            raise TaskError(f"{path}: the file is empty")
        try:
            ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        except Exception as err:  # noqa: BLE001 - whatever datasets says, with the file it could not read
            raise TaskError(f"{path}: datasets could not read it as {kind}: {first_line(err)}") from None
    return [dict(r) for r in ds], source


def _hf_rows(name: str, key: str, cfg: TaskConfig, split: str, uid_prefix: str = "") -> tuple[list[dict], str]:
    """The task rows of one Hugging Face dataset source and the name errors give it."""
    records, source = hf_records(name, key, cfg.params, split)
    return _normalise(records, cfg, source, uid_prefix=uid_prefix), source


@TASKS.register("hf_dataset", "a Hugging Face dataset: a hub id (org/name), a save_to_disk directory or a data file",
                splits_rows=True)
def hf_dataset_task(cfg: TaskConfig) -> TaskData:
    """`task.dataset` is a local path (save_to_disk directory, .json/.jsonl/.csv/.parquet file) or a hub id.

    `task.params`: `split` (default train), for hub ids `subset` (the dataset's config name, e.g. gsm8k's
    `main`) and `revision`; the held-out rows come from `eval_split` (a split of the same dataset, e.g.
    `test`) and/or `eval_dataset` (another source), else from the training split (`split_rows`).
    """
    split = cfg.params.get("split", "train")
    rows, source = _hf_rows(cfg.dataset, "task.dataset", cfg, split)
    eval_name, eval_split = cfg.params.get("eval_dataset"), cfg.params.get("eval_split")
    if eval_name is None and eval_split is None:
        return split_rows(rows, cfg, source)
    held, held_source = _hf_rows(eval_name or cfg.dataset, "task.params.eval_dataset" if eval_name else "task.dataset",
                                 cfg, eval_split or split, uid_prefix="eval-")
    return _with_held_out(rows, held, cfg, held_source)


def _load_hub_dataset(repo_id: str, subset: str | None, split: str, revision: str | None, key: str = "task.dataset"):
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
            raise TaskError(f"{key} {repo_id!r} (task.params subset={subset!r}, split={split!r}): "
                            f"{first_line(err)}") from None
        except Exception as err:  # noqa: BLE001 - not found, gated, offline: reported below with the caches
            errors.append(first_line(err))
            continue
        if ds is not None:
            return ds
    folder = hub_repo_folder(repo_id, "dataset")
    raise TaskError(
        f"{key} {repo_id!r} is not a local path and could not be loaded as a hub dataset: searched the hub "
        f"cache {folder} ({'exists' if folder.exists() else 'does not exist'}; HF_HUB_CACHE / HF_HOME) and the "
        f"datasets cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_CACHE). {offline_hint(repo_id, 'dataset')}."
        + (f" datasets said: {'; '.join(errors)}" if errors else "")
    )


def load_task(cfg: TaskConfig) -> TaskData:
    """The task's rows. A task that does not split fixed rows itself gets task.num_eval=100 when it is unset."""
    task = TASKS.get(cfg.name)
    if cfg.num_eval is None and not TASKS.spec(cfg.name).splits_rows:
        cfg = cfg.model_copy(update={"num_eval": DEFAULT_NUM_EVAL})
    return task(cfg)
