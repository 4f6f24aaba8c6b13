"""Number literals in replies and gold answers, and how a predicted number is compared with the gold.

A grader must pay for the value a reply states, exactly: an integer gold is matched by the same
integer only, a decimal gold at its own precision, a fraction gold by an equal value (by a fraction
when the question asks for one). An expression that evaluates to the gold, a number followed by
words that change it ("16 thousand", "16²", "16 is wrong") or a value the question itself contains
is not a literal. The rules are listed in docs/rewards/builtin.md, "What counts as a final answer".
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

# Width and dash variants that mean the ASCII character: full-width forms (U+FF01-FF5E, "１６", "：",
# "－"), the ideographic space, and the minus sign, en dash, figure dash, hyphens and small hyphen-minus
# used as a minus sign ("−28", "–28"). Superscripts and vulgar fractions are left alone: "16²" ≠ 162.
_MARKS = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)} | {0x3000: " "} | {
    ord(c): "-" for c in "\u2212\u2013\u2012\u2010\u2011\ufe63"}
_STRUCK = re.compile(r"~~[^~\n]*~~|<(s|del|strike)\b[^>]*>[^\n]*?</\1\s*>", re.IGNORECASE)
_SUPERSCRIPT = re.compile(r"<sup\b[^>]*>(.*?)</sup\s*>", re.IGNORECASE | re.DOTALL)
_SUBSCRIPT = re.compile(r"<sub\b[^>]*>(.*?)</sub\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"</?[A-Za-z][\w-]*(?:\s[^<>]*)?/?>")

_INT = r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:[ \u2009]\d{3})+|\d+)"  # 1,234 / 1 234 (groups of 3) / 1234
_DECIMAL = rf"(?:{_INT}(?:\.\d+)?|\.\d+)"
_FRACTION = r"(?:\d+\s*/\s*\d+)"
_UNIT = r"(?:%|°[CF]?|[$€£¥]|[^\W\d_]\S*(?:\s+[^\W\d_]\S*){0,2})"
_LITERAL = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9_]*\s*=\s*)?"  # "x = 3": the value of a variable
    r"(?P<open>\()?\s*"  # "(-28)"
    r"(?P<sign>[-+]?)\s*(?P<cur>[$€£¥])?\s*(?P<sign2>[-+]?)\s*"
    rf"(?P<num>{_FRACTION}|{_DECIMAL})(?P<exp>[eE][-+]?\d+)?"
    r"\s*(?(open)\))"
    rf"(?:\s*(?P<unit>{_UNIT}))?$")
# Words that make an answer a hedge ("3 or 4", "maybe 5", "about 3").
HEDGE_WORDS = frozenset({"or", "either", "nor", "maybe", "perhaps", "possibly", "probably", "between", "not",
                         "approximately", "approx", "about", "around", "roughly", "nearly", "almost", "ish",
                         "otherwise", "else"})
# Words that change the number they follow ("16 thousand", "16 squared") or retract it ("16 is wrong").
MAGNITUDE_WORDS = frozenset(
    "hundred hundreds thousand thousands million millions billion billions trillion trillions dozen dozens "
    "half halves quarter quarters third thirds squared cubed power point percentile".split()
    + "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
      "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety".split())
RETRACTION_WORDS = frozenset("no not nope never wrong incorrect false invalid mistake mistaken error erroneous "
                             "wait actually sorry oops correction instead rather".split())
# Words after a number that make it part of a sentence or an expression rather than a number with a unit.
_NOT_UNITS = HEDGE_WORDS | MAGNITUDE_WORDS | RETRACTION_WORDS | frozenset(
    "and to plus minus times over divided by than mod modulo of in on at for from with as if then so because "
    "since but however unless except is are was were be been being am seems seem looks look might may could "
    "would should will shall can cannot must do does did has have had isn isnt wasn doesn don didn i me my it "
    "its this that these those he she we they you your our their there here which what who the a an".split())

_LATEX_WRAPPERS = re.compile(r"\\(?:boxed|fbox|text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*{")
_FRAC = re.compile(r"\\[dt]?frac\s*{\s*([-+]?\d+)\s*}\s*{\s*([-+]?\d+)\s*}")
_ASKS_FRACTION = re.compile(r"\bfraction|\bsimplif|\blowest terms|\bsimplest form|\breduced form", re.IGNORECASE)
_ASKS_DECIMAL = re.compile(r"\bas a decimal|\bin decimal|\bdecimal (?:form|number|notation|places?)\b",
                           re.IGNORECASE)
_ASKS_SCIENTIFIC = re.compile(r"scientific notation|\be[- ]notation|['\"]e['\"] notation", re.IGNORECASE)


def clean_marks(text: str) -> str:
    """Width and dash variants as ASCII, struck-out text (~~x~~, <s>, <del>) removed, HTML tags off
    (<sup>2</sup> kept as ^(2))."""
    s = _STRUCK.sub("", text.translate(_MARKS))
    s = _SUBSCRIPT.sub(r"_(\1)", _SUPERSCRIPT.sub(r"^(\1)", s))
    return _TAG.sub("", s)


def unwrap(text: str, start: int) -> tuple[str, int] | None:
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


def strip_latex(text: str) -> str:
    """LaTeX wrappers off: \\boxed{x} / \\text{x} → x, \\frac{p}{q} → p/q (integers), $…$ and \\( \\) dropped."""
    s = clean_marks(text).replace("\\$", "\x00").replace("\\%", "%").replace("{,}", ",")
    s = re.sub(r"\\[,;! ]|(?<=\S)~(?=\S)|\u202f|\xa0", "\u2009", s)  # LaTeX / typographic thin spaces; "~16" stays
    s = re.sub(r"\\left|\\right|\\displaystyle", "", s)
    while (m := _LATEX_WRAPPERS.search(s)) is not None:
        inner = unwrap(s, m.end() - 1)
        if inner is None:
            break
        s = s[: m.start()] + inner[0] + s[inner[1]:]
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    if s.count("$") >= 2:  # math delimiters; a single $ is a currency sign
        s = s.replace("$", "")
    return s.replace("\x00", "$")


def tidy(text: str) -> str:
    """The answer text without LaTeX, emphasis (*, _, `) or trailing punctuation."""
    s = strip_latex(text).strip().strip("*`_").strip()
    return re.sub(r"[.,;:!]+$", "", s).strip().strip("*`_").strip()


def same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


@dataclass(frozen=True)
class Literal:
    """A number as written: its exact value, its form ("integer", "decimal", "fraction", "scientific")
    and, for decimals and e-notation, the place value of its last written digit (0.01 for "0.75")."""

    value: Fraction
    form: str
    quantum: Fraction = Fraction(1)


def _fraction_in(num: str, question: str | None) -> bool:
    if not question:
        return False
    p, q = (x.strip() for x in num.split("/"))
    return re.search(rf"(?<![\d.]){p}\s*(?:/|\\div|÷)\s*{q}(?![\d.])", strip_latex(question)) is not None


def _is_unit(unit: str) -> bool:
    """A unit is "%", a degree or currency sign, or up to three words of letters (an optional ² or ³ at a word's end,
    "km/h"), none a single letter (read as a variable: "3x") and none a word of `_NOT_UNITS`."""
    if unit in ("%", "$", "€", "£", "¥") or unit.startswith("°"):
        return True
    words = [w.rstrip("²³") for w in re.split(r"[\s/]+", unit)]
    if len(unit) == 1 or not all(w.isalpha() for w in words):
        return False
    return not any(w.lower() in _NOT_UNITS for w in words)


def read_literal(text: str, question: str | None = None, strict: bool = False,
                 scientific: bool | None = None) -> Literal | None:
    """The number literal `text` states, or None when it is not one.

    A literal is a signed integer or decimal (thousands separators only in groups of three: "1,234",
    "1 234"; "1,2" is a list), optionally in LaTeX ($…$, \\boxed{}, \\frac{p}{q}), in parentheses, after an
    optional currency sign or "x =", before an optional unit ("5 apples", "5%"; see `_is_unit`). A fraction
    p/q counts only in lowest terms with q > 1 ("3/4"; "6/2" and "6/8" are unevaluated expressions) and,
    when `question` is given, only if the question does not contain it. "~16" and "≈16" are hedges.
    E-notation ("1.23e+4") counts when `scientific` (default: when the question asks for scientific
    notation). `strict` (for gold answers): no unit, no "x =", any fraction, e-notation allowed.
    """
    s = tidy(text)
    m = _LITERAL.match(s)
    if m is None or (m.group("sign") and m.group("sign2")):
        return None
    unit, num, exp = m.group("unit"), m.group("num"), m.group("exp")
    if strict and (unit not in (None, "%") or "=" in s):
        return None
    if unit is not None and not _is_unit(unit):
        return None
    if scientific is None:
        scientific = strict or bool(question and _ASKS_SCIENTIFIC.search(question))
    if exp is not None and (not scientific or "/" in num):
        return None
    sign = -1 if "-" in (m.group("sign") + m.group("sign2")) else 1
    if "/" in num:
        p, q = (int(x) for x in num.split("/"))
        if q == 0 or (not strict and (q == 1 or math.gcd(p, q) != 1 or _fraction_in(num, question))):
            return None
        return Literal(sign * Fraction(p, q), "fraction")
    digits = re.sub(r"[,\s\u2009]", "", num) + (exp or "")
    exponent = Decimal(digits).as_tuple().exponent
    form = "scientific" if exp else ("decimal" if "." in num else "integer")
    return Literal(sign * Fraction(digits), form, Fraction(10) ** exponent)


def parse_number(text: str, question: str | None = None, strict: bool = False) -> Fraction | None:
    """The value of the number literal `text` (`read_literal`), or None when it is not one."""
    literal = read_literal(text, question, strict)
    return None if literal is None else literal.value


def is_number(text: str) -> bool:
    """Whether `text` is a plain number literal (the strict form used for gold answers)."""
    return read_literal(text, strict=True) is not None


def read_prediction(predicted: str, gold_text: str, gold: Literal, question: str | None = None) -> Literal | None:
    """The number a prediction states for a numeric gold, or None when it states none in an accepted form.

    Text identical to the gold's is the gold. Otherwise a literal (`read_literal`; e-notation also when
    the gold is written in it) whose form the question allows: a decimal is no answer when the gold is a
    fraction and the question asks for a fraction ("Simplify 6/8": "0.75" scores 0), nor a fraction when
    the question asks for a decimal.
    """
    if same_text(tidy(predicted), tidy(gold_text)):
        return gold
    scientific = gold.form == "scientific" or bool(question and _ASKS_SCIENTIFIC.search(question))
    p = read_literal(predicted, question, scientific=scientific)
    if p is None:
        return None
    if gold.form == "fraction" and p.form in ("decimal", "scientific") and question and _ASKS_FRACTION.search(question):
        return None
    if p.form == "fraction" and gold.form != "fraction" and question and _ASKS_DECIMAL.search(question):
        return None
    return p


def round_to(value: Fraction, quantum: Fraction) -> Fraction:
    """`value` rounded to a multiple of `quantum`, halves away from zero."""
    steps = math.floor(abs(value) / quantum + Fraction(1, 2))
    return (steps if value >= 0 else -steps) * quantum


def numbers_match(predicted: Literal, gold: Literal) -> bool:
    """Integers and fractions: equal values only. Decimals and e-notation: the prediction rounded to the
    gold's last written digit equals the gold (gold 0.33: 0.33 and 0.333 match, 0.3 and 0.34 do not)."""
    if predicted.value == gold.value:
        return True
    return gold.form in ("decimal", "scientific") and round_to(predicted.value, gold.quantum) == gold.value


def canonical(value: Fraction, as_fraction: bool = False) -> str:
    """A value as a scorer reads it: p/q when `as_fraction`; else an integer as digits, a terminating
    decimal in full ("0.75", "0.0000123"), anything else as p/q."""
    n, d = value.numerator, value.denominator
    if as_fraction:
        return f"{n}/{d}"
    if d == 1:
        return str(n)
    twos, fives, rest = 0, 0, d
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:
        return f"{n}/{d}"
    places = max(twos, fives)
    scaled = abs(n) * 10 ** places // d
    whole, frac = divmod(scaled, 10 ** places)
    return f"{'-' if n < 0 else ''}{whole}.{frac:0{places}d}".rstrip("0").rstrip(".")
