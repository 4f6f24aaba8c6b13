"""Simulated-user environments: SalesSim decision alignment and ProMed Shapley rewards by hand (specs
§1.18, §1.12), the shipped catalogue, personas and cases, and both environments driven by a tiny model."""
from __future__ import annotations

import random

import pytest

from conftest import make_tokenizer
from lmrl.config import TaskConfig
from lmrl.envs.doctor import (DoctorEnv, case_row, doctor_task, doctor_turn_rewards, is_correct, revealed_facts,
                              shapley_values, shapley_weights, well_formatted)
from lmrl.envs.doctor_cases import CASES
from lmrl.envs.sales import (CATALOGUE, SalesEnv, decision_alignment, make_persona, names_match, parse_decision,
                             sales_task)
from lmrl.envs.simulated_user import LocalUser, SimulatedUser, make_user, mentioned_names, user_view
from lmrl.models import tiny_llama
from lmrl.rewards.judge_client import JudgeClient


@pytest.fixture(scope="module")
def tiny():
    """The tiny shopper, with room for the sales prompt (one token per character, over 512: the default)."""
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    model.config.max_position_embeddings = 4096
    return model, tok


class Scripted:
    """A user that says its lines in order (any object with chat() is a user)."""

    def __init__(self, *lines):
        self.lines, self.seen = list(lines), []

    def chat(self, messages, max_tokens=None, temperature=None, seed=None):
        self.seen.append(messages)
        return self.lines.pop(0)


# ---------------------------------------------------------------- SalesSim decision alignment

def test_decision_alignment_spec_case():
    recommended, acceptable = {"Orbit Watch", "Tempo Watch"}, {"Tempo Watch"}
    assert decision_alignment(recommended, acceptable, "Tempo Watch", turns=3) == 1.0  # bought Y
    assert decision_alignment(recommended, acceptable, "Orbit Watch", turns=3) == 0.0  # bought X
    assert decision_alignment(recommended, acceptable, None, turns=3) == 0.0  # left though Y was offered
    assert decision_alignment({"X", "Y"}, {"Y"}, "Y", 2) == 1.0 and decision_alignment({"X", "Y"}, {"Y"}, "X", 2) == 0.0


def test_decision_alignment_premature_nothing_acceptable_and_fuzzy_names():
    assert decision_alignment({"Tempo Watch"}, {"Tempo Watch"}, "Tempo Watch", turns=1) == 0.0  # one turn: never
    assert decision_alignment({"Orbit Watch"}, {"Tempo Watch"}, None, turns=2) == 1.0  # nothing acceptable offered
    assert decision_alignment(set(), set(), None, turns=2) == 1.0
    assert decision_alignment(set(), {"Tempo Watch"}, None, turns=2) == 1.0
    assert decision_alignment({"Tempo Watch"}, {"Tempo Watch"}, "the tempo watch, please", 2) == 1.0  # contains
    assert decision_alignment({"Tempo Watch"}, {"Tempo Watch"}, "TEMPO", 2) == 1.0  # contained
    assert decision_alignment({"Orbit Watch"}, {"Tempo Watch"}, "Tempo Watch", 2) == 0.0  # never recommended
    assert decision_alignment({"Tempo Watch"}, set(), "Tempo Watch", 2) == 0.0  # nothing was acceptable
    assert names_match("Forge-16", "forge 16") and not names_match("", "Forge 16")


def test_decisions_recommendations_and_the_catalogue():
    assert parse_decision("Great, thanks! BUY: Tempo Watch.") == ("buy", "Tempo Watch")
    assert parse_decision("No thanks.\nLEAVE") == ("leave", None)
    assert parse_decision("I'll leave it for now, can I buy: later?") is None  # lower case is talk, not a decision
    assert parse_decision("BUY:") == ("leave", None)
    names = [p["name"] for p in CATALOGUE]
    assert mentioned_names(["Try the tempo watch or Orbit Watch!", "Forge 160 is not real"], names) == \
        ["Orbit Watch", "Tempo Watch"]
    assert not [(a, b) for a in names for b in names if a != b and names_match(a, b)]


def test_personas_are_seeded_and_their_acceptable_products_fit_them():
    assert make_persona(7) == make_persona(7)
    personas = [make_persona(s) for s in range(200)]
    assert len({p["category"] for p in personas}) == 3
    assert any(not p["acceptable"] for p in personas) and any(p["acceptable"] for p in personas)
    by_name = {p["name"]: p for p in CATALOGUE}
    for p in personas:
        fits = [n for n, item in by_name.items() if item["category"] == p["category"] and item["price"] <= p["budget"]
                and p["must_have"] in item["features"]]
        assert p["acceptable"] == fits
    data = sales_task(TaskConfig(name="sales", num_train=5, num_eval=2, seed=1))
    assert len(data.train) == 5 and len(data.eval) == 2 and data.train[0]["persona"] == make_persona(1_000_003)


# ---------------------------------------------------------------- ProMed Shapley information gain

def test_promed_spec_hand_case():
    w = shapley_weights([0.4, 0.0, -0.2], temperature=2.0)
    assert [round(x, 3) for x in w] == [0.391, 0.320, 0.289]
    g = w[0] + w[2]
    assert round(g, 3) == 0.680
    reward = doctor_turn_rewards([("question", g, False)], correct=True, alpha=2, beta=1)[0]
    assert reward == pytest.approx(2.04, abs=5e-3)
    assert doctor_turn_rewards([("question", g, True), ("answer", 0.0, True)], correct=False) == \
        pytest.approx([2 * g + 1, 1.0])
    assert doctor_turn_rewards([("question", 0.5, False), ("answer", 0.0, True)], correct=True) == [1.5, 4.0]
    assert shapley_weights([0.3]) == [1.0] and shapley_weights([0.2, 0.2, 0.2]) == pytest.approx([1 / 3] * 3)


def test_shapley_of_an_additive_game_is_exact_and_stops_after_the_minimum():
    a = [0.5, -0.2, 0.3, 0.1]  # no proper subset sums to v(full): every permutation runs to the end
    calls = []

    def v(subset):
        calls.append(subset)
        return sum(a[i] for i in subset)

    phi, permutations = shapley_values(4, v, rng=random.Random(1))
    assert phi == pytest.approx(a, abs=1e-12)
    assert permutations == 3  # Δφ = 0 from the second permutation; the rule waits for 3
    assert len(calls) == len(set(calls)) <= 2 ** 4  # each subset scored once


class FixedOrder:
    def shuffle(self, items):
        items.sort()


def test_a_permutation_stops_once_it_reaches_the_full_value():
    calls = []

    def v(subset):  # fact 0 alone is worth everything
        calls.append(subset)
        return float(0 in subset)

    phi, permutations = shapley_values(4, v, max_permutations=1, rng=FixedOrder())
    assert calls == [frozenset(), frozenset(range(4)), frozenset({0})]  # stopped after fact 0
    assert (phi, permutations) == ([1.0, 0.0, 0.0, 0.0], 1)


def test_sampling_goes_on_until_the_estimates_settle():
    def majority(subset):  # needs two of three: every order credits a different fact
        return float(len(subset) >= 2)

    phi, permutations = shapley_values(3, majority, max_permutations=50, rng=random.Random(0))
    assert 3 < permutations <= 50
    _, capped = shapley_values(3, majority, max_permutations=4, rng=random.Random(0))
    assert capped == 4


def test_questions_reveal_keyword_facts_once_and_a_few_at_a_time():
    keywords = [["fever", "temperature"], ["ache", "pain"], ["cough"]]
    assert revealed_facts("question: any fevers?", keywords, set(), 2) == [0]  # a keyword starts a word
    assert revealed_facts("question: Temperature, pain or coughing?", keywords, set(), 2) == [0, 1]  # at most 2
    assert revealed_facts("question: Temperature, pain or coughing?", keywords, {0, 1}, 2) == [2]  # told before
    assert revealed_facts("question: anything else?", keywords, set(), 2) == []
    assert well_formatted("question: any fever?", "question") and not well_formatted("so, question: x", "question")
    assert not well_formatted("question: fever? answer: flu", "question") and well_formatted(" Answer: flu", "answer")
    options = ["influenza", "migraine", "common cold"]
    assert is_correct(" Influenza.", "influenza", options)
    assert not is_correct("influenza or migraine", "influenza", options)
    assert not is_correct("a cold", "influenza", options)


def test_the_shipped_cases():
    assert 30 <= len(CASES) <= 40
    diagnoses = [c[0] for c in CASES]
    assert len(set(diagnoses)) == len(diagnoses)
    assert not [(a, b) for a in diagnoses for b in diagnoses if a != b and mentioned_names([a], [b])]
    for i, case in enumerate(CASES):
        row = case_row(i, case)
        assert row["answer"] in row["options"] and len(row["options"]) == 4 and len(row["facts"]) >= 3
        for j, kws in enumerate(row["keywords"]):  # each fact can be asked for by its first keyword
            assert j in revealed_facts(f"question: {kws[0]}?", row["keywords"], set(), len(kws) + 9)
    data = doctor_task(TaskConfig(name="doctor", num_train=100, num_eval=4))
    assert len(data.eval) == 4 and len(data.train) == len(CASES) - 4


# ---------------------------------------------------------------- users and environments

def test_users_from_specs_and_the_role_swapped_view(tiny):
    scripted = Scripted("hi")
    assert make_user(scripted) is scripted
    assert isinstance(make_user(tiny), LocalUser)
    client = make_user({"base_url": "http://127.0.0.1:9/v1", "model": "sim", "retries": 0})
    assert isinstance(client, JudgeClient) and client.model == "sim"
    with pytest.raises(TypeError):
        make_user(42)
    view = user_view("persona", [{"role": "system", "content": "policy rules"}, {"role": "user", "content": "Hi."},
                                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Price?"},
                                 {"role": "assistant", "content": "$49."}])
    assert view == [{"role": "system", "content": "persona\n\nYou opened the conversation by saying: Hi."},
                    {"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Price?"},
                    {"role": "user", "content": "$49."}]
    local = SimulatedUser.build(tiny, max_tokens=5)
    said = local.reply("persona", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}], seed=3)
    assert said == local.reply("persona", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],
                               seed=3)  # seeded


def test_sales_env_with_a_tiny_model_shopper_ends_at_max_turns(tiny):
    env = SalesEnv(user=tiny, max_turns=2, user_max_tokens=6)
    persona = {**make_persona(0), "acceptable": ["Tempo Watch"]}
    messages, state = env.reset({"persona": persona}, seed=4)
    assert [m["role"] for m in messages] == ["system", "user"] and "Tempo Watch" in messages[0]["content"]
    assert "Tempo Watch" not in messages[1]["content"]  # the acceptable list stays hidden
    first = env.step("I recommend the Tempo Watch.", state)
    assert not first.done and first.observation[0]["role"] == "user" and first.reward == 0.0
    last = env.step("Or the Orbit Watch.", state)  # the tiny model writes no upper case: it never decides
    assert last.done and last.reward == 0.0  # left although an acceptable product was offered
    assert last.info["metrics"]["env/recommended"] == 2.0 and last.info["metrics"]["env/decided"] == 0.0


def test_sales_env_rewards_the_shoppers_decision():
    env = SalesEnv(user=Scripted("Tell me more.", "BUY: Tempo Watch"), max_turns=4)
    _, state = env.reset({"persona": {**make_persona(0), "acceptable": ["Tempo Watch"]}}, seed=0)
    assert not env.step("What do you need it for?", state).done
    step = env.step("The Tempo Watch is water resistant.", state)
    assert step.done and step.reward == 1.0 and step.info["metrics"]["env/bought_acceptable"] == 1.0
    shopper_view = env.user.client.seen[-1]
    assert shopper_view[0]["role"] == "system" and "Tempo Watch" in shopper_view[0]["content"]
    assert [m["role"] for m in shopper_view[1:]] == ["user", "assistant", "user"]
    env = SalesEnv(user=Scripted("LEAVE"), max_turns=4)
    _, state = env.reset({"persona": make_persona(0)}, seed=0)
    assert env.step("Hello!", state).reward == 0.0  # decided after one turn: premature
    with pytest.raises(ValueError, match="judge"):
        SalesEnv(user=Scripted(), w_quality=0.5)


def test_sales_quality_judge_adds_its_weighted_rating():
    env = SalesEnv(user=Scripted("Hmm.", "LEAVE"), w_da=1.0, w_quality=0.5, judge={"base_url": "http://127.0.0.1:9/v1"})
    env.judge = Scripted("The salesperson was clear. Score: 7")  # a judge is any chat client
    _, state = env.reset({"persona": {**make_persona(0), "acceptable": []}}, seed=0)
    env.step("Hello, what do you need?", state)
    step = env.step("Sorry, nothing fits.", state)
    assert step.reward == pytest.approx(1.0 + 0.5 * 6 / 9) and step.info["metrics"]["env/quality"] == pytest.approx(6 / 9)
    assert "Salesperson: Sorry, nothing fits." in env.judge.seen[0][0]["content"]


def test_doctor_env_with_a_tiny_scorer_and_patient(tiny):
    row = case_row(0, CASES[0])  # influenza: fever, aches, cough, sudden onset
    calls = []
    model, tok = tiny
    from lmrl.envs.doctor import AnswerScorer
    scorer = AnswerScorer(model, tok)

    def counted(prompt, answer):
        calls.append(prompt)
        return scorer(prompt, answer)

    env = DoctorEnv(scorer=counted, user=tiny, user_max_tokens=6, max_turns=4)
    messages, state = env.reset(row, seed=1)
    assert "influenza" in messages[0]["content"] and messages[1]["content"] == row["question"]
    assert 2 <= len(calls) <= 2 ** 4 and sum(state["w"]) == pytest.approx(1.0)
    env.reset(row, seed=2)
    assert len(calls) <= 2 ** 4 and len(env._phi) == 1  # φ once per case
    w = state["w"]
    step = env.step("question: do you have a fever or a cough?", state)
    assert not step.done and step.reward == pytest.approx(2 * (w[0] + w[2]) + 1)
    assert state["told"] == {0, 2} and step.observation[0]["role"] == "user"
    step = env.step("question: any fever?", state)  # told already: no gain, format credit only
    assert step.reward == pytest.approx(1.0)
    step = env.step("answer: influenza", state)
    assert step.done and step.info["turn_rewards"] == pytest.approx([3 * (w[0] + w[2]) + 1, 1.0, 4.0])
    assert step.info["metrics"]["env/correct"] == 1.0 and step.info["metrics"]["env/facts_revealed"] == 0.5


def test_doctor_env_rule_patient_and_running_out_of_turns():
    env = DoctorEnv(scorer=lambda prompt, answer: float(prompt.count(".")), max_turns=2)
    row = case_row(1, CASES[1])  # migraine
    _, state = env.reset(row, seed=0)
    step = env.step("question: does light bother you?", state)
    assert step.observation[0]["content"] == "Bright light makes it worse."
    step = env.step("question: how long does it last?", state)  # the last turn, and no answer
    assert step.done and step.info["metrics"]["env/answered"] == 0.0
    w = state["w"]
    assert step.info["turn_rewards"] == pytest.approx([2 * w[1] + 1, 2 * w[3] + 1])


def test_the_sale_weight_pays_only_for_an_acceptable_purchase():
    from lmrl.envs.sales import SalesEnv

    class Shopper:  # a scripted shopper: buys what the persona accepts on its second reply
        def __init__(self):
            self.calls = 0

        def chat(self, messages, **_):
            self.calls += 1
            return "Hmm." if self.calls == 1 else "BUY: Aria Buds"

    from lmrl.envs.sales import make_persona

    persona = {**make_persona(0), "category": "headphones", "budget": 100, "must_have": "wireless",
               "acceptable": ["Aria Buds"]}
    env = SalesEnv(user=Shopper(), w_sale=1.0)
    _, state = env.reset({"persona": persona}, seed=0)
    assert env.step("Hello!", state).reward == 0.0
    assert env.step("The Aria Buds are wireless and $59.", state).reward == 2.0  # aligned (1) + a fitting sale (1)


def test_shopper_fidelity_is_usergrpos_reward_of_the_episode_outcome():
    from types import SimpleNamespace

    from lmrl.envs.sales import shopper_fidelity

    # specs tasks_and_roles §C1: recommended {X, Y}, acceptable {Y}, bought Y → DA 1; Q = 0.7, O = 0 → r = 1.7
    assert decision_alignment({"X", "Y"}, {"Y"}, "Y", 3) == 1.0
    row = {"outcome": {"aligned": 1.0, "quality": 0.7, "over_disclosure": 0.0, "turns": 3}}
    assert shopper_fidelity(SimpleNamespace(row=row), w_da=1.0, w_q=1.0, w_o=1.0) == pytest.approx(1.7)
    row["outcome"]["over_disclosure"] = 2 / 3
    assert shopper_fidelity(SimpleNamespace(row=row), w_da=1.0, w_q=1.0, w_o=0.5) == pytest.approx(1.7 - 1 / 3)
    assert shopper_fidelity(SimpleNamespace(row={})) is None  # a turn of an episode that never ended
    with pytest.raises(ValueError, match="judge"):
        shopper_fidelity(SimpleNamespace(row={"outcome": {**row["outcome"], "quality": None}}), w_q=1.0)


def test_over_disclosure_counts_the_criteria_the_first_reply_states():
    from lmrl.envs.sales import over_disclosure

    persona = {"category": "smartwatch", "budget": 139, "must_have": "water resistant"}
    assert over_disclosure("Something nice, please.", persona) == 0.0
    assert over_disclosure("A smartwatch under $139 that is water-resistant.", persona) == 1.0
    assert over_disclosure("My budget is 139.", persona) == pytest.approx(1 / 3)


def test_the_sales_env_hands_the_shopper_role_its_episode_state_with_the_outcome():
    class Recording(Scripted):
        def chat(self, messages, max_tokens=None, temperature=None, seed=None, row=None, group=None):
            self.rows.append((row, group))
            return super().chat(messages)

    env = SalesEnv(user=Scripted(), max_turns=2)
    env.user.client = user = Recording("Tell me more.", "LEAVE")
    user.rows = []
    row = sales_task(TaskConfig(name="sales", num_train=1, num_eval=0)).train[0]
    _, state = env.reset(row, seed=3)
    assert env.step("Hello! What do you need?", state).done is False
    step = env.step("We have the Tempo Watch.", state)
    assert step.done and [g for _, g in user.rows] == [row["uid"]] * 2 and all(r is state for r, _ in user.rows)
    assert state["outcome"]["turns"] == 2 and state["outcome"]["aligned"] == step.info["metrics"]["env/aligned"]


def test_an_environments_first_exception_of_a_kind_is_printed_with_its_traceback(capsys):
    from lmrl.envs.episodes import StepPool

    def broken():
        raise RuntimeError("the shopper's model failed")

    pool = StepPool(2, 5.0)
    results = pool.run([broken, broken, lambda: 1])
    assert [p for _, p in results][:2] == ["RuntimeError: the shopper's model failed"] * 2 and results[2] == (1, None)
    err = capsys.readouterr().err
    assert err.count("the shopper's model failed") == 2 and "Traceback" in err and "in broken" in err  # once: message + trace
    pool.run([broken])
    assert "failed" not in capsys.readouterr().err
