"""Per-sample reward functions: `(sample, **params) -> float | dict[str, float] | None`.

A function reads the completion text and the task row from `sample.info` ("text", "row").
None means "no verdict" and excludes the sample from the update (counted in the metrics).
"""
from __future__ import annotations

import logging
import math
import re
from decimal import Decimal
from fractions import Fraction

from lmrl.registry import Registry
from lmrl.types import Sample

REWARD_FNS: Registry = Registry("reward function")

ANSWER_PATTERN = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
NUMBER = re.compile(r"^[-+]?\d[\d,]*(?:\.\d+)?$|^[-+]?\.\d+$")  # kept for importers; see parse_number

# What counts as a final answer: docs/rewards/builtin.md, "What counts as a final answer".
# A numeric gold answer needs a number literal; an expression that evaluates to it ("1 + 2", "6/2",
# "$8 + 2 - 7$") is not an answer but the question restated, and scores 0.
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:[ \u2009]\d{3})+|\d+)"  # 1,234 / 1 234 (groups of 3) / 1234
_DECIMAL = rf"(?:{_INT}(?:\.\d+)?|\.\d+)"
_FRACTION = r"(?:\d+\s*/\s*\d+)"
_UNIT = r"(?:%|[^\W\d_][^\W\d_/²³°]*(?:/[^\W\d_]+)?(?:\s+[^\W\d_]+){0,2}|°[CF]?)"
_LITERAL = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9_]*\s*=\s*)?"  # "x = 3": the value of a variable
    r"(?P<sign>[-+]?)\s*(?P<cur>[$€£¥])?\s*(?P<sign2>[-+]?)"
    rf"(?P<num>{_FRACTION}|{_DECIMAL})"
    rf"(?:\s*(?P<unit>{_UNIT}))?$")
# Words that make an answer a hedge ("3 or 4", "maybe 5", "about 3"), and words that make a number
# followed by them an expression rather than a number with a unit ("3 plus 0", "3 and 4").
HEDGE_WORDS = frozenset({"or", "either", "nor", "maybe", "perhaps", "possibly", "probably", "between", "not",
                         "approximately", "approx", "about", "around", "roughly", "nearly", "almost", "ish",
                         "otherwise", "else"})
_NOT_UNITS = HEDGE_WORDS | {"and", "to", "plus", "minus", "times", "over", "divided", "by", "than", "mod", "modulo"}
_LATEX_WRAPPERS = re.compile(r"\\(?:boxed|fbox|text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*{")
_FRAC = re.compile(r"\\[dt]?frac\s*{\s*([-+]?\d+)\s*}\s*{\s*([-+]?\d+)\s*}")
_NUMBER_TOKEN = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def _unwrap(text: str, start: int) -> tuple[str, int] | None:
    """The text inside the braces opening at `start` (brace-matched) and the index after the closing one."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1: i], i + 1
    return None


def _strip_latex(text: str) -> str:
    """LaTeX wrappers off: \\boxed{x} / \\text{x} → x, \\frac{p}{q} → p/q (integers), $…$ and \\( \\) dropped."""
    s = text.replace("\u2212", "-").replace("\\$", "\x00").replace("\\%", "%").replace("{,}", ",")
    s = re.sub(r"\\[,;! ]|~|\u202f|\xa0", "\u2009", s)  # LaTeX / typographic thin spaces
    s = re.sub(r"\\left|\\right|\\displaystyle", "", s)
    while (m := _LATEX_WRAPPERS.search(s)) is not None:
        inner = _unwrap(s, m.end() - 1)
        if inner is None:
            break
        s = s[: m.start()] + inner[0] + s[inner[1]:]
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    if s.count("$") >= 2:  # math delimiters; a single $ is a currency sign
        s = s.replace("$", "")
    return s.replace("\x00", "$")


def _tidy(text: str) -> str:
    s = _strip_latex(text).strip().strip("*`").strip()
    return re.sub(r"[.,;:!]+$", "", s).strip().strip("*`").strip()


def _fraction_in(num: str, question: str | None) -> bool:
    if not question:
        return False
    p, q = (x.strip() for x in num.split("/"))
    return re.search(rf"(?<![\d.]){p}\s*(?:/|\\div|÷)\s*{q}(?![\d.])", _strip_latex(question)) is not None


def parse_number(text: str, question: str | None = None, strict: bool = False) -> Fraction | None:
    """The value of a number literal, or None when `text` is not one.

    A literal is a signed integer or decimal (thousands separators only in groups of three:
    "1,234", "1 234"; "1,2" is a list), optionally in LaTeX ($…$, \\boxed{}, \\frac{p}{q}), after an
    optional currency sign or "x =", before an optional unit ("5 apples", "5%"; not a hedge word, not a
    single letter, which reads as a variable). A fraction p/q counts only in lowest terms with q > 1
    ("3/4"; "6/2" and "6/8" are unevaluated expressions) and, when `question` is given, only if the
    question does not contain it. `strict` (for gold answers): no unit, no "x =", any fraction.
    """
    s = _tidy(text)
    m = _LITERAL.match(s)
    if m is None or (m.group("sign") and m.group("sign2")):
        return None
    unit = m.group("unit")
    if strict and (unit not in (None, "%") or "=" in s):
        return None
    if unit and unit != "%":
        if (len(unit) == 1 and unit.isalpha()) or any(w.lower() in _NOT_UNITS for w in unit.split()):
            return None
    num = m.group("num")
    sign = -1 if "-" in (m.group("sign") + m.group("sign2")) else 1
    if "/" in num:
        p, q = (int(x) for x in num.split("/"))
        if q == 0:
            return None
        if not strict and (q == 1 or math.gcd(p, q) != 1 or _fraction_in(num, question)):
            return None
        return sign * Fraction(p, q)
    try:
        return sign * Fraction(re.sub(r"[,\s\u2009]", "", num))
    except (ValueError, ZeroDivisionError):
        return None


def is_number(text: str) -> bool:
    """Whether `text` is a plain number literal (the strict form used for gold answers)."""
    return parse_number(text, strict=True) is not None


def _numbers_equal(p: Fraction, g: Fraction) -> bool:
    return abs(float(p) - float(g)) <= 1e-6 * max(1.0, abs(float(g)))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", _strip_latex(text).lower())


def restates_question(predicted: str, question: str | None, gold: str = "", window: int = 5) -> bool:
    """Whether a prediction copies the question: it shares a run of `window` characters (spaces
    ignored) with the question that is not also in the gold answer."""
    if not question:
        return False
    p, q, g = _squash(predicted), _squash(question), _squash(gold)
    return any(p[i: i + window] in q and p[i: i + window] not in g for i in range(len(p) - window + 1))


def _hedges(text: str) -> bool:
    return any(w in HEDGE_WORDS for w in re.findall(r"[a-z]+", _strip_latex(text).lower()))


def extract_answer(text: str, pattern: str | None = None) -> str | None:
    """The text after the last 'Answer:' marker (or a custom regex's first group), tidied."""
    regex = re.compile(pattern, re.IGNORECASE) if pattern else ANSWER_PATTERN
    matches = regex.findall(text)
    if not matches:
        return None
    return _tidy_marker(matches[-1] if isinstance(matches[-1], str) else matches[-1][0])


def _tidy_marker(answer: str) -> str | None:
    answer = answer.strip().splitlines()[0] if answer.strip() else ""
    answer = answer.strip(" *$`").rstrip(".").strip(" *$`")
    return answer or None


def answer_candidates(text: str, pattern: str | None = None) -> list[str]:
    """Every explicit final answer in the reply, in order: each 'Answer:' marker's text (or each match
    of a custom regex) and, with the default marker, each \\boxed{…}'s content."""
    regex = re.compile(pattern, re.IGNORECASE) if pattern else ANSWER_PATTERN
    found: list[tuple[int, str]] = []
    for m in regex.finditer(text):
        tidy = _tidy_marker(m.group(1) if regex.groups else m.group(0))
        if tidy is not None:
            found.append((m.start(), tidy))
    if pattern is None:  # a \boxed{} on a marker's line is part of that answer, not another one
        ends = [text.find("\n", pos) for pos, _ in found]
        lines = [(pos, len(text) if end < 0 else end) for (pos, _), end in zip(found, ends)]
        for m in re.finditer(r"\\boxed\s*{", text):
            inner = _unwrap(text, m.end() - 1)
            on_marker_line = any(start < m.start() < end for start, end in lines)
            if inner is not None and inner[0].strip() and not on_marker_line:
                found.append((m.start(), inner[0].strip()))
    return [a for _, a in sorted(found, key=lambda x: x[0])]


LAST_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in the text (a lenient fallback when no 'Answer:' marker is present).

    Unchanged for the modules that use it (majority vote, MEDS, shaped rewards); the `answer` reward
    uses the stricter `fallback_number`."""
    found = LAST_NUMBER.findall(text)
    return found[-1].rstrip(",") if found else None


def fallback_number(text: str, question: str | None = None) -> str | None:
    """The reply's final number when it has no answer marker, or None when that number is not a final value.

    The number must be the only distinct value in the reply's final statement (the text after the last
    '=' before it, or else its sentence), apart from numbers the question itself contains; it must not
    be an operand ("… 5 + 3" at a cut-off), and the statement up to it, or the two words after it,
    must not hedge ("3 or 4", "maybe 5", "5, or not").
    So "40 + 2 = 42." gives 42 and "The sum of 4 and 5 is 9." gives 9, but "3, 4, 5, 6" gives nothing.
    """
    tokens = list(_NUMBER_TOKEN.finditer(text))
    if not tokens:
        return None
    last = tokens[-1]
    digits_start = last.start() + (1 if last.group(0)[0] in "+-−" else 0)
    before = text[:digits_start].rstrip()
    if before and before[-1] in "+-−*/×÷^" and re.search(r"[\d)]\s*[+\-−*/×÷^]$", before):
        return None  # an operand, not a result
    sentence_start = max((m.end() for m in re.finditer(r"[.!?;:](?=\s)|\n", text[: last.start()])), default=0)
    region_start = max(sentence_start, text.rfind("=", 0, last.start()) + 1)
    region = text[region_start:]
    after = " ".join(re.findall(r"[^\W\d_]+", text[last.end():])[:2])  # "42 or 43", "42, maybe"
    if _hedges(text[region_start: last.end()] + " " + after):
        return None
    allowed = {parse_number(t) for t in _NUMBER_TOKEN.findall(question or "")}
    value = parse_number(last.group(0))
    others = {parse_number(m.group(0)) for m in _NUMBER_TOKEN.finditer(region)} - allowed - {value}
    return last.group(0).replace("−", "-") if not others else None


def final_answer(text: str, pattern: str | None = None, fallback: str = "none",
                 question: str | None = None) -> str | None:
    """The answer a reply commits to, or None.

    The last explicit answer ('Answer:' marker, or \\boxed{}), provided every explicit answer in the
    reply agrees with it (several conflicting 'Answer:' lines are a hedge and give None, with no
    fallback). Without any marker, `fallback="last_number"` reads `fallback_number`.
    """
    if fallback not in ("none", "last_number"):
        raise ValueError(f"fallback must be 'none' or 'last_number', got {fallback!r}")
    candidates = answer_candidates(text, pattern)
    if candidates:
        final = candidates[-1]
        agree = all(_same_text(c, final) or answers_match(c, final) for c in candidates[:-1])
        return final if agree else None
    return fallback_number(text, question) if fallback == "last_number" else None


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _as_number(text: str) -> float | None:
    value = parse_number(text)
    return None if value is None else float(value)


def answers_match(predicted: str, gold: str, question: str | None = None) -> bool:
    """Whether `predicted` is the gold answer.

    Numeric gold: the prediction must be a number literal (`parse_number`) of equal value (relative
    1e-6), never an expression that evaluates to it. Other gold: identical text, or math-verify's
    symbolic equivalence unless the prediction hedges ("x or y") or copies a run of the question
    (`restates_question`, when `question` is given), or case- and space-insensitive text equality.
    """
    if _same_text(_tidy(predicted), _tidy(gold)):
        return True
    g = parse_number(gold, strict=True)
    if g is not None:
        p = parse_number(predicted, question)
        return p is not None and _numbers_equal(p, g)
    if _hedges(predicted) and not _hedges(gold):
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
    except Exception:  # math-verify raises on exotic input; treat as "no symbolic match"
        return False


@REWARD_FNS.register("answer", "1 if the reply's final answer matches the gold (number literal, math-verify, text)")
def answer_reward(sample: Sample, pattern: str | None = None, fallback: str = "none") -> float:
    """`fallback="last_number"` grades the final number of a reply that has no 'Answer:' marker.

    What counts as a final answer: docs/rewards/builtin.md."""
    row = sample.info["row"]
    question = row.get("question")
    predicted = final_answer(sample.info["text"], pattern, fallback, question)
    return float(predicted is not None and answers_match(predicted, str(row["answer"]), question))


@REWARD_FNS.register("format", "1 if the completion ends with an 'Answer: ...' line")
def format_reward(sample: Sample, pattern: str = r"answer\s*:\s*\S+[^\n]*\s*$") -> float:
    return float(re.search(pattern, sample.info["text"].strip(), re.IGNORECASE) is not None)


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

    Where the dataset's answer is a number, the final answer must be a number literal (`parse_number`);
    the scorer sees it in canonical form ("3.0", "$3$", "1,234" → "3", "3", "1234") and its verdict is
    all-or-nothing: the scorers' substring partial credit would pay any reply containing the gold
    digits ("0123456789" earns 0.1 for every one-digit answer, "33" 0.5 for gold 3, "3 + 0" 0.2).
    `partial_credit: true` keeps the scorer's fractional values for number literals. Other answers
    (words, lists, boards) go to the scorer as extracted, partial credit included.
    """
    import reasoning_gym

    row = sample.info["row"]
    entry = row.get("entry")
    if entry is None:
        raise ValueError("reasoning_gym reward needs rows from the reasoning_gym task")
    question = row.get("question", entry.get("question"))
    predicted = final_answer(sample.info["text"], pattern, fallback, question)
    if predicted is None:
        return 0.0
    scorer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    if not is_number(str(entry["answer"])):
        return float(scorer(predicted, entry))
    value = parse_number(predicted, question)
    if value is None:
        return 0.0
    score = float(scorer(_canonical(value), entry))
    return score if partial_credit else float(score >= 1.0)


def _canonical(value: Fraction) -> str:
    """An integer as digits, a terminating decimal as a decimal ("0.75"), anything else as p/q."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for f in (2, 5):
        while d % f == 0:
            d //= f
    if d != 1:
        return f"{value.numerator}/{value.denominator}"
    text = f"{Decimal(value.numerator) / Decimal(value.denominator):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
