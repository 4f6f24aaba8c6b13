"""`closed_book`: question-answer facts for closed-book recall (docs/rewards/recall.md), held out with fact-level
deduplication: a held-out fact whose (subject, relation) pair, or whose subject together with its answer entity,
occurs in a training fact is removed (`lmrl.rewards.recall.overlapping_facts`), so a paraphrase or the reverse
question of a trained fact never measures recall. The run's first line states the sizes before and after.
"""
from __future__ import annotations

from lmrl.config import TaskConfig
from lmrl.envs.tasks import TASKS, TaskData, TaskError, read_jsonl, split_rows
from lmrl.recipe_files import shipped_or_local
from lmrl.rewards.recall import overlapping_facts

FIELDS = ("question", "answer", "subject", "relation")


@TASKS.register("closed_book", "closed-book QA facts (question, answer, aliases, subject, relation) from a JSON-lines "
                "file; held-out facts that a training fact shares (subject, relation) or (subject, answer) with removed",
                splits_rows=True)
def closed_book_task(cfg: TaskConfig) -> TaskData:
    """`task.dataset` is the file (shipped: `recall_facts.jsonl`); `task.num_eval` facts of a seeded shuffle are
    drawn for evaluation, then the ones a training fact overlaps are dropped from them."""
    path = shipped_or_local(cfg.dataset)
    records, lines = read_jsonl(path, "task.dataset")
    rows = []
    for n, rec in zip(lines, records):
        missing = [f for f in FIELDS if not isinstance(rec, dict) or not str(rec.get(f, "")).strip()]
        if missing:
            raise TaskError(f"{path}:{n}: a fact needs non-empty {', '.join(missing)}")
        aliases = rec.get("aliases") or []
        rows.append({**rec, "uid": str(rec.get("id", f"fact-{n}")), "answer": str(rec["answer"]),
                     "aliases": [aliases] if isinstance(aliases, str) else list(aliases)})
    drawn = split_rows(rows, cfg, str(path))
    kept, removed = overlapping_facts(drawn.train, drawn.eval)
    return TaskData(drawn.train, kept, f"{drawn.held_out_from}; fact-level deduplication removed {len(removed)} of "
                                       f"the {len(drawn.eval)} drawn, a training fact sharing their (subject, relation) "
                                       "or (subject, answer)")
