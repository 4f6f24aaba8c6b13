"""Which text of a reply is its final answer, and whether that answer is the gold.

The graders read what a reply commits to last: the text of its final 'Answer:' marker (bold,
full-width colon and `Final answer:` included) or \\boxed{}, provided every explicit answer agrees with
it and nothing after it retracts it; struck-out text (~~16~~) is not part of the reply. Without a
marker, `fallback="last_number"` reads the reply's final number when it is the final value. The rules
are listed in docs/rewards/builtin.md, "What counts as a final answer".
"""
from __future__ import annotations

import logging
import re

from lmrl.rewards.numbers import (HEDGE_WORDS, MAGNITUDE_WORDS, RETRACTION_WORDS, clean_marks, numbers_match,
                                  parse_number, read_literal, read_prediction, same_text, strip_latex, tidy,
                                  unwrap)

ANSWER_PATTERN = re.compile(r"answer\s*(?:is)?\s*[:=][\s*_`]*(.+)", re.IGNORECASE)
_EMPHASISED_MARKER = re.compile(r"[*_]{1,3}((?:final\s+)?answer)[*_]{1,3}(?=\s*(?:is)?\s*[:=])", re.IGNORECASE)
# A later line that takes the answer back: "Wait, that's wrong", "No, it is 17", "Actually …".
_RETRACTION = re.compile(
    r"\b(?:wait|wrong|incorrect|mistakes?|mistaken|oops|sorry|actually|correction|scratch that|retract\w*"
    r"|instead|nope|re-?check\w*|recalculat\w*|on second thought|not (?:correct|right)"
    r"|isn'?t (?:correct|right))\b|(?:^|[.!?]\s)\s*no(?:[,.!]|\s+(?:wait|it|that|this|the)\b)",
    re.IGNORECASE | re.MULTILINE)
NUMBER_TOKEN = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
LAST_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def clean_reply(text: str) -> str:
    """The reply as the graders read it: `clean_marks` (widths, dashes, struck-out text, HTML) and
    emphasis off an answer marker ("**Answer**:" → "Answer:")."""
    return _EMPHASISED_MARKER.sub(r"\1", clean_marks(text))


def _tidy_marker(answer: str) -> str | None:
    answer = answer.strip().splitlines()[0] if answer.strip() else ""
    answer = answer.strip(" *$`").rstrip(".").strip(" *$`")
    return answer or None


def extract_answer(text: str, pattern: str | None = None) -> str | None:
    """The text after the last 'Answer:' marker (or a custom regex's first group), tidied."""
    regex = re.compile(pattern, re.IGNORECASE) if pattern else ANSWER_PATTERN
    matches = regex.findall(clean_reply(text))
    if not matches:
        return None
    return _tidy_marker(matches[-1] if isinstance(matches[-1], str) else matches[-1][0])


def _explicit_answers(text: str, pattern: str | None) -> list[tuple[int, int, str]]:
    """(start, end, answer text) of every 'Answer:' marker (its end: the end of the answer's line; with a
    custom regex, of the match) and, with the default marker, every \\boxed{…} not on a marker's line (its
    end: the closing brace), in order; `text` is already cleaned."""
    regex = re.compile(pattern, re.IGNORECASE) if pattern else ANSWER_PATTERN
    found: list[tuple[int, int, str]] = []

    def line_end(pos: int) -> int:
        end = text.find("\n", pos)
        return len(text) if end < 0 else end

    for m in regex.finditer(text):
        tidy_text = _tidy_marker((m.group(1) or "") if regex.groups else m.group(0))
        if tidy_text is not None:
            found.append((m.start(), line_end(m.start(1)) if pattern is None else m.end(), tidy_text))
    if pattern is None:  # a \boxed{} on a marker's line is part of that answer, not another one
        lines = [(start, end) for start, end, _ in found]
        for m in re.finditer(r"\\boxed\s*{", text):
            inner = unwrap(text, m.end() - 1)
            on_marker_line = any(start < m.start() < end for start, end in lines)
            if inner is not None and inner[0].strip() and not on_marker_line:
                found.append((m.start(), inner[1], inner[0].strip()))
    return sorted(found, key=lambda x: x[0])


def answer_candidates(text: str, pattern: str | None = None) -> list[str]:
    """Every explicit final answer in the reply, in order: each 'Answer:' marker's text (or each match
    of a custom regex) and, with the default marker, each \\boxed{…}'s content."""
    return [answer for _, _, answer in _explicit_answers(clean_reply(text), pattern)]


def last_number(text: str) -> str | None:
    """The last number in the text (a lenient fallback when no 'Answer:' marker is present).

    Unchanged for the modules that use it (majority vote, MEDS, shaped rewards); the `answer` reward
    uses the stricter `fallback_number`."""
    found = LAST_NUMBER.findall(text)
    return found[-1].rstrip(",") if found else None


def hedges(text: str) -> bool:
    return any(w in HEDGE_WORDS for w in re.findall(r"[a-z]+", strip_latex(text).lower()))


def fallback_number(text: str, question: str | None = None) -> str | None:
    """The reply's final number when it has no answer marker, or None when that number is not a final value.

    The number must be the only distinct value in the reply's final statement (the text after the last
    '=' before it, or else its sentence), apart from numbers the question itself contains; it must not
    be an operand ("… 5 + 3" at a cut-off), nor be followed by a superscript, a letter or a word that
    changes or retracts it ("16²", "16 thousand", "16 is wrong"), and the statement up to it, or the two
    words after it, must not hedge ("3 or 4", "maybe 5", "5, or not").
    So "40 + 2 = 42." gives 42 and "The sum of 4 and 5 is 9." gives 9, but "3, 4, 5, 6" gives nothing.
    """
    text = clean_reply(text)
    tokens = list(NUMBER_TOKEN.finditer(text))
    if not tokens:
        return None
    last = tokens[-1]
    digits_start = last.start() + (1 if last.group(0)[0] in "+-−" else 0)
    before = text[:digits_start].rstrip().removesuffix("(").rstrip()
    if before and before[-1] in "+-−*/×÷^" and re.search(r"[\d)]\s*[+\-−*/×÷^]$", before):
        return None  # an operand, not a result
    following = text[last.end():]
    if following and (following[0].isalnum() or following[0] == "^"):  # "16²", "16½", "3x", "16^2"
        return None
    sentence_start = max((m.end() for m in re.finditer(r"[.!?;:](?=\s)|\n", text[: last.start()])), default=0)
    region_start = max(sentence_start, text.rfind("=", 0, last.start()) + 1)
    region = text[region_start:]
    after = re.findall(r"[^\W\d_]+", following)[:2]  # "42 or 43", "42, maybe", "42 thousand", "42 is wrong"
    if hedges(text[region_start: last.end()] + " " + " ".join(after)):
        return None
    if any(w.lower() in MAGNITUDE_WORDS | RETRACTION_WORDS for w in after):
        return None
    allowed = {parse_number(t) for t in NUMBER_TOKEN.findall(question or "")}
    value = read_literal(last.group(0), question)
    if value is None:  # e-notation where the question does not ask for it
        return None
    others = {parse_number(m.group(0)) for m in NUMBER_TOKEN.finditer(region)} - allowed - {value.value}
    return last.group(0) if not others else None


def _retracted(tail: str, final: str) -> bool:
    """Whether text after the final answer takes it back: a retraction ("wait", "wrong", "actually", a
    sentence opening with "No," or "No, it …") or a line holding only another number."""
    if _RETRACTION.search(tail):
        return True
    return any(read_literal(line) is not None and not _agree(line, final) for line in tail.splitlines())


def final_answer(text: str, pattern: str | None = None, fallback: str = "none",
                 question: str | None = None) -> str | None:
    """The answer a reply commits to, or None.

    The last explicit answer ('Answer:' marker, or \\boxed{}), provided every explicit answer in the
    reply agrees with it (several conflicting 'Answer:' lines are a hedge and give None, with no
    fallback) and nothing after its line retracts it. Without any marker, `fallback="last_number"`
    reads `fallback_number`.
    """
    if fallback not in ("none", "last_number"):
        raise ValueError(f"fallback must be 'none' or 'last_number', got {fallback!r}")
    cleaned = clean_reply(text)
    found = _explicit_answers(cleaned, pattern)
    if found:
        _, end, final = found[-1]
        if _retracted(cleaned[end:], final):
            return None
        return final if all(_agree(answer, final) for _, _, answer in found[:-1]) else None
    return fallback_number(cleaned, question) if fallback == "last_number" else None


def _agree(a: str, b: str) -> bool:
    """Two explicit answers agree: the same text, the same exact number, or (neither a number)
    `answers_match`."""
    if same_text(tidy(a), tidy(b)):
        return True
    x, y = read_literal(a, scientific=True), read_literal(b, scientific=True)
    if x is not None or y is not None:
        return x is not None and y is not None and x.value == y.value
    return answers_match(a, b)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", strip_latex(text).lower())


def restates_question(predicted: str, question: str | None, gold: str = "", window: int = 5) -> bool:
    """Whether a prediction copies the question: it shares a run of `window` characters (spaces
    ignored) with the question that is not also in the gold answer."""
    if not question:
        return False
    p, q, g = _squash(predicted), _squash(question), _squash(gold)
    return any(p[i: i + window] in q and p[i: i + window] not in g for i in range(len(p) - window + 1))


def answers_match(predicted: str, gold: str, question: str | None = None) -> bool:
    """Whether `predicted` is the gold answer.

    Numeric gold: the prediction must be a number literal in a form the question allows
    (`read_prediction`) of the gold's value (`numbers_match`: integers exactly, decimals at the gold's
    precision), never an expression that evaluates to it. Other gold: identical text, or math-verify's
    symbolic equivalence unless the prediction hedges ("x or y") or copies a run of the question
    (`restates_question`, when `question` is given), or case- and space-insensitive text equality.
    """
    if same_text(tidy(predicted), tidy(gold)):
        return True
    g = read_literal(gold, strict=True)
    if g is not None:
        p = read_prediction(predicted, gold, g, question)
        return p is not None and numbers_match(p, g)
    if hedges(predicted) and not hedges(gold):
        return False
    if restates_question(predicted, question, gold):
        return False
    return _math_verify(predicted, gold)


def _math_verify(predicted: str, gold: str) -> bool:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        gold_parsed = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=None)
        pred_parsed = parse(predicted if "$" in predicted else f"${predicted}$", parsing_timeout=None)
        return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))
    except Exception as err:  # math-verify raises on exotic input: "no symbolic match", said once per kind
        if type(err).__name__ not in _MATH_VERIFY_FAILURES:
            _MATH_VERIFY_FAILURES.add(type(err).__name__)
            logging.getLogger(__name__).warning(
                "answer: math-verify failed on %r vs gold %r (%s: %s); such replies are graded as not matching "
                "symbolically (shown once per kind of failure)", predicted[:80], gold[:80], type(err).__name__, err)
        return False


_MATH_VERIFY_FAILURES: set[str] = set()
