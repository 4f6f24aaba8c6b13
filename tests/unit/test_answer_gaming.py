"""Gaming attempts against the answer graders: each must score 0; the correct forms must still score 1.

The rows are real reasoning-gym rows (basic_arithmetic as in the quickstart recipe, and chain_sum with
3 one-digit terms, the task where a policy learned to answer with the question's own expression).
`ATTEMPTS` and `CORRECT` are also read by the re-check script behind docs/algorithms.md.
"""
from __future__ import annotations

import pytest

from lmrl.rewards import REWARD_FNS, answers_match
from lmrl.rewards.functions import final_answer
from lmrl.types import Sample

reasoning_gym = pytest.importorskip("reasoning_gym")

QUICKSTART = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+", "-"],
                  allow_parentheses=False, allow_negation=False)
CHAIN_SUM = dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1)

_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
         "sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def in_words(n: int) -> str:
    if n < 0:
        return "minus " + in_words(-n)
    if n < 20:
        return _WORDS[n]
    return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _WORDS[n % 10])


# Every template is formatted with E (the question's expression), Q (the question), G (gold), and
# G1 = gold + 1, Gm = gold - 1, W (gold in words), T (E with spaces removed), and the gold with its minus
# sign written as U+2212 (M), an en dash (D) or a full-width hyphen-minus (F).
ATTEMPTS = [
    ("the question's expression", "Answer: {E}"),
    ("the expression without spaces", "Answer: {T}"),
    ("the expression in $…$", "Answer: ${E}$"),
    ("the expression boxed", "\\boxed{{{T}}}"),
    ("the expression boxed after the marker", "Answer: $\\boxed{{{E}}}$"),
    ("the question copied verbatim after the marker", "Answer: {Q}"),
    ("the question copied verbatim, no marker", "{Q}"),
    ("the expression with '= ?'", "{E} = ?"),
    ("the expression followed by its value", "Answer: {E} = {G}"),
    ("gold + 0", "Answer: {G} + 0"),
    ("gold * 1", "Answer: {G}*1"),
    ("0 + gold", "Answer: 0 + {G}"),
    ("gold - 0 in LaTeX", "Answer: $\\boxed{{{G} - 0}}$"),
    ("hedge 'or', gold first", "Answer: {G} or {G1}"),
    ("hedge 'or', gold last", "Answer: {G1} or {G}"),
    ("hedge 'and'", "Answer: {G} and {G1}"),
    ("hedge 'maybe'", "Answer: maybe {G}"),
    ("hedge 'either'", "Answer: either {Gm} or {G}"),
    ("conflicting answers, gold last", "Answer: {G1}\nAnswer: {G}"),
    ("conflicting answers, gold first", "Answer: {G}\nAnswer: {G1}"),
    ("conflicting boxed and marker", "I think \\boxed{{{G1}}}.\nAnswer: {G}"),
    ("the number in words", "Answer: {W}"),
    ("the expression in words", "Answer: the sum of the numbers in the question"),
    ("a list of candidates after the marker", "Answer: {Gm}, {G}, {G1}"),
    ("a list of candidates, no marker", "It could be {G1}, {Gm} or {G}"),
    ("a bare list of candidates, no marker", "{G1} {Gm} {G}"),
    ("every digit (reasoning-gym partial credit)", "Answer: 0123456789"),
    ("gold repeated", "Answer: {G}{G}"),
    ("a cut-off derivation ending on an operand", "Let me compute {E}"),
    ("a superscript after the gold", "Answer: {G}\u00b2"),
    ("an HTML superscript after the gold", "Answer: {G}<sup>2</sup>"),
    ("a vulgar fraction after the gold", "Answer: {G}\u00bd"),
    ("a magnitude word after the gold", "Answer: {G} thousand"),
    ("a retraction after the gold, same line", "Answer: {G} is wrong"),
    ("a retraction on the next line", "Answer: {G}\nWait, that is wrong."),
    ("a later bold marker, gold first", "Answer: {G}\n**Answer**: {G1}"),
    ("a later bold marker, gold last", "Answer: {G1}\n**Answer**: {G}"),
    ("a later full-width-colon marker", "Answer: {G1}\nAnswer\uff1a{G}"),
    ("the gold struck out", "Answer: ~~{G}~~ {G1}"),
    ("only the gold, struck out", "Answer: ~~{G}~~"),
    ("a list across lines", "Answer: {G}\n{G1}"),
    ("approximately the gold", "Answer: ~{G}"),
    ("approximately the gold, \u2248", "Answer: \u2248{G}"),
]

CORRECT = [
    ("plain", "Answer: {G}"),
    ("with a derivation", "{E} = {G}. Answer: {G}"),
    ("decimal", "Answer: {G}.0"),
    ("trailing period", "Answer: {G}."),
    ("in $…$", "Answer: ${G}$"),
    ("bold", "Answer: **{G}**"),
    ("boxed", "So the result is \\boxed{{{G}}}"),
    ("boxed after the marker", "Answer: $\\boxed{{{G}}}$"),
    ("the same answer twice", "Answer: {G}\nAnswer: {G}.0"),
    ("a variable's value", "Answer: x = {G}"),
    ("U+2212 minus sign", "Answer: {M}"),
    ("en-dash minus sign", "Answer: {D}"),
    ("full-width minus sign", "Answer: {F}"),
    ("in parentheses", "Answer: ({G})"),
    ("HTML bold", "Answer: <b>{G}</b>"),
    ("bold marker", "**Answer**: {G}"),
    ("bold marker and colon, value on the next line", "**Answer:**\n{G}"),
    ("full-width colon", "Answer\uff1a{G}"),
    ("final answer", "Final answer: {G}"),
    ("a struck-out wrong answer first", "Answer: ~~{G1}~~ {G}"),
    ("an explanation after the answer", "Answer: {G}\nThat is the value of {E}."),
]

# Correct without a marker: graded only with `fallback: last_number`.
CORRECT_FALLBACK = [
    ("derivation ending in the value", "{E} = {G}."),
    ("sentence with the question's numbers", "The result of {E} is {G}."),
]


def rg_rows(name: str, params: dict, n: int = 40, seed: int = 7) -> list[dict]:
    ds = reasoning_gym.create_dataset(name, size=n, seed=seed, **params)
    return [{"uid": str(i), "question": e["question"], "answer": str(e["answer"]), "source": name, "entry": e}
            for i, e in enumerate(ds)]


def pick(rows: list[dict], negative: bool) -> dict:
    """A row whose gold is negative (or positive), whose last operand is not the gold, gold ≠ ±1."""
    for r in rows:
        g = int(r["answer"])
        last_operand = int(r["entry"]["metadata"]["expression"].split()[-1])
        if (g < 0) == negative and abs(g) > 1 and last_operand != g:
            return r
    raise AssertionError("no suitable row")


ROWS = {f"{name}:{sign}": pick(rg_rows(name, params), sign == "neg")
        for name, params in (("basic_arithmetic", QUICKSTART), ("chain_sum", CHAIN_SUM))
        for sign in ("pos", "neg")}


def fill(template: str, row: dict) -> str:
    e = row["entry"]["metadata"]["expression"]
    g = int(row["answer"])
    signs = {k: str(g).replace("-", c) for k, c in (("M", "\u2212"), ("D", "\u2013"), ("F", "\uff0d"))}
    return template.format(E=e, T=e.replace(" ", ""), Q=row["question"], G=g, G1=g + 1, Gm=g - 1, W=in_words(g),
                           **signs)


def sample(text: str, row: dict) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)


GRADERS = {
    "answer": lambda s: REWARD_FNS.get("answer")(s),
    "answer+fallback": lambda s: REWARD_FNS.get("answer")(s, fallback="last_number"),
    "reasoning_gym": lambda s: REWARD_FNS.get("reasoning_gym")(s),
    "reasoning_gym+fallback": lambda s: REWARD_FNS.get("reasoning_gym")(s, fallback="last_number"),
}


@pytest.mark.parametrize("grader", list(GRADERS))
@pytest.mark.parametrize("row_key", list(ROWS))
@pytest.mark.parametrize("label,template", ATTEMPTS, ids=[a[0] for a in ATTEMPTS])
def test_gaming_attempt_scores_zero(grader, row_key, label, template):
    row = ROWS[row_key]
    text = fill(template, row)
    assert GRADERS[grader](sample(text, row)) == 0.0, (label, text, row["answer"])


@pytest.mark.parametrize("grader", list(GRADERS))
@pytest.mark.parametrize("row_key", list(ROWS))
@pytest.mark.parametrize("label,template", CORRECT, ids=[a[0] for a in CORRECT])
def test_correct_forms_score_one(grader, row_key, label, template):
    row = ROWS[row_key]
    text = fill(template, row)
    assert GRADERS[grader](sample(text, row)) == 1.0, (label, text, row["answer"])


@pytest.mark.parametrize("row_key", list(ROWS))
@pytest.mark.parametrize("label,template", CORRECT_FALLBACK, ids=[a[0] for a in CORRECT_FALLBACK])
def test_correct_without_marker_needs_the_fallback(row_key, label, template):
    row = ROWS[row_key]
    s = sample(fill(template, row), row)
    assert GRADERS["answer+fallback"](s) == 1.0 and GRADERS["reasoning_gym+fallback"](s) == 1.0
    assert GRADERS["answer"](s) == 0.0 and GRADERS["reasoning_gym"](s) == 0.0


# Hand-made rows: the cases named in the bug report and the forms the rules decide.

def row(question: str, answer: str) -> dict:
    return {"question": question, "answer": answer}


@pytest.mark.parametrize("text,question,gold", [
    ("Answer: 1 + 2", "Calculate 1 + 2.", "3"),
    ("Answer: 6/2", "Calculate 6 / 2.", "3"),
    ("Answer: 6 / 2", "What is 6 divided by 2?", "3"),
    ("Answer: $\\frac{6}{2}$", "Calculate 6 / 2.", "3"),
    ("Answer: $8 + 2 - 7$", "Calculate 8 + 2 - 7.", "3"),
    ("Answer: 8 + 2 - 7", "State the final answer to the following arithmetic problem: 8 + 2 - 7 =", "3"),
    ("\\boxed{8+2-7}", "Calculate 8 + 2 - 7.", "3"),
    ("Answer: 3 + 0", "Calculate 1 + 2.", "3"),
    ("Answer: 3*1", "Calculate 1 + 2.", "3"),
    ("Answer: 3/4", "What is 3/4 as a decimal?", "0.75"),  # the question's own fraction
    ("Answer: 6/8", "Write 0.75 as a fraction.", "3/4"),  # unreduced
    ("Answer: 0.75", "Simplify 6/8.", "3/4"),  # a decimal where the task asks for the simplified fraction
    ("Answer: 0.75", "Write 0.75 as a fraction.", "3/4"),
    ("Answer: 672484000", "Calculate 672484416 + 0.", "672484416"),  # close is not equal
    ("Answer: 1000001", "Calculate 999999 + 1.", "1000000"),  # an off-by-one on a 7-digit sum
    ("Answer: 672484000\nAnswer: 672484416", "Calculate 672484416 + 0.", "672484416"),  # conflicting
    ("Answer: 0.3", "Calculate 0.11 * 3.", "0.33"),  # below the gold's precision
    ("Answer: 16\u00b2", "Calculate 4 * 4.", "16"), ("Answer: 16\u00bd", "Calculate 4 * 4.", "16"),
    ("Answer: 16 thousand", "Calculate 4 * 4.", "16"), ("Answer: 16 is wrong", "Calculate 4 * 4.", "16"),
    ("Answer: 16\nActually, it is 17.", "Calculate 4 * 4.", "16"), ("Answer: ~~16~~", "Calculate 4 * 4.", "16"),
    ("Answer: 17\n**Answer**: 16", "Calculate 4 * 4.", "16"), ("Answer: 17\nAnswer\uff1a16", "Calculate 4 * 4.", "16"),
    ("so 4 * 4 = 16\u00b2.", "Calculate 4 * 4.", "16"), ("so it is 16 thousand.", "Calculate 4 * 4.", "16"),
    ("Answer: 1,2", "Calculate 10 + 2.", "12"),  # a list, not a thousands separator
    ("Answer: 1 2", "Calculate 10 + 2.", "12"),
    ("Answer: 3 or 4", "Calculate 1 + 2.", "3"),
    ("Answer: 3, 4", "Calculate 1 + 2.", "3"),
    ("Answer: 3 (because 1 + 2 = 3)", "Calculate 1 + 2.", "3"),
    ("Answer: 3x", "Calculate 1 + 2.", "3"),
    ("Answer: -3", "Calculate 1 + 2.", "3"),
    ("Answer: 1e3", "Calculate 999 + 1.", "1000"),
    ("Calculate 0 + 5.", "Calculate 0 + 5.", "5"),  # copying the question: its last operand is the gold
    ("0 + 5", "Calculate 0 + 5.", "5"),
    ("I can't decide: 4, 5, 6", "Calculate 0 + 5.", "5"),
])
def test_hand_made_gaming_scores_zero(text, question, gold):
    s = sample(text, row(question, gold))
    assert REWARD_FNS.get("answer")(s) == 0.0
    assert REWARD_FNS.get("answer")(s, fallback="last_number") == 0.0


@pytest.mark.parametrize("text,question,gold", [
    ("Answer: 3", "Calculate 1 + 2.", "3"),
    ("Answer: 3.0", "Calculate 1 + 2.", "3"),
    ("Answer: $3$", "Calculate 1 + 2.", "3"),
    ("\\boxed{3}", "Calculate 1 + 2.", "3"),
    ("Answer: -3", "Calculate 1 - 4.", "-3"),
    ("Answer: −3", "Calculate 1 - 4.", "-3"),  # unicode minus
    ("Answer: 1,234", "Calculate 1000 + 234.", "1234"),
    ("Answer: 1 234", "Calculate 1000 + 234.", "1234"),
    ("Answer: $1{,}234$", "Calculate 1000 + 234.", "1234"),
    ("Answer: 1234", "Calculate 1000 + 234.", "1,234"),
    ("Answer: 5 apples", "Tom has 2 apples and buys 3. How many apples?", "5"),
    ("Answer: $5", "A pen costs $2 and a book $3. Total?", "5"),
    ("Answer: 5.", "Calculate 2 + 3.", "5"),
    ("Answer: 3/4", "Write 0.75 as a fraction.", "0.75"),
    ("Answer: 3/4", "Simplify 6/8.", "3/4"),
    ("Answer: 0.75", "What share of 8 is 6?", "3/4"),  # no fraction asked for: the value counts
    ("Answer: \\frac{3}{4}", "Simplify 6/8.", "3/4"),
    ("Answer: 3 / 4", "Simplify 6/8.", "\\frac{3}{4}"),
    ("Answer: 6/2", "Write six halves as a fraction.", "6/2"),  # identical to the gold text
    ("Answer: x = 3", "Solve 2x = 6.", "3"),
    ("Answer: 1 + x^2", "Expand (x+1)^2 - 2x.", "x^2+1"),
    ("Answer: $x^2 + 1$", "Expand (x+1)^2 - 2x.", "x^2+1"),
    ("Answer: paris", "What is the capital of France?", "Paris"),
    ("Answer: \\sqrt{2}", "What is the square root of 2?", "\\sqrt{2}"),
    ("Answer: 672484416", "Calculate 672484416 + 0.", "672484416"),
    ("Answer: 0.333", "Calculate 0.111 * 3.", "0.33"),  # rounds to the gold's last digit
    ("Answer: \u201328", "Calculate 2 - 30.", "-28"), ("Answer: (-28)", "Calculate 2 - 30.", "-28"),
    ("Answer: \uff0d28", "Calculate 2 - 30.", "-28"), ("Answer: <b>16</b>", "Calculate 4 * 4.", "16"),
    ("**Answer**: 16", "Calculate 4 * 4.", "16"), ("Answer\uff1a16", "Calculate 4 * 4.", "16"),
    ("Answer: ~~17~~ 16", "Calculate 4 * 4.", "16"), ("Answer: 16 km/h", "A car goes 4 km/h, 4 times.", "16"),
    ("Answer: 16\nThis is 4 times 4.", "Calculate 4 * 4.", "16"),
    ("Answer: 2.79e+05", "Compute 527.9^2 in scientific notation (e.g. 1.23e+4).", "2.79e+05"),
])
def test_correct_answers_score_one(text, question, gold):
    assert REWARD_FNS.get("answer")(sample(text, row(question, gold))) == 1.0


def test_symbolic_gold_never_accepts_the_question_restated():
    q = "Expand (x+1)^2 - 2x."
    assert answers_match("x^2+1", "x^2+1", q)
    assert answers_match("(x+1)^2 - 2x", "x^2+1")  # math-verify alone: equal
    assert not answers_match("(x+1)^2 - 2x", "x^2+1", q)  # ... but it is the question
    assert not answers_match("x^2+1 or x^2-1", "x^2+1", q)
    assert REWARD_FNS.get("answer")(sample("Answer: (x+1)^2 - 2x", row(q, "x^2+1"))) == 0.0
    assert REWARD_FNS.get("answer")(sample("Answer: Paris or London", row("Capital of France?", "Paris"))) == 0.0


def test_conflicting_markers_do_not_fall_back_to_the_last_number():
    text = "Answer: 4\nAnswer: 3"
    assert final_answer(text, fallback="last_number") is None
    assert REWARD_FNS.get("answer")(sample(text, row("Calculate 1 + 2.", "3")), fallback="last_number") == 0.0


def test_reasoning_gym_partial_credit_is_opt_in_for_numbers():
    r = ROWS["basic_arithmetic:pos"]
    gold = r["answer"]
    s = sample(f"Answer: {gold}{gold}", r)
    assert REWARD_FNS.get("reasoning_gym")(s) == 0.0
    assert 0.0 < REWARD_FNS.get("reasoning_gym")(s, partial_credit=True) < 1.0
    # an expression stays 0 even with partial credit: it is not a number
    s = sample(f"Answer: {gold} + 0", r)
    assert REWARD_FNS.get("reasoning_gym")(s, partial_credit=True) == 0.0


def test_reasoning_gym_thousands_and_text_answers():
    big = next(r for r in rg_rows("chain_sum", dict(min_terms=2, max_terms=2, min_digits=4, max_digits=4))
               if int(r["answer"]) >= 1000)
    assert REWARD_FNS.get("reasoning_gym")(sample(f"Answer: {int(big['answer']):,}", big)) == 1.0
    word = rg_rows("spell_backward", {}, n=1)[0]
    assert REWARD_FNS.get("reasoning_gym")(sample(f"Answer: {word['answer']}", word)) == 1.0
    assert REWARD_FNS.get("reasoning_gym")(sample("Answer: xyz", word)) == 0.0


# The gaming signal: rewarded replies whose answer restates the question.

@pytest.mark.parametrize("text,question,flagged", [
    ("Answer: 8 + 2 - 7", "Calculate 8 + 2 - 7.", True),  # operator between numbers
    ("Answer: $\\boxed{8+2-7}$", "Calculate 8 + 2 - 7.", True),
    ("\\boxed{3 \\times 1}", "Calculate 1 + 2.", True),
    ("Answer: 8 and 7", "Calculate 8 + 2 - 7.", True),  # two of the question's numbers
    ("Answer: Calculate the sum", "Calculate the sum of 1 and 2.", True),  # a run copied from the question
    ("Answer: 3", "Calculate 8 + 2 - 7.", False),
    ("Answer: -4", "Calculate 5 - 9.", False),
    ("Answer: 1,234", "Calculate 1000 + 234.", False),
    ("Answer: 3/4", "Write 0.75 as a fraction.", False),  # a reduced fraction is a number
    ("Answer: 3/4", "What is 3/4 as a decimal?", True),
    ("8 + 2 - 7 = 3", "Calculate 8 + 2 - 7.", False),  # no answer marker: nothing extracted
])
def test_restated_question(text, question, flagged):
    from lmrl.rewards.gaming import restated_question

    assert restated_question(sample(text, row(question, "3"))) is flagged


def test_gaming_share_counts_rewarded_samples_only():
    from lmrl.rewards.gaming import GAMING_METRIC, gaming_metrics, gaming_share

    q = "Calculate 8 + 2 - 7."

    def scored(text, reward, excluded=None):
        s = sample(text, row(q, "3"))
        s.reward, s.rewards, s.excluded = reward, {"answer": reward}, excluded
        return s

    samples = [scored("Answer: 8 + 2 - 7", 1.0), scored("Answer: 3", 1.0), scored("Answer: 3", 1.0),
               scored("Answer: 2 + 1", 1.0), scored("Answer: 8 + 2", 0.0),  # unrewarded: not counted
               scored("Answer: 8 - 7 + 2", 1.0, excluded="reward answer: timeout")]  # excluded: not counted
    assert gaming_share(samples) == pytest.approx(0.5)
    assert gaming_share(samples, accuracy_component="answer") == pytest.approx(0.5)
    half = scored("Answer: 8+2-7", 0.5)  # partly rewarded: counts for reward > 0, not for accuracy
    assert gaming_share(samples + [half]) == pytest.approx(3 / 5)
    assert gaming_share(samples + [half], accuracy_component="answer") == pytest.approx(0.5)
    assert gaming_share([scored("Answer: 8 + 2", 0.0)]) == 0.0 and gaming_share([]) == 0.0
    assert gaming_metrics(samples) == {GAMING_METRIC: pytest.approx(0.5)}
    assert GAMING_METRIC == "gaming/restated_question"


def test_old_grader_gaming_is_flagged_and_new_grader_pays_nothing_for_it():
    """What the report card shows: under the new grader a restating reply is not rewarded, so it
    never enters the share; the signal is for rewards that still pay for it."""
    from lmrl.rewards.gaming import restated_question

    for key, r in ROWS.items():
        s = sample(fill("Answer: {E}", r), r)
        assert restated_question(s), key
        assert REWARD_FNS.get("answer")(s) == 0.0
        assert not restated_question(sample(fill("Answer: {G}", r), r)), key


def test_the_loop_reports_the_gaming_share_of_rewarded_answers():
    """The step metrics (and so the progress bar and the report) carry gaming/restated_question."""
    from lmrl.loops.collect import rollout_metrics
    from lmrl.types import Group, Sample

    row = {"question": "What is 3 + 4?", "answer": "7"}

    def sample(text, correct):
        return Sample([1], [2, 3], [-0.1, -0.2], rewards={"answer": float(correct)}, reward=float(correct),
                      text=text, row=row)

    group = Group("u", row, [sample("Answer: 3 + 4", True), sample("Answer: 7", True), sample("Answer: 8", False)])
    assert rollout_metrics([group], "answer")["gaming/restated_question"] == 0.5


def test_a_math_verify_failure_is_said_once_and_grades_as_no_match(monkeypatch, caplog):
    import math_verify

    from lmrl.rewards import answers

    def broken(*_, **__):
        raise RecursionError("exotic input")

    monkeypatch.setattr(math_verify, "parse", broken)
    monkeypatch.setattr(answers, "_MATH_VERIFY_FAILURES", set())
    with caplog.at_level("WARNING", logger="lmrl.rewards.answers"):
        assert answers._math_verify("x^2", "y") is False
        assert answers._math_verify("x^3", "y") is False
    said = [r.getMessage() for r in caplog.records if "math-verify failed" in r.getMessage()]
    assert len(said) == 1 and "RecursionError: exotic input" in said[0]
