"""The negotiation game by hand: seeded values, strict moves, the opponent's concession rule, rewards,
delayed attribution and the exact Pareto check."""
from __future__ import annotations

import pytest

from lmrl.config import TaskConfig
from lmrl.envs.negotiation import (MoveError, NegotiationEnv, counter_offer, demand, draw_values, negotiation_task,
                                   pareto_optimal, parse_move, value_vectors)

NAMES, COUNTS = ["balls", "books", "hats"], (1, 3, 2)  # the default pool, items ordered by name
MINE, THEIRS = (3, 1, 2), (0, 2, 2)  # hand-set values: 3 + 3 + 4 = 10 and 0 + 6 + 4 = 10


def play(moves, attribution="episode"):
    """The steps of an episode with the hand-set values (4 rounds, reservation 0.5)."""
    env = NegotiationEnv(max_rounds=4, reservation=0.5, attribution=attribution)
    _, state = env.reset({}, seed=0)
    state["mine"], state["theirs"] = MINE, THEIRS
    return [env.step(m, state) for m in moves]


def test_values_are_drawn_from_the_seed_under_the_sum_constraint():
    # balls + 3 books + 2 hats = 10: books 0 -> hats 0..5 (6), books 1 -> 0..3 (4), 2 -> 0..2 (3), 3 -> 0 (1)
    assert len(value_vectors(COUNTS, 10)) == 14
    assert draw_values(COUNTS, 10, seed=0) == ((10, 0, 0), (3, 1, 2))  # 10 = 10; 3 + 3 + 4 = 10
    messages, state = NegotiationEnv().reset({}, seed=0)
    assert "Your value per item: balls 10, books 0, hats 0" in messages[0]["content"]
    assert (state["mine"], state["theirs"]) == ((10, 0, 0), (3, 1, 2))
    for seed in range(20):
        mine, theirs = draw_values(COUNTS, 10, seed)
        assert draw_values(COUNTS, 10, seed) == (mine, theirs) and mine != theirs
        assert sum(c * v for c, v in zip(COUNTS, mine)) == sum(c * v for c, v in zip(COUNTS, theirs)) == 10
        assert all(a or b for a, b in zip(mine, theirs))  # every item is worth something to someone


def test_moves_are_parsed_strictly():
    assert parse_move("PROPOSE: balls=1 books=0 hats=2", NAMES, COUNTS) == (1, 0, 2)
    assert parse_move("  propose:hats=2  books=0 balls=1 \n", NAMES, COUNTS) == (1, 0, 2)  # any order, spacing
    assert parse_move("ACCEPT", NAMES, COUNTS) is None and parse_move(" accept ", NAMES, COUNTS) is None
    for bad in ("PROPOSE: balls=1 books=0",  # an item missing
                "PROPOSE: balls=1 books=0 hats=1 hats=1",  # named twice
                "PROPOSE: balls=2 books=0 hats=0",  # more than the pool holds
                "PROPOSE: cats=1 books=0 hats=2",  # not an item
                "PROPOSE: balls=-1 books=0 hats=2", "PROPOSE balls=1 books=0 hats=2",
                "PROPOSE: balls=1 books=0 hats=2 please", "I propose balls=1 books=0 hats=2", "ACCEPT.", ""):
        with pytest.raises(MoveError):
            parse_move(bad, NAMES, COUNTS)


def test_the_opponent_concedes_linearly_and_counters_at_least_cost():
    assert [demand(t, 4, 10, 0.5) for t in (1, 2, 3, 4)] == pytest.approx([10, 25 / 3, 20 / 3, 5])
    # needing 25/3 from 2·books + 2·hats it must keep all of both: the ball (worth 0 to it) goes to the policy
    assert counter_offer(COUNTS, THEIRS, 25 / 3) == (1, 0, 0)
    # needing 20/3 it keeps 8: (books 3, hats 1) or (books 2, hats 2); both leave the policy 2 items,
    # and the first in split order keeps (balls 1, books 0, hats 1) for the policy
    assert counter_offer(COUNTS, THEIRS, 20 / 3) == (1, 0, 1)


def test_an_accepted_proposal_pays_the_share_of_the_policys_value():
    (step,) = play(["PROPOSE: balls=1 books=0 hats=0"])  # the opponent gets 6 + 4 = 10 >= its round-1 demand 10
    assert step.done and step.reward == pytest.approx(0.3)  # the ball: 3 of 10
    assert step.info["metrics"] == {"env/deal": 1.0, "env/value_share": pytest.approx(0.3), "env/turns": 1.0,
                                    "env/invalid": 0.0, "env/pareto": 1.0}


def test_rejections_counters_and_a_late_acceptance_by_hand():
    steps = play(["PROPOSE: balls=1 books=1 hats=0",  # opponent gets 4 + 4 = 8 < 10: rejected
                  "PROPOSE: balls=1 books=1 hats=0",  # 8 < 25/3: rejected
                  "PROPOSE: balls=1 books=1 hats=0"])  # 8 >= 20/3: accepted
    assert "you get balls=1 books=0 hats=0" in steps[0].observation[0]["content"]
    assert "you get balls=1 books=0 hats=1" in steps[1].observation[0]["content"]
    last = steps[2]
    assert last.done and last.reward == pytest.approx(0.4)  # 3 + 1 of 10
    # not Pareto-optimal: its counter (ball and a hat: 5 for the policy, still 8 for it) is better for the policy
    assert last.info["metrics"]["env/pareto"] == 0.0
    accepted = play(["PROPOSE: balls=1 books=1 hats=0", "PROPOSE: balls=1 books=1 hats=0", "ACCEPT"])[-1]
    assert accepted.done and accepted.reward == pytest.approx(0.5) and accepted.info["metrics"]["env/pareto"] == 1.0


def test_the_opponent_walks_away_at_the_deadline():
    steps = play(["PROPOSE: balls=1 books=3 hats=2"] * 4)
    assert [s.done for s in steps] == [False, False, False, True]
    assert [s.reward for s in steps] == [0.0] * 4
    assert steps[-1].info["metrics"] == {"env/deal": 0.0, "env/value_share": 0.0, "env/turns": 4.0, "env/invalid": 0.0}


def test_invalid_moves_cost_the_penalty_and_the_round():
    steps = play(["ACCEPT", "hello", "PROPOSE: balls=1 books=1 hats=0"])  # nothing to accept yet; prose
    assert steps[0].reward == -0.1 and "no offer to accept" in steps[0].observation[0]["content"]
    assert steps[1].reward == -0.1 and "Round 3 of 4" in steps[1].observation[0]["content"]
    # the proposal comes in round 3, where the opponent's 8 meets its demand of 20/3
    assert steps[2].done and steps[2].reward == pytest.approx(0.4)
    assert steps[2].info["metrics"]["env/invalid"] == pytest.approx(2 / 3)
    last = play(["hello"] * 4)[-1]
    assert last.done and last.reward == -0.1 and last.info["metrics"]["env/invalid"] == 1.0


def test_delayed_attribution_gives_every_valid_turn_the_outcome():
    moves = ["hello", "PROPOSE: balls=1 books=1 hats=0", "PROPOSE: balls=1 books=1 hats=0"]
    episode = play(moves)  # invalid (-0.1), rejected (8 < 25/3), accepted (8 >= 20/3): 0.4
    assert [s.reward for s in episode] == pytest.approx([-0.1, 0.0, 0.4]) and "turn_rewards" not in episode[-1].info
    delayed = play(moves, attribution="delayed")[-1]
    assert delayed.info["turn_rewards"] == pytest.approx([-0.1, 0.4, 0.4])
    assert delayed.info["turn_eligible"] == [True, True, True]


def test_pareto_optimality_by_enumeration():
    assert pareto_optimal((1, 0, 1), COUNTS, MINE, THEIRS)  # policy 5, opponent 8: nothing beats both
    assert pareto_optimal((1, 0, 0), COUNTS, MINE, THEIRS)  # policy 3, opponent 10 (its maximum)
    assert not pareto_optimal((1, 1, 0), COUNTS, MINE, THEIRS)  # 4 and 8, dominated by (1, 0, 1): 5 and 8
    assert not pareto_optimal((0, 0, 0), COUNTS, MINE, THEIRS)  # 0 and 10, dominated by the ball: 3 and 10


def test_the_task_rows_only_seed_episodes_and_bad_settings_are_refused():
    data = negotiation_task(TaskConfig(name="negotiation", params={"max_rounds": 3}, num_train=3, num_eval=1))
    assert len(data.train) == 3 and len(data.eval) == 1 and "at most 3 rounds" in data.train[0]["question"]
    for bad in ({"max_rounds": 1}, {"items": {"books": 0}}, {"attribution": "turn"}, {"reservation": 1.5},
                {"items": {"a": 1, "b": 1, "c": 5}, "total_value": 1}):  # c could never be worth anything
        with pytest.raises(ValueError):
            NegotiationEnv(**bad)
