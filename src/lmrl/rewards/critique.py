"""STC critique consistency (stages §7.1): a reply that critiques each of its own steps is paid when its
critiques agree with whether its final answer is right. Confidence: low — reconstructed from the abstract.

The reply is `<step>…</step><critique>verdict: correct|incorrect; reason…</critique>` repeated, then the
final answer. z is the accuracy verdict of the run's answer grader (the component named by `accuracy`, which
must be listed before this one: one home for grading); c_k is step k's verdict (1 correct, 0 incorrect);
ĉ = Π_k c_k (`aggregate: product`, "no step flagged") or the last step's verdict (`aggregate: last`).
The component returns two named parts that the weighted sum adds to the answer reward:
- `critique_consistency/consistency` = λ·1[ĉ = z] (`signed`: λ·(+1 | −1)); 0 when any critique has no
  readable verdict;
- `critique_consistency/format` = −1 when the reply is not a well-formed step/critique sequence (a step
  without its critique, a critique without its step, nested, unclosed or stray tags, no step at all), where
  the consistency part is 0 as well; else 0.
So r = r_ans + λ·r_cons + r_fmt (docs/rewards/critique_consistency.md). `step_critique_f1` scores the parsed
verdicts against reference step labels ("incorrect" the positive class), an evaluation metric.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from lmrl.rewards.compute import accuracy_verdict
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

TAG = re.compile(r"</?(step|critique)\s*>", re.IGNORECASE)
# the critique opens with its verdict; "verdict:" must occur exactly once in it (a second one is ambiguous)
VERDICT = re.compile(r"^\s*verdict\s*:\s*(correct|incorrect)\b", re.IGNORECASE)
VERDICT_WORD = re.compile(r"verdict\s*:", re.IGNORECASE)
EXPECTED = ("<step>", "</step>", "<critique>", "</critique>")


@dataclass
class CritiquedReply:
    """A parsed reply: `well_formed` (steps and critiques alternate, each closed), each step's verdict
    (1 correct, 0 incorrect, None unreadable) and the text after the last critique (the final answer)."""

    well_formed: bool
    verdicts: list[int | None]
    tail: str


def parse_critiqued_steps(text: str) -> CritiquedReply:
    """Read the step/critique sequence of `text` in one pass over its tags (linear in the reply's length).

    Only whitespace may separate a step from its critique; text before the first step is allowed; the tags
    must come in the order step, /step, critique, /critique, repeated at least once."""
    verdicts: list[int | None] = []
    position, opened_at, last_end = 0, 0, 0
    for match in TAG.finditer(text):
        tag = "<" + ("/" if match.group(0)[1] == "/" else "") + match.group(1).lower() + ">"
        if tag != EXPECTED[position % 4]:
            return CritiquedReply(False, verdicts, "")
        if tag == "<critique>" and text[last_end:match.start()].strip():
            return CritiquedReply(False, verdicts, "")  # text between a step and its critique
        if tag == "</critique>":
            body = text[opened_at:match.start()]
            verdict = VERDICT.match(body)
            readable = verdict is not None and len(VERDICT_WORD.findall(body)) == 1
            verdicts.append(None if not readable else int(verdict.group(1).lower() == "correct"))
        opened_at = last_end = match.end()
        position += 1
    if position == 0 or position % 4:
        return CritiquedReply(False, verdicts, "")
    return CritiquedReply(True, verdicts, text[last_end:])


def predicted_correct(verdicts: list[int], aggregate: str = "product") -> int:
    """ĉ: 1 when no step is flagged (`product`), or the last step's verdict (`last`)."""
    if aggregate == "last":
        return verdicts[-1]
    return int(all(verdicts))


def consistency_parts(reply: CritiquedReply, correct: bool, lam: float = 0.5, aggregate: str = "product",
                      signed: bool = False) -> dict[str, float]:
    """The two named parts of a parsed reply whose final answer is `correct` (z)."""
    if not reply.well_formed:
        return {"consistency": 0.0, "format": -1.0}
    if any(v is None for v in reply.verdicts):
        return {"consistency": 0.0, "format": 0.0}
    agree = predicted_correct(reply.verdicts, aggregate) == int(correct)
    return {"consistency": lam * (1.0 if agree else (-1.0 if signed else 0.0)), "format": 0.0}


@REWARD_FNS.register("critique_consistency", "STC: lambda x (the critiques agree with whether the answer is right), "
                     "for replies that critique each step; parts consistency, format (-1: a step lacks its critique)")
def critique_consistency(sample: Sample, lam: float = 0.5, aggregate: str = "product", signed: bool = False,
                         accuracy: str = "answer") -> dict[str, float]:
    """STC reward parts; z is `sample.rewards[accuracy]` >= 1 (list this component after the grader).
    Confidence: low — reconstructed from the abstract."""
    if aggregate not in ("product", "last"):
        raise ValueError(f"critique_consistency: aggregate must be product or last (got {aggregate!r})")
    correct = accuracy_verdict(sample, accuracy)
    if correct is None:
        raise ValueError(f"critique_consistency reads the verdict of the reward component {accuracy!r}, which gave "
                         f"none on this sample: list {accuracy!r} before critique_consistency in reward.components "
                         "(or set its `accuracy` param to the grader's name); if it is listed first, it failed here")
    return consistency_parts(parse_critiqued_steps(sample.text), correct, lam, aggregate, signed)


def step_critique_f1(predicted: list[list[int | None]], reference: list[list[bool]]) -> float:
    """F1 of the "incorrect" verdicts over all steps of all replies, against reference step labels (True: the
    step is correct). A reply's steps are paired in order; a missing or unreadable verdict counts as "correct"
    (not flagged), and steps beyond the reference are ignored. 1.0 when neither side flags any step."""
    true_pos = false_pos = false_neg = 0
    for verdicts, labels in zip(predicted, reference):
        padded = list(verdicts[:len(labels)]) + [None] * max(0, len(labels) - len(verdicts))
        for verdict, label in zip(padded, labels):
            flagged, wrong = verdict == 0, not label
            true_pos += flagged and wrong
            false_pos += flagged and not wrong
            false_neg += wrong and not flagged
    if true_pos + false_pos + false_neg == 0:
        return 1.0
    return 2 * true_pos / (2 * true_pos + false_pos + false_neg)


def critique_f1_of_samples(samples: list[Sample], label_field: str = "step_labels") -> float | None:
    """`step_critique_f1` over the samples whose task row has reference step labels; None when none has."""
    labelled = [s for s in samples if isinstance(s.row.get(label_field), list)]
    if not labelled:
        return None
    return step_critique_f1([parse_critiqued_steps(s.text).verdicts for s in labelled],
                            [[bool(x) for x in s.row[label_field]] for s in labelled])
