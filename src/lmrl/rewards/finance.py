"""Finance answers: one number in the form the question asks for (a percent, a fraction of one, or an
amount), currency signs and thousands separators read, the row's rounding convention enforced.

The final answer is read as every lmrl grader reads it (`final_answer`: the last 'Answer:' marker, all
markers agreeing, nothing retracting it); the number in it by `read_literal` (numbers.py), with a thin
surface rule on top: at most one currency marker before the number, at most a percent sign or a currency
code after it, nothing else. The rules: docs/rewards/finance.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from lmrl.rewards.answers import final_answer
from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.numbers import Literal, read_literal, round_to, tidy
from lmrl.types import Sample

FORMATS = ("amount", "percent", "fraction")
CURRENCY_SIGNS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}
_AMOUNT = re.compile(
    r"^(?P<sign>[-+]?)\s*(?:(?P<sym>[$€£¥])|(?P<pre>[A-Z]{3})\s)?\s*(?P<sign2>[-+]?)\s*"
    r"(?P<num>\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?P<post>%|percent|[A-Z]{3})?$")


@dataclass(frozen=True)
class Stated:
    """A final answer as stated: its number, whether it carries a percent sign, and its currency code."""

    number: Literal
    percent: bool
    currency: str | None


def read_stated(answer: str) -> Stated | None:
    """The one number a final answer states with its percent sign and currency, or None: several numbers
    ("12% or 0.12"), words ("twelve", "12 million"), an accounting negative in parentheses, two currency
    markers, or a number `read_literal` refuses ("1,2")."""
    m = _AMOUNT.match(tidy(answer))
    if m is None or (m.group("sign") and m.group("sign2")):
        return None
    codes = [CURRENCY_SIGNS.get(m.group("sym")), m.group("pre"), m.group("post")]
    codes = [c for c in codes if c and c != "%" and c != "percent"]
    percent = m.group("post") in ("%", "percent")
    if len(codes) > 1:
        return None
    number = read_literal(m.group("sign") + m.group("sign2") + m.group("num"))
    if number is None:
        return None
    return Stated(number, percent, codes[0] if codes else None)


def _gold(row: dict, decimals_field: str) -> tuple[Fraction, int | None]:
    gold = read_literal(str(row["answer"]).strip().removesuffix("%"), strict=True)
    if gold is None or gold.form == "scientific":
        raise ValueError(f"finance: the row's answer {row['answer']!r} is not a plain number (write 1234.5 or 12.5%)")
    decimals = row.get(decimals_field)
    if decimals is not None and (not isinstance(decimals, int) or isinstance(decimals, bool) or decimals < 0):
        raise ValueError(f"finance: the row's {decimals_field!r} must be a whole number of decimal places, "
                         f"got {decimals!r}")
    return gold.value, decimals


def _currency_code(currency: str | None) -> str | None:
    return None if currency is None else CURRENCY_SIGNS.get(currency, currency.upper())


@REWARD_FNS.register("finance", "1 if the final answer is the gold number in the asked form (percent, fraction, "
                                "amount), rounded as the row says")
def finance_reward(sample: Sample, rel_tol: float = 1e-3, format_field: str = "answer_format",
                   decimals_field: str = "decimals", currency_field: str = "currency",
                   pattern: str | None = None, fallback: str = "none") -> float:
    """1 when the final answer states one number in the row's form and it is the gold: with the row's
    `decimals`, written with exactly that many decimal places and equal to the gold rounded to them (halves
    away from zero); without, within `rel_tol` of the gold (relative). `percent` rows need a % sign (the gold
    is in percent: 12.5 for 12.5%), `fraction` and `amount` rows none; a currency marker must be the row's
    `currency` (when given) and is refused on percent and fraction rows."""
    if rel_tol < 0:
        raise ValueError(f"finance: rel_tol must be >= 0, got {rel_tol}")
    row = sample.row
    form = row.get(format_field, "amount")
    if form not in FORMATS:
        raise ValueError(f"finance: the row's {format_field!r} must be one of {', '.join(FORMATS)}, got {form!r}")
    gold, decimals = _gold(row, decimals_field)
    predicted = final_answer(sample.text, pattern, fallback, row.get("question"))
    stated = None if predicted is None else read_stated(predicted)
    if stated is None or stated.percent != (form == "percent"):
        return 0.0
    wanted_currency = _currency_code(row.get(currency_field))
    if stated.currency is not None and (form != "amount" or stated.currency != (wanted_currency or stated.currency)):
        return 0.0
    value = stated.number.value
    if decimals is not None:
        quantum = Fraction(1, 10 ** decimals)
        return float(stated.number.quantum == quantum and value == round_to(gold, quantum))
    return float(abs(value - gold) <= Fraction(rel_tol) * abs(gold))
