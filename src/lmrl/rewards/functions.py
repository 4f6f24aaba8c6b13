"""Per-sample reward functions: `(sample, **params) -> float | dict[str, float] | None`.

A function reads the completion text and the task row from `sample.info` ("text", "row").
None means "no verdict" and excludes the sample from the update (counted in the metrics).
"""
from __future__ import annotations

import logging
import re

from lmrl.registry import Registry
from lmrl.types import Sample

REWARD_FNS: Registry = Registry("reward function")

ANSWER_PATTERN = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
NUMBER = re.compile(r"^[-+]?\d[\d,]*(?:\.\d+)?$|^[-+]?\.\d+$")


def extract_answer(text: str, pattern: str | None = None) -> str | None:
    """The text after the last 'Answer:' marker (or a custom regex's first group), tidied."""
    regex = re.compile(pattern, re.IGNORECASE) if pattern else ANSWER_PATTERN
    matches = regex.findall(text)
    if not matches:
        return None
    answer = matches[-1] if isinstance(matches[-1], str) else matches[-1][0]
    answer = answer.strip().splitlines()[0] if answer.strip() else ""
    answer = answer.strip(" *$`").rstrip(".").strip(" *$`")
    return answer or None


LAST_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in the text (a lenient fallback when no 'Answer:' marker is present)."""
    found = LAST_NUMBER.findall(text)
    return found[-1].rstrip(",") if found else None


def _as_number(text: str) -> float | None:
    t = text.replace(" ", "")
    return float(t.replace(",", "")) if NUMBER.match(t) else None


def answers_match(predicted: str, gold: str) -> bool:
    """Numbers compare numerically; otherwise math-verify (symbolic); then normalised strings."""
    p, g = _as_number(predicted), _as_number(gold)
    if p is not None and g is not None:
        return abs(p - g) <= 1e-6 * max(1.0, abs(g))
    if _math_verify(predicted, gold):
        return True
    return " ".join(predicted.lower().split()) == " ".join(gold.lower().split())


def _math_verify(predicted: str, gold: str) -> bool:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        gold_parsed = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None)
        pred_parsed = parse(predicted if "$" in predicted else f"${predicted}$", parsing_timeout=None)
        return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception:  # math-verify raises on exotic input; treat as "no symbolic match"
        return False


@REWARD_FNS.register("answer", "1 if the extracted answer matches the gold answer (numeric, math-verify, text)")
def answer_reward(sample: Sample, pattern: str | None = None, fallback: str = "none", **_) -> float:
    """`fallback="last_number"` grades the last number of a reply that has no 'Answer:' marker."""
    predicted = extract_answer(sample.info["text"], pattern)
    if predicted is None and fallback == "last_number":
        predicted = last_number(sample.info["text"])
    return float(predicted is not None and answers_match(predicted, str(sample.info["row"]["answer"])))


@REWARD_FNS.register("format", "1 if the completion ends with an 'Answer: ...' line")
def format_reward(sample: Sample, pattern: str = r"answer\s*:\s*\S+[^\n]*\s*$", **_) -> float:
    return float(re.search(pattern, sample.info["text"].strip(), re.IGNORECASE) is not None)


@REWARD_FNS.register("length", "-(generated tokens / target), a pressure toward short completions")
def length_reward(sample: Sample, target: int = 256, **_) -> float:
    return -sample.num_generated / max(target, 1)


@REWARD_FNS.register("truncated", "-1 if the completion hit the token limit without stopping")
def truncation_reward(sample: Sample, **_) -> float:
    return -1.0 if sample.finish_reason == "length" else 0.0


@REWARD_FNS.register("reasoning_gym", "the reasoning-gym generator's own scorer on the extracted answer")
def reasoning_gym_reward(sample: Sample, pattern: str | None = None, **_) -> float:
    import reasoning_gym

    row = sample.info["row"]
    entry = row.get("entry")
    if entry is None:
        raise ValueError("reasoning_gym reward needs rows from the reasoning_gym task")
    predicted = extract_answer(sample.info["text"], pattern)
    scorer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    return float(scorer(predicted, entry)) if predicted is not None else 0.0
