"""finance: one number in the asked form (percent, fraction, amount), currency and separators read, the row's
rounding enforced; hedges, several numbers, unrounded answers and numbers in words do not score."""
import pytest

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.finance import read_stated
from lmrl.types import Sample

finance = REWARD_FNS.get("finance")


def score(text, answer, **row_and_params):
    params = {k: row_and_params.pop(k) for k in list(row_and_params) if k in ("rel_tol", "fallback")}
    row = {"question": "q", "answer": answer, **row_and_params}
    return finance(Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row), **params)


def test_amounts_with_currency_signs_codes_and_thousands_separators():
    for reply in ["Answer: $1,234.50", "Answer: 1234.50", "Answer: USD 1,234.50", "Answer: 1,234.50 USD",
                  "Answer: **$1,234.50**."]:
        assert score(reply, "1234.5", decimals=2, currency="$") == 1.0, reply
    assert score("Answer: €1,234.50", "1234.5", decimals=2, currency="$") == 0.0  # another currency
    assert score("Answer: €1,234.50", "1234.5", decimals=2) == 1.0  # the row names none
    assert score("Answer: -$45.00", "-45", decimals=2) == 1.0
    assert score("Answer: 1,23,4.50", "1234.5") == 0.0  # separators not in groups of three


def test_percent_versus_fraction_is_the_rows_choice():
    assert score("Answer: 12%", "12", answer_format="percent") == 1.0
    assert score("Answer: 12 percent", "12%", answer_format="percent") == 1.0
    assert score("Answer: 0.12", "12", answer_format="percent") == 0.0
    assert score("Answer: 12", "12", answer_format="percent") == 0.0  # a percent needs its sign
    assert score("Answer: 0.12", "0.12", answer_format="fraction") == 1.0
    assert score("Answer: 12%", "0.12", answer_format="fraction") == 0.0
    assert score("Answer: €0.12", "0.12", answer_format="fraction") == 0.0
    assert score("Answer: 0.12 USD", "0.12", answer_format="fraction") == 0.0
    # a "$" right after the marker is read as a math delimiter by every grader (final_answer), so it is dropped
    assert score("Answer: $0.12", "0.12", answer_format="fraction") == 1.0
    assert score("Answer: 12%", "12") == 0.0  # an amount is no percent


def test_rounding_must_be_done_not_merely_close():
    # gold 1234.4967 to 2 places: 1234.50 (halves away from zero)
    assert score("Answer: $1,234.50", "1234.4967", decimals=2) == 1.0
    assert score("Answer: $1,234.4967", "1234.4967", decimals=2) == 0.0  # unrounded
    assert score("Answer: $1,234.5", "1234.4967", decimals=2) == 0.0  # one place short
    assert score("Answer: $1,234.49", "1234.4967", decimals=2) == 0.0  # truncated, not rounded
    assert score("Answer: 2.5%", "2.45", answer_format="percent", decimals=1) == 1.0  # 2.45 -> 2.5
    assert score("Answer: 1235", "1234.5", decimals=0) == 1.0
    assert score("Answer: 1235.0", "1234.5", decimals=0) == 0.0


def test_relative_tolerance_without_a_rounding_rule():
    # |1000.9 - 1000| / 1000 = 0.0009 <= 0.001; 1001.1 is 0.0011 away
    assert score("Answer: 1000.9", "1000") == 1.0
    assert score("Answer: 1001.1", "1000") == 0.0
    assert score("Answer: 1001.1", "1000", rel_tol=0.002) == 1.0
    assert score("Answer: 0.0", "0") == 1.0 and score("Answer: 0.001", "0") == 0.0


@pytest.mark.parametrize("reply", [
    "Answer: 12% or 0.12", "Answer: 12% (0.12)", "Answer: 12%, 0.12", "Answer: 12% 0.12",
    "Answer: $1,234.50 / 1234.50", "Answer: twelve percent", "Answer: 12 million", "Answer: 1.2k",
    "Answer: twelve", "Answer: (12)", "Answer: about 12%", "Answer: ~12%", "Answer: 12%\nAnswer: 13%",
    "Answer: 12%\nWait, that is wrong.", "Answer: $ € 12", "Answer: 12% %", "Answer: 1.2e1%",
])
def test_hedges_several_numbers_and_words_score_zero(reply):
    assert score(reply, "12", answer_format="percent") == 0.0


def test_a_number_in_the_reasoning_is_not_the_answer():
    assert score("The rate is 12%.", "12", answer_format="percent") == 0.0
    assert score("The rate is 12%", "12", answer_format="percent", fallback="last_number") == 0.0  # % after it
    assert score("So the total is 1234.50", "1234.5", decimals=2, fallback="last_number") == 1.0


def test_read_stated():
    stated = read_stated("USD 1,234.50")
    assert (stated.number.value, stated.percent, stated.currency) == (1234.5, False, "USD")
    assert read_stated("$ 5 EUR") is None and read_stated("--5") is None


def test_bad_rows_are_clear_errors():
    with pytest.raises(ValueError, match="must be one of amount, percent, fraction"):
        score("Answer: 1", "1", answer_format="ratio")
    with pytest.raises(ValueError, match="not a plain number"):
        score("Answer: 1", "about 1")
    with pytest.raises(ValueError, match="whole number of decimal places"):
        score("Answer: 1", "1", decimals=1.5)
    with pytest.raises(ValueError, match="rel_tol must be >= 0"):
        score("Answer: 1", "1", rel_tol=-1)
