"""HindSearch's teacher context: a frozen judge's short critique of each failed trajectory.

It calls a judge over HTTP (or an in-process chat model), so it lives with the judges; it registers
into `TEACHER_CONTEXTS` (lmrl.algos.teacher), which the distill term's `context` setting names (docs/methods/hindsearch.md).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmrl.algos.teacher import TEACHER_CONTEXTS, trajectory_text
from lmrl.rewards.judge_client import JudgeError, strip_reasoning
from lmrl.rewards.judges import make_judge
from lmrl.types import Sample

CRITIQUE = ("A model tried to solve the task below and got it wrong.\n\nTask:\n{question}\n\nIts attempt:\n"
            "{trajectory}\n\nCorrect answer: {answer}\n\nIn two or three sentences, say what went wrong and what it "
            "should have done instead (which step, search or tool call would have helped).")


@TEACHER_CONTEXTS.register("hindsight_critique", "HindSearch: a frozen judge's short critique of each failed "
                                                 "trajectory, written with the gold answer in view")
class HindsightCritique:
    """Per failed sample, one judge call (question, trajectory, gold answer) → "Hindsight: <critique>".

    `judge`: a `JudgeClient` mapping or an object with `chat(messages)` (`make_judge`); `template` uses
    {question}, {trajectory}, {answer}; the critique is cut to `max_chars`. A call that fails for good
    (`JudgeError`) or an empty critique leaves its sample without a teacher.
    """

    def __init__(self, judge: Any = None, template: str | None = None, max_chars: int = 1000, concurrency: int = 4):
        self.client = make_judge(judge)
        self.template, self.max_chars, self.concurrency = template or CRITIQUE, max_chars, max(1, concurrency)

    def critique(self, sample: Sample, row: dict[str, Any]) -> str | None:
        prompt = self.template.format(question=row["question"], trajectory=trajectory_text(sample),
                                      answer=row["answer"])
        try:
            reply = strip_reasoning(self.client.chat([{"role": "user", "content": prompt}]))
        except JudgeError:
            return None
        return f"Hindsight: {reply[: self.max_chars]}" if reply else None

    def __call__(self, samples: list[Sample], rows: list[dict], correct: list[bool]) -> list[str | None]:
        failed = [i for i, ok in enumerate(correct) if not ok]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            critiques = list(pool.map(lambda i: self.critique(samples[i], rows[i]), failed))
        out: list[str | None] = [None] * len(samples)
        for i, text in zip(failed, critiques):
            out[i] = text
        return out

