"""No false negatives on the shipped tasks: the generator's own gold answer, in every form its question
asks for, scores 1 on 300 generated rows of each reasoning-gym dataset a recipe uses (and of the ones
the docs name); the forms the question rules out score 0.

The datasets come from the recipes themselves (every shipped recipe whose task is `reasoning_gym`, with
its generator settings), plus chain_sum (README), and fraction_simplification and power_function at
their curricula's first level and their defaults, where a terminating fraction and e-notation once scored 0.
"""
from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from lmrl.pipeline_config import PipelineConfig
from lmrl.loading import load_recipe
from lmrl.recipe_files import RECIPES_DIR
from lmrl.rewards import REWARD_FNS
from lmrl.types import Sample

reasoning_gym = pytest.importorskip("reasoning_gym")

ROWS = 300


def recipe_datasets() -> dict[str, tuple[str, dict]]:
    """One entry per distinct (dataset, settings) among the recipes whose task is reasoning_gym."""
    users: dict[str, list[str]] = {}
    settings: dict[str, tuple[str, dict]] = {}
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        loaded = load_recipe(path.stem, [])
        for task in [s.config.task for s in loaded.stages] if isinstance(loaded, PipelineConfig) else [loaded.task]:
            if task.name != "reasoning_gym":
                continue
            key = f"{task.dataset}{sorted(task.params.items())}"
            users.setdefault(key, []).append(path.stem)
            settings[key] = (task.dataset, dict(task.params))
    label = {k: "quickstart" if "quickstart" in names else names[0] for k, names in users.items()}
    return {f"{settings[k][0]} as in {label[k]}": settings[k] for k in settings}


def curriculum_first_level(name: str) -> dict:
    from reasoning_gym.factory import create_curriculum

    config = create_curriculum(name).generate_configuration({})
    return {k: v for k, v in vars(config).items() if k not in ("seed", "size")}


DATASETS = {**recipe_datasets(),
            "chain_sum (README)": ("chain_sum", {"min_terms": 2}),
            "fraction_simplification (first level)": ("fraction_simplification",
                                                      curriculum_first_level("fraction_simplification")),
            "power_function (first level)": ("power_function", curriculum_first_level("power_function")),
            "fraction_simplification (defaults)": ("fraction_simplification", {}),
            "power_function (defaults)": ("power_function", {})}


def generated_rows(dataset: str, params: dict) -> list[dict]:
    ds = reasoning_gym.create_dataset(dataset, size=ROWS, seed=0, **params)
    return [{"question": e["question"], "answer": str(e["answer"]), "entry": e} for e in ds]


def sample(text: str, row: dict) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)


ANSWER = ("answer", "answer+fallback", "reasoning_gym")
GRADE = {
    "answer": lambda s: REWARD_FNS.get("answer")(s),
    "answer+fallback": lambda s: REWARD_FNS.get("answer")(s, fallback="last_number"),
    "reasoning_gym": lambda s: REWARD_FNS.get("reasoning_gym")(s),
}


def forms(row: dict) -> list[tuple[str, tuple[str, ...]]]:
    """(reply, graders that must pay it) for the gold in each form the row's question asks for."""
    entry, gold = row["entry"], row["answer"]
    name = entry["metadata"]["source_dataset"]
    out = [(f"Answer: {gold}", ANSWER)]
    if name in ("basic_arithmetic", "chain_sum"):  # "Calculate 26 - 28.": an integer
        g = int(gold)
        out += [(f"Answer: {g:,}", ANSWER), (f"Answer: {str(g).replace('-', chr(0x2212))}", ANSWER),
                (f"The result is {g}.", ("answer+fallback",))]
    elif name == "fraction_simplification":  # "Give only the simplified fraction"
        p, q = entry["metadata"]["simplified_numerator"], entry["metadata"]["simplified_denominator"]
        out += [(f"Answer: {t}", ANSWER) for t in (f"{p}/{q}", f"${p}/{q}$", f"\\frac{{{p}}}{{{q}}}",
                                                    f"$\\dfrac{{{p}}}{{{q}}}$")]
        out.append((f"\\boxed{{\\frac{{{p}}}{{{q}}}}}", ("answer", "reasoning_gym")))
    elif name == "power_function":  # "correct to 3 significant figures ... in 'e' notation (e.g., 1.23e+4)"
        exact = Decimal(gold)
        out += [(f"Answer: {exact:e}", ANSWER), (f"Answer: {exact:.2e}", ("reasoning_gym",))]
    else:
        raise AssertionError(f"no forms listed for {name}: add the forms its question asks for")
    return out


def ruled_out(row: dict) -> list[str]:
    """Replies that must score 0 under every grader: a neighbouring value, and forms the question rules out."""
    entry, gold = row["entry"], row["answer"]
    name = entry["metadata"]["source_dataset"]
    if name in ("basic_arithmetic", "chain_sum"):
        return [f"Answer: {int(gold) + 1}", f"Answer: {gold}\nAnswer: {int(gold) + 1}"]
    if name == "fraction_simplification":
        meta = entry["metadata"]
        value = Fraction(meta["simplified_numerator"], meta["simplified_denominator"])
        unreduced = [f"Answer: {meta['numerator']}/{meta['denominator']}"] if meta["factor"] > 1 else []
        decimal = [f"Answer: {Decimal(value.numerator) / Decimal(value.denominator)}"] if terminates(value) else []
        return unreduced + decimal
    exact = Decimal(gold)
    return [f"Answer: {exact * 2:.2e}"] if exact != 0 else []


@pytest.mark.parametrize("key", list(DATASETS))
def test_gold_in_every_asked_form_scores_one(key):
    dataset, params = DATASETS[key]
    failures = [(grader, text, row["answer"]) for row in generated_rows(dataset, params)
                for text, graders in forms(row) for grader in graders if GRADE[grader](sample(text, row)) != 1.0]
    assert not failures, f"{len(failures)} false negatives, e.g. {failures[:5]}"


@pytest.mark.parametrize("key", list(DATASETS))
def test_forms_the_question_rules_out_score_zero(key):
    dataset, params = DATASETS[key]
    rows = generated_rows(dataset, params)
    cases = [(text, row) for row in rows for text in ruled_out(row)]
    assert cases
    paid = [(grader, text, row["answer"]) for text, row in cases for grader in GRADE
            if GRADE[grader](sample(text, row)) != 0.0]
    assert not paid, f"{len(paid)} of {len(cases)} paid, e.g. {paid[:5]}"


def terminates(value: Fraction) -> bool:
    """A non-integer fraction that is a finite decimal (its denominator divides a power of ten)."""
    return value.denominator > 1 and 10 ** 40 % value.denominator == 0


def test_the_terminating_fractions_are_covered():
    """The decimal attack above needs rows whose simplified fraction is a terminating decimal."""
    rows = generated_rows(*DATASETS["fraction_simplification (first level)"])
    meta = [r["entry"]["metadata"] for r in rows]
    assert sum(terminates(Fraction(m["simplified_numerator"], m["simplified_denominator"])) for m in meta) >= 30
