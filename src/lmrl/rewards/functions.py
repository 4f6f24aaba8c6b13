"""Per-sample reward functions: `(sample, **params) -> float | dict[str, float] | None`.

A function reads the completion text and the task row from `sample.text` and `sample.row`.
None means "no verdict" and excludes the sample from the update (counted in the metrics).
Which text is a reply's answer and how it is compared with the gold: `answers.py` and `numbers.py`.
"""
from __future__ import annotations

import json
import re

from lmrl.registry import Registry
# answer_candidates, extract_answer, last_number, parse_number and NUMBER_TOKEN are imported from here
# by the environments and rewards that grade answers the same way.
from lmrl.rewards.answers import (NUMBER_TOKEN, answer_candidates, answers_match, extract_answer,  # noqa: F401
                                  final_answer, last_number)
from lmrl.rewards.numbers import canonical, parse_number, read_literal, read_prediction  # noqa: F401
from lmrl.types import Sample

REWARD_FNS: Registry = Registry("reward function")


@REWARD_FNS.register("answer", "1 if the reply's final answer matches the gold (number literal, math-verify, text)")
def answer_reward(sample: Sample, pattern: str | None = None, fallback: str = "none") -> float:
    """`fallback="last_number"` grades the final number of a reply that has no 'Answer:' marker.

    What counts as a final answer: docs/rewards/builtin.md."""
    row = sample.row
    question = row.get("question")
    predicted = final_answer(sample.text, pattern, fallback, question)
    return float(predicted is not None and answers_match(predicted, str(row["answer"]), question))


@REWARD_FNS.register("format", "1 if the completion ends with an 'Answer: ...' line")
def format_reward(sample: Sample, pattern: str = r"answer\s*:\s*\S+[^\n]*\s*$") -> float:
    return float(re.search(pattern, sample.text.strip(), re.IGNORECASE) is not None)


@REWARD_FNS.register("length", "-(generated tokens / target), a pressure toward short completions")
def length_reward(sample: Sample, target: int = 256) -> float:
    return -sample.num_generated / max(target, 1)


@REWARD_FNS.register("truncated", "-1 if the completion hit the token limit without stopping")
def truncation_reward(sample: Sample) -> float:
    return -1.0 if sample.finish_reason == "length" else 0.0


@REWARD_FNS.register("reasoning_gym", "the reasoning-gym generator's own scorer on the reply's final answer")
def reasoning_gym_reward(sample: Sample, pattern: str | None = None, fallback: str = "none",
                         partial_credit: bool = False) -> float:
    """The dataset's scorer on `final_answer` (same extraction as the `answer` reward).

    Where the dataset's answer is a number, the final answer must be a number literal in a form the
    question allows (`read_prediction`: "0.75" is no answer to "Simplify 6/8"; e-notation where the
    question asks for it); the scorer sees its value in the gold's form: p/q for a fraction gold
    (fraction_simplification's scorer reads only fractions), else digits ("3.0", "$3$", "1,234",
    "1.5e+3" → "3", "3", "1234", "1500"), and its verdict is all-or-nothing: the scorers' substring
    partial credit would pay any reply containing the gold digits ("0123456789" earns 0.1 for every
    one-digit answer, "33" 0.5 for gold 3, "3 + 0" 0.2). `partial_credit: true` keeps the scorer's
    fractional values for number literals. Other answers (words, lists, boards) go to the scorer as
    extracted, partial credit included.
    """
    import reasoning_gym

    row = sample.row
    entry = row.get("entry")
    if entry is None:
        raise ValueError("reasoning_gym reward needs rows from the reasoning_gym task")
    question = row.get("question", entry.get("question"))
    predicted = final_answer(sample.text, pattern, fallback, question)
    if predicted is None:
        return 0.0
    scorer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    gold_text = str(entry["answer"])
    gold = read_literal(gold_text, strict=True)
    if gold is None:
        return float(scorer(predicted, entry))
    value = read_prediction(predicted, gold_text, gold, question)
    if value is None:
        return 0.0
    score = float(scorer(canonical(value.value, as_fraction=gold.form == "fraction"), entry))
    return score if partial_credit else float(score >= 1.0)


def row_list(value: object, reward: str, field: str, example: str) -> list:
    """A row field that holds a non-empty list, or its JSON text (datasets store nested fields as text); anything
    else raises naming the reward, the field and an `example` of the expected shape."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{reward}: the row's `{field}` is text but not JSON ({err.msg})") from None
    if not isinstance(value, list) or not value:
        raise ValueError(f"{reward}: the row's `{field}` must be a non-empty list like {example}")
    return value
