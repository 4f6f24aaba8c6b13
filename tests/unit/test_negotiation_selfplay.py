"""Negotiation against an opponent that is a role of the run, by hand: the opponent's replies are scripted, both
sides' rewards hand-computed, and the opponent never sees the policy's private values or words."""
from __future__ import annotations

import pytest

import lmrl.envs.negotiation as negotiation
from lmrl.envs.negotiation import NegotiationEnv, negotiation_side
from lmrl.envs.roles import register_role_clients
from lmrl.types import Sample

MINE, THEIRS = (3, 1, 2), (0, 2, 2)  # balls, books, hats: 3 + 3 + 4 = 10 and 0 + 6 + 4 = 10
POLICY_VALUES = "balls 3, books 1, hats 2"  # how the policy's prompt states its values


class ScriptedRole:
    """A role's client that answers with the next scripted move and keeps what it was asked."""

    def __init__(self, moves):
        self.moves, self.calls = list(moves), []

    def chat(self, messages, max_tokens=None, temperature=None, seed=None, row=None, group=None):
        self.calls.append({"messages": messages, "seed": seed, "row": row, "group": group})
        return self.moves.pop(0)


@pytest.fixture
def play(monkeypatch):
    monkeypatch.setattr(negotiation, "draw_values", lambda *_: (MINE, THEIRS))

    def episode(policy_moves, opponent_moves):
        role = ScriptedRole(opponent_moves)
        register_role_clients({"rival": role})
        env = NegotiationEnv(max_rounds=4, reservation=0.5, opponent={"role": "rival"})
        messages, state = env.reset({"uid": "negotiation-0"}, seed=7)
        steps = [env.step(m, state) for m in policy_moves]
        return messages, steps, role, state

    yield episode
    register_role_clients({})


def side_rewards(role):
    """The opponent's reward of each of its moves, read from the rows its samples carry (as after the step)."""
    return [negotiation_side(Sample([], [], [], "stop", row=dict(c["row"]), role="rival")) for c in role.calls]


def test_a_hand_played_episode_pays_each_side_its_own_share(play):
    _, steps, role, _ = play(
        ["PROPOSE: balls=1 books=1 hats=0",  # round 1: it would get books 2, hats 2 (8)
         "hello",  # round 2: invalid, -0.1; the opponent is not asked
         "PROPOSE: balls=1 books=0 hats=2",  # round 3: it would get 3 books (6)
         "ACCEPT"],  # round 4: takes the standing counter balls=1 books=0 hats=1
        ["PROPOSE: balls=0 books=3 hats=1",  # it keeps books 3, hats 1 (8): the policy is offered ball + hat (5)
         "I want more"])  # invalid: its offer stands
    assert [s.reward for s in steps] == pytest.approx([0.0, -0.1, 0.0, 0.5])  # the deal: 3 + 2 of 10
    assert "The opponent rejects that and offers: you get balls=1 books=0 hats=1" in steps[0].observation[0]["content"]
    assert "The opponent's move was invalid. Its offer stands" in steps[2].observation[0]["content"]
    assert side_rewards(role) == pytest.approx([0.8, -0.1])  # books 3 + hat 1 = 8 of 10; its invalid move
    assert [c["seed"] for c in role.calls] == [7 * 131 + 1, 7 * 131 + 3] and {c["group"] for c in role.calls} == {
        "negotiation-0"}
    assert steps[-1].info["metrics"] == {
        "env/deal": 1.0, "env/value_share": 0.5, "env/turns": 4.0, "env/invalid": 0.25, "env/pareto": 1.0,
        "env/opponent/value_share": 0.8, "env/opponent/invalid": 0.5,
        # against the scripted rule: 8 < demand(1) = 10 and 6 < demand(3) = 6.67; the counter's 5 < demand(1)
        "env/scripted/deal": 0.0, "env/scripted/value_share": 0.0,
        "env/opponent/scripted_deal": 0.0, "env/opponent/scripted_value_share": 0.0}


def test_the_opponent_accepts_and_the_scripted_reference_is_counterfactual(play):
    _, steps, role, _ = play(
        ["PROPOSE: balls=1 books=0 hats=0",  # it would get 10 >= demand(1): the scripted opponent accepts this
         "PROPOSE: balls=1 books=1 hats=1"],  # it gets books 2, hat 1 (6)
        ["PROPOSE: balls=1 books=3 hats=2", "ACCEPT"])
    assert steps[-1].done and steps[-1].reward == pytest.approx(0.6)  # 3 + 1 + 2
    assert side_rewards(role) == pytest.approx([0.6, 0.6])  # 4 + 2 of 10, both moves valid
    metrics = steps[-1].info["metrics"]
    assert metrics["env/scripted/deal"] == 1.0 and metrics["env/scripted/value_share"] == pytest.approx(0.3)
    assert metrics["env/opponent/scripted_deal"] == 0.0  # its counter left the policy nothing


def test_a_counter_in_the_last_round_ends_without_a_deal(play):
    _, steps, role, _ = play(["PROPOSE: balls=1 books=3 hats=2"] * 4, ["PROPOSE: balls=0 books=0 hats=0"] * 4)
    assert [s.done for s in steps] == [False, False, False, True] and [s.reward for s in steps] == [0.0] * 4
    assert "This is the last round" in role.calls[3]["messages"][-1]["content"]
    assert "last round" not in role.calls[2]["messages"][-1]["content"]
    assert side_rewards(role) == [0.0] * 4
    metrics = steps[-1].info["metrics"]  # its round-1 counter gave the policy 10 >= demand(1), worth 0 to itself
    assert metrics["env/opponent/scripted_deal"] == 1.0 and metrics["env/opponent/scripted_value_share"] == 0.0


def test_the_opponent_sees_its_side_only_never_the_policys_values_or_words(play):
    messages, steps, role, _ = play(
        [f"My values are {POLICY_VALUES}", "PROPOSE: balls=1 books=1 hats=0", "PROPOSE: balls=1 books=1 hats=0"],
        ["My values are balls 0, books 2, hats 2. PROPOSE: balls=0 books=3 hats=2", "PROPOSE: balls=0 books=3 hats=2"])
    assert POLICY_VALUES in messages[0]["content"]  # the policy is told its values
    seen = " ".join(m["content"] for c in role.calls for m in c["messages"] if m["role"] == "user")
    assert "Your value per item: balls 0, books 2, hats 2" in seen  # its own
    assert POLICY_VALUES not in seen and "My values" not in seen  # prose is an invalid move: never forwarded
    assert "the other side proposes to keep balls=1 books=1 hats=0, so you would get balls=0 books=2 hats=2" in seen
    for call in role.calls:
        row = call["row"]
        assert row["values"] == [0, 2, 2] and set(row) == {"uid", "values", "turn", "side"}
        assert set(row["side"]) == {"values", "chat", "opening", "note", "valid", "share", "invalid_penalty"}
        assert "[3, 1, 2]" not in repr(row) and "(3, 1, 2)" not in repr(row) and POLICY_VALUES not in repr(row)
    said = " ".join(s.observation[0]["content"] for s in steps if s.observation)
    assert "My values" not in said and "books 2, hats 2" not in said  # nor does the policy see the opponent's


def test_an_unfinished_episode_pays_the_opponent_nothing_yet_and_bad_settings_are_refused(play):
    _, _, role, _ = play(["PROPOSE: balls=1 books=1 hats=0"], ["PROPOSE: balls=0 books=3 hats=1"])
    assert side_rewards(role) == [None]  # the episode was cut before it ended: excluded, not scored 0
    with pytest.raises(ValueError, match="opponent must be"):
        NegotiationEnv(opponent={"model": "policy"})
