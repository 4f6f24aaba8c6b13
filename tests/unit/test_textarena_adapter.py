"""Real TextArena games, offline, through the adapter: observations in, actions out, rewards, opponents,
invalid moves, attribution, reproducibility, and the error when textarena is missing."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from lmrl.envs.textarena_adapter import INSTALL, TextArenaEnv, textarena


def play(env, moves, seed=0):
    messages, state = env.reset({}, seed)
    return messages, state, [env.step(m, state) for m in moves]


def test_tic_tac_toe_against_the_first_listed_move_by_hand():
    env = TextArenaEnv(game="TicTacToe-v0", opponent="first")
    assert env.num_players == 2
    # the opponent (X) takes the lowest free cell: 0 after our 4, 1 after our 2; 4-2-6 is our diagonal
    messages, _, steps = play(env, ["4", "[2]", "6"])
    opening = messages[0]["content"]
    assert messages[0]["role"] == "user" and opening.startswith("You are Player 0 in Tic Tac Toe")
    assert "Available Moves: '[0]', '[1]'" in opening
    first = steps[0].observation[0]["content"]
    assert "[Player 1] [0]" in first and "[Player 0]" not in first  # our own move is not echoed back
    assert first.count("Current Board") == 1  # only the newest board
    assert [s.done for s in steps] == [False, False, True] and [s.reward for s in steps] == [0.0, 0.0, 1.0]
    assert steps[-1].info == {"metrics": {"env/invalid": 0.0, "env/opponent_stuck": 0.0, "env/outcome": 1.0,
                                          "env/win": 1.0}}


def test_invalid_moves_lose_and_delayed_attribution_credits_each_turn():
    env = TextArenaEnv(game="TicTacToe-v0", opponent="first", attribution="delayed", invalid_penalty=-0.5)
    # 4 (valid; the opponent takes 0), 4 again (taken: a warning and a second chance), 0 (taken: the game is lost)
    _, _, steps = play(env, ["4", "4", "0"])
    assert "invalid move" in steps[1].observation[0]["content"] and not steps[1].done
    last = steps[-1]
    assert last.done and last.reward == -1.0 and last.info["metrics"]["env/invalid"] == pytest.approx(2 / 3)
    assert last.info["turn_rewards"] == [-1.0, -0.5, -0.5] and last.info["turn_eligible"] == [True] * 3


def test_a_single_player_game_pays_textarenas_reward():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    assert env.num_players == 1
    messages, state = env.reset({}, 5)
    secret = state["env"].state.game_state["game_number"]
    assert "Guess The Number" in messages[0]["content"]
    wrong = env.step(f"[{secret % 20 + 1}]", state)
    assert not wrong.done and ("higher" in wrong.observation[0]["content"] or "lower" in wrong.observation[0]["content"])
    right = env.step(str(secret), state)  # bracketed by the adapter
    assert right.done and right.reward == 1.0 and "env/win" not in right.info["metrics"]


def test_a_fixed_opponent_in_a_nine_round_game():
    env = TextArenaEnv(game="IteratedRockPaperScissors-v0", opponent="fixed", opponent_action="[rock]")
    _, _, steps = play(env, ["paper"] * 9)
    assert [s.done for s in steps] == [False] * 8 + [True]
    assert "Player 0 wins" in steps[0].observation[0]["content"] and steps[-1].reward == 1.0


def test_the_opponent_may_move_first_and_a_random_opponent_replays_from_the_seed():
    env = TextArenaEnv(game="KuhnPoker-v0", opponent="random")
    outer = random.getstate()
    first, state_a, steps_a = play(env, ["check", "check", "check"], seed=3)
    again, state_b, steps_b = play(env, ["check", "check", "check"], seed=3)
    assert random.getstate() == outer  # games run on the episode's own random state
    assert "[Player 1] [" in first[0]["content"]  # player 1 opens this round, before the policy's first turn
    assert first == again and [s.observation for s in steps_a] == [s.observation for s in steps_b]
    assert [s.reward for s in steps_a] == [s.reward for s in steps_b]


def test_self_play_credits_each_turn_with_its_own_players_outcome():
    env = TextArenaEnv(game="TicTacToe-v0", opponent="self")
    messages, _, steps = play(env, ["4", "0", "2", "1", "6"])  # player 0 (O) completes 4-2-6
    assert messages[0]["content"].startswith("(You play Player 0 now.)")
    assert steps[0].observation[0]["content"].startswith("(You play Player 1 now.)")
    assert steps[-1].done and steps[-1].reward == 1.0
    assert steps[-1].info["turn_rewards"] == [1.0, -1.0, 1.0, -1.0, 1.0]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown game"):
        TextArenaEnv(game="NoSuchGame-v0")
    with pytest.raises(ValueError, match="opponent must be one of"):
        TextArenaEnv(opponent="minimax")
    with pytest.raises(ValueError, match="opponent_action"):
        TextArenaEnv(opponent="fixed")


def test_without_textarena_lmrl_imports_and_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install lmrl\[textarena\]"):
        textarena()
    code = ("import sys; sys.modules['textarena'] = None\n"
            "import lmrl.envs.textarena_adapter as m\n"
            "try:\n    m.TextArenaEnv()\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == INSTALL
