"""SEIF: self-evolving instructor and follower rewards over programmatic constraints (docs/methods/seif.md).

A constraint is a mapping {"type": ..., ...} that a checker in `CHECKERS` decides on a text.
- `seif_follower` (per sample): the reply must be `<think>…</think><answer>…</answer>` (else 0); the
  reward is the fraction of the row's constraints (`constraints` field) its answer satisfies.
- `seif_instructor` (per sample, a class holding the evaluator client): the completion holds a JSON
  object {"instruction": str, "constraints": [...]}; the evaluator (the previous follower, behind an
  OpenAI-compatible endpoint) answers the instruction, and the reward is 1 − the fraction it
  satisfies: 0 when the constraints are unparsable or conflict, or the evaluator's answer is empty.
- `seif_instructor_played` (per sample): the same reward when the instructor is a role of the run and the
  follower the policy (`envs.seif`): the follower's answers to the instruction are in the sample's row
  (`answers`), and the reward is their mean instructor reward.
Why: the instructor is paid for instructions the current follower fails, the follower for meeting them.

`python -m lmrl.rewards.seif ROLLOUTS OUT` turns an instructor run's recorded rollouts into follower task
rows (the round's data q_T): the parsable, conflict-free instructions that scored above 0.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.judge_client import json_in, strip_reasoning
from lmrl.rewards.judges import make_judge
from lmrl.types import Sample

FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)


def _words(text: str) -> list[str]:
    return re.findall(r"\b\w+\b", text)


def _has(text: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word.lower())}\b", text.lower()) is not None


CHECKERS: dict[str, Callable[[str, dict], bool]] = {
    "min_words": lambda t, c: len(_words(t)) >= int(c["value"]),
    "max_words": lambda t, c: len(_words(t)) <= int(c["value"]),
    "include_keywords": lambda t, c: all(_has(t, k) for k in c["keywords"]),
    "exclude_keywords": lambda t, c: not any(_has(t, k) for k in c["keywords"]),
    "starts_with": lambda t, c: t.strip().lower().startswith(str(c["value"]).lower()),
    "ends_with": lambda t, c: t.strip().lower().endswith(str(c["value"]).lower()),
    "lowercase": lambda t, c: t == t.lower(),
    "uppercase": lambda t, c: t == t.upper(),
    "no_commas": lambda t, c: "," not in t,
    "paragraphs": lambda t, c: len([p for p in re.split(r"\n\s*\n", t.strip()) if p.strip()]) == int(c["value"]),
}


def parse_constraints(value: Any) -> list[dict]:
    """A list of constraint mappings (or its JSON text); ValueError names what is wrong."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list) or not value:
        raise ValueError("constraints must be a non-empty list of {'type': ...} objects")
    for c in value:
        if not isinstance(c, dict) or c.get("type") not in CHECKERS:
            raise ValueError(f"constraint {c!r}: type must be one of {sorted(CHECKERS)}")
    return value


def conflicts(constraints: list[dict]) -> bool:
    """The filter: constraints no text can satisfy together (word bounds crossed, a keyword both required
    and forbidden, lowercase and uppercase, two paragraph counts)."""
    by_type: dict[str, list[dict]] = {}
    for c in constraints:
        by_type.setdefault(c["type"], []).append(c)
    lows = [int(c["value"]) for c in by_type.get("min_words", [])]
    highs = [int(c["value"]) for c in by_type.get("max_words", [])]
    if lows and highs and max(lows) > min(highs):
        return True
    need = {k.lower() for c in by_type.get("include_keywords", []) for k in c["keywords"]}
    banned = {k.lower() for c in by_type.get("exclude_keywords", []) for k in c["keywords"]}
    counts = {int(c["value"]) for c in by_type.get("paragraphs", [])}
    return bool(need & banned) or ("lowercase" in by_type and "uppercase" in by_type) or len(counts) > 1


def satisfied(text: str, constraints: list[dict]) -> float:
    """Fraction of `constraints` that `text` meets."""
    return sum(CHECKERS[c["type"]](text, c) for c in constraints) / len(constraints)


def formatted_answer(text: str) -> str | None:
    """The `<answer>` part of a `<think>…</think><answer>…</answer>` reply, or None."""
    m = FORMAT.match(text)
    return m.group(1).strip() if m else None


@REWARD_FNS.register("seif_follower", "SEIF follower: fraction of the row's constraints the <answer> meets; "
                     "0 without the <think>/<answer> format")
def seif_follower(sample: Sample, field: str = "constraints", require_format: bool = True, **_) -> float:
    return follower_reward(sample.text, parse_constraints(sample.row[field]), require_format)


def follower_reward(reply: str, constraints: list[dict], require_format: bool = True) -> float:
    """The fraction of `constraints` the reply's answer meets; 0 without the `<think>/<answer>` format when
    `require_format` (else the reply with its reasoning stripped is graded), and 0 for an empty answer (which
    would meet lowercase, no_commas or max_words for nothing)."""
    answer = formatted_answer(reply) if require_format else strip_reasoning(reply)
    return satisfied(answer, constraints) if answer else 0.0


def parse_instruction(text: str) -> tuple[str, list[dict]] | None:
    """(instruction, constraints) from an instructor's reply, or None when unparsable or conflicting."""
    found = json_in(strip_reasoning(text))
    if not isinstance(found, dict) or not isinstance(found.get("instruction"), str) or not found["instruction"].strip():
        return None
    try:
        constraints = parse_constraints(found.get("constraints"))
    except (ValueError, TypeError, KeyError):
        return None
    return (found["instruction"].strip(), constraints) if not conflicts(constraints) else None


@REWARD_FNS.register("seif_instructor", "SEIF instructor: 1 - fraction of its constraints the evaluator's answer "
                     "meets; 0 when unparsable, conflicting or unanswered")
class SeifInstructor:
    """Holds the evaluator client (`evaluator`: JudgeClient knobs, or any object with `chat(messages)`)."""

    def __init__(self, evaluator: Any = None, require_format: bool = False):
        self.evaluator, self.require_format = make_judge(evaluator), require_format

    def __call__(self, sample: Sample) -> float:
        parsed = parse_instruction(sample.text)
        if parsed is None:
            sample.info["seif"] = {"valid": False}
            return 0.0
        instruction, constraints = parsed
        reply = self.evaluator.chat([{"role": "user", "content": instruction}])
        answer = evaluator_answer(reply, self.require_format)
        sample.info["seif"] = {"valid": True, "evaluator_answer": answer}
        return instructor_reward(constraints, answer)


def evaluator_answer(reply: str, require_format: bool) -> str | None:
    """What the instructor's constraints are checked on: the `<answer>` part (None without the format) when
    `require_format`, else the reply with its reasoning stripped."""
    return formatted_answer(reply) if require_format else strip_reasoning(reply)


def instructor_reward(constraints: list[dict], answer: str | None) -> float:
    """1 − the fraction of `constraints` the answer meets; 0 for an empty or missing answer."""
    return 1.0 - satisfied(answer, constraints) if answer else 0.0


@REWARD_FNS.register("seif_instructor_played", "SEIF instructor in one run: mean over the follower's answers in its "
                     "row of 1 - fraction of its constraints met; 0 when unparsable, conflicting or unanswered")
def seif_instructor_played(sample: Sample, require_format: bool = True, **_) -> float | None:
    """The instructor's reward when the follower (the policy) answered its instruction in the same step: the
    answers are its row's (`answers`, the follower's replies, filled in as the episodes end). The constraints are
    parsed from the instructor's own reply, never from the row. None (excluded) when no answer came back."""
    parsed = parse_instruction(sample.text)
    if parsed is None:
        return 0.0
    replies = sample.row.get("answers") or []
    if not replies:
        return None
    return sum(instructor_reward(parsed[1], evaluator_answer(r, require_format)) for r in replies) / len(replies)


def follower_rows(records: list[dict], min_reward: float = 0.0) -> list[dict]:
    """Follower task rows from recorded instructor rollouts (`rollouts.jsonl` lines): every parsable,
    conflict-free instruction whose instructor reward exceeded `min_reward`, each once."""
    rows, seen = [], set()
    for record in records:
        for r in record["rollouts"]:
            parsed = parse_instruction(r["text"]) if r["reward"] > min_reward else None
            if parsed is not None and parsed[0] not in seen:
                seen.add(parsed[0])
                rows.append({"question": parsed[0], "answer": "", "constraints": parsed[1]})
    return rows


def main(argv: list[str]) -> None:
    """Write follower task rows from an instructor run's recorded rollouts."""
    parser = argparse.ArgumentParser(prog="python -m lmrl.rewards.seif", description=main.__doc__)
    parser.add_argument("rollouts", help="the instructor run's RUN/rollouts.jsonl")
    parser.add_argument("out", help="the follower task file to write (JSON lines)")
    args = parser.parse_args(argv)
    records = [json.loads(ln) for ln in Path(args.rollouts).read_text().splitlines() if ln.strip()]
    rows = follower_rows(records)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} follower rows from {len(records)} instructor groups -> {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
