"""CLARity (stages §7.3): rewards for consistent reasoning on multiple-choice questions, in two stages.
Confidence: high — the spec read the authors' reward code (Blood-Soul/CLARity @ 5991f897).

A reply is `<think>…</think>…<answer>{LETTERS}</answer>`; its answer is the letter set of its last `{…}`.
- `clarity_structure` (stage 1, "refine"): parts `format` = 1 when the reply has that shape, else 0, and
  `structure` = 1 when the think block holds `num_choices` consecutive non-empty lines, line k labelled with
  option letter chr('A'+k) (an option-by-option walk-through), else 0.
- `clarity_monitor` (stage 2, "monitor"): parts `format` = `format_weight`·(0 | −1), `accuracy` =
  1[answer set = gold set] (no braces: 1 only when the gold is empty) and `faithfulness` = 0 when a judge,
  shown the question and the think block without its last paragraph, infers the reply's own answer set, −1
  when it infers another, when no attempt of the judge can be read, or when the reply has no think block or
  no answer. A judge request that fails for good raises (the scorer retries, then excludes and counts it).
Deviations and the judge's retry rule: docs/rewards/clarity.md.
"""
from __future__ import annotations

import re
from typing import Any

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judges import make_judge, prompt_text
from lmrl.types import Sample

FORMAT = re.compile(r"\s*<think>.*?</think>.*?<answer>\s*\{[A-Za-z,\s]*\}\s*</answer>", re.DOTALL)
LAST_BRACES = re.compile(r"\{[A-Za-z,\s]*\}[^{]*$")
THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)

FAITHFULNESS_PROMPT = (
    "You are given a multiple-choice question and a student's reasoning. Say which option(s) the reasoning "
    "supports as the answer, whatever the correct answer is. Write the letters in curly braces at the end, like "
    "{{B}} or {{AC}}, or {{}} when it supports none.\n\nQuestion:\n{question}\n\nReasoning:\n{reasoning}\n\n"
    "The answer the reasoning supports is:")


def answer_letters(text: str) -> set[str] | None:
    """The uppercase letters of the last `{…}` group of `text` (nothing but non-braces after it), or None."""
    match = LAST_BRACES.search(text.strip())
    return None if match is None else set(re.findall(r"[A-Z]", match.group()))


def gold_letters(gold: Any) -> set[str]:
    """The gold option set from a row's answer: a list of letters, or a string such as "C", "A,C" or "AC"."""
    if isinstance(gold, (list, tuple)):
        return {str(g).strip() for g in gold if str(g).strip()}
    return set(re.findall(r"[A-Z]", str(gold)))


def walks_through_options(text: str, num_choices: int = 5) -> bool:
    """Whether the think block has `num_choices` consecutive non-empty lines, line k labelled with option
    chr('A'+k): the label opens the line (`A:`, `A.`, `(A)`, `**A**`, `Option A`)."""
    think = THINK.search(text)
    if think is None:
        return False
    lines = [line.strip() for line in think.group(1).split("\n") if line.strip()]
    labelled = [[re.match(rf"^[\W_]*(?:option\s+)?{chr(ord('A') + k)}\b", line, re.IGNORECASE) is not None
                 for k in range(num_choices)] for line in lines]
    return any(all(labelled[i + k][k] for k in range(num_choices)) for i in range(len(lines) - num_choices + 1))


def reasoning_without_conclusion(text: str) -> str | None:
    """The think block without its last paragraph (paragraphs split on blank lines), None without a think block
    or with an empty one."""
    think = THINK.search(text)
    if think is None or not think.group(1).strip():
        return None
    return "\n\n".join(think.group(1).strip().split("\n\n")[:-1])


@REWARD_FNS.register("clarity_structure", "CLARity stage 1: format (think + braced answer) + an option-by-option "
                     "walk-through of num_choices options (parts format, structure)")
def clarity_structure(sample: Sample, num_choices: int = 5) -> dict[str, float]:
    if not 1 <= num_choices <= 26:
        raise ValueError(f"clarity_structure: num_choices must be 1..26 (got {num_choices})")
    return {"format": float(FORMAT.match(sample.text) is not None),
            "structure": float(walks_through_options(sample.text, num_choices))}


@REWARD_FNS.register("clarity_monitor", "CLARity stage 2: 0.1 x format (0|-1) + accuracy + judge faithfulness (0 when "
                     "the judge infers the reply's answer from its reasoning, else -1)")
class ClarityMonitorReward:
    """Stage-2 parts; the judge (`judge`: client options or a client) is asked up to `attempts` times until one
    reply holds a braced letter set (`keep_last: true` asks all `attempts` times and keeps the last readable
    reply, as the authors' code does). Confidence: high."""

    def __init__(self, judge: Any = None, format_weight: float = 0.1, attempts: int = 3, keep_last: bool = False,
                 answer_field: str = "answer", prompt_field: str = "question", template: str | None = None):
        if attempts < 1:
            raise ValueError(f"clarity_monitor: attempts must be >= 1 (got {attempts})")
        self.client = make_judge(judge)
        self.format_weight, self.attempts, self.keep_last = format_weight, attempts, keep_last
        self.answer_field, self.prompt_field = answer_field, prompt_field
        self.template = template or FAITHFULNESS_PROMPT

    def judged_letters(self, question: str, reasoning: str) -> set[str] | None:
        """The letter set the judge reads from `reasoning`, None when no attempt gave one."""
        found = None
        for attempt in range(self.attempts):
            reply = self.client.chat([{"role": "user", "content": self.template.format(
                question=question, reasoning=reasoning)}], **({"seed": attempt} if attempt else {}))
            letters = answer_letters(reply)
            if letters is not None:
                found = letters
                if not self.keep_last:
                    break
        return found

    def faithfulness(self, sample: Sample, answer: set[str] | None) -> float:
        reasoning = reasoning_without_conclusion(sample.text)
        if reasoning is None or answer is None:
            return -1.0
        judged = self.judged_letters(prompt_text(sample, self.prompt_field), reasoning)
        return 0.0 if judged == answer else -1.0

    def __call__(self, sample: Sample) -> dict[str, float]:
        if self.answer_field not in sample.row:
            raise ValueError(f"clarity_monitor: the task row has no {self.answer_field!r} field with the gold "
                             "letters (e.g. \"C\" or [\"A\", \"C\"]); set answer_field")
        answer = answer_letters(sample.text)
        gold = gold_letters(sample.row[self.answer_field])
        accuracy = float(not gold) if answer is None else float(answer == gold)
        well_formed = FORMAT.match(sample.text) is not None
        return {"format": self.format_weight * (0.0 if well_formed else -1.0), "accuracy": accuracy,
                "faithfulness": self.faithfulness(sample, answer)}
