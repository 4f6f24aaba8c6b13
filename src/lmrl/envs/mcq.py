"""The shipped multiple-choice task `mcq_arithmetic`: 30 arithmetic questions, each with options A–E and one
gold letter (`src/lmrl/recipes/data/mcq_arithmetic.jsonl`), small enough for a CPU run of the CLARity recipe.
Rows are `{question, answer}` as the `jsonl` task gives them; a tenth is held out."""
from __future__ import annotations

from pathlib import Path

from lmrl.config import TaskConfig
from lmrl.envs.tasks import TASKS, TaskData, _normalise, read_jsonl, split_rows

MCQ_FILE = Path(__file__).resolve().parent.parent / "recipes" / "data" / "mcq_arithmetic.jsonl"


@TASKS.register("mcq_arithmetic", "30 shipped arithmetic multiple-choice questions, options A-E, one gold letter",
                splits_rows=True)
def mcq_arithmetic_task(cfg: TaskConfig) -> TaskData:
    records, lines = read_jsonl(MCQ_FILE, "mcq_arithmetic")
    return split_rows(_normalise(records, cfg, str(MCQ_FILE), lines), cfg, str(MCQ_FILE))
