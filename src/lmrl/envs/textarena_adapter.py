"""TextArena games as environments: the policy plays player 0 against a built-in opponent, or alone.

`textarena` is an optional dependency (`pip install lmrl[textarena]`), imported when the environment
is built, so lmrl imports without it. Each episode makes a fresh game (`game`: a textarena env id)
without textarena's observation wrappers: the game's new messages since the policy's last move
become one user message (the policy's own moves are not echoed back), the policy's reply is the
action (wrapped in brackets when it has none, as textarena's `ActionFormattingWrapper` does), and
textarena's final reward for player 0 is the episode's reward. Task `textarena`: rows that only seed
episodes.

Opponents (player 1 of a two-player game): `random` plays a uniformly drawn move among the bracketed
moves the game has shown it (newest first: its available-move list, else the moves its rules name)
that the game accepts, tried on a copy of the game; `first` plays the first such move; `fixed` always plays
`opponent_action`; `self` hands player 1's turns to the policy too (self-play; each turn is then
credited with its own player's outcome). A `random`/`first` opponent with no acceptable listed move
plays its first listed move anyway (`env/opponent_stuck`).

textarena games draw from Python's global `random` (seeded at reset), so every game call runs under a
lock with the episode's own generator state swapped in: episodes are reproducible from their seed
whatever the thread interleaving, and the rest of the process's `random` stream is left alone.
"""
from __future__ import annotations

import copy
import importlib
import random
import re
import threading
from contextlib import contextmanager
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.attribution import delayed_attribution
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.tasks import TASKS, TaskData

INSTALL = "the textarena environment needs the textarena package: pip install lmrl[textarena]"
OPPONENTS = ("random", "first", "fixed", "self")
BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
MAX_CANDIDATES = 64
_RANDOM = threading.Lock()


def textarena():
    """The textarena module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("textarena")
    except ImportError as err:
        raise ImportError(INSTALL) from err


@contextmanager
def episode_random(state: dict[str, Any]):
    """Run game code with the episode's global-`random` state in place, restoring the process's after."""
    with _RANDOM:
        outer = random.getstate()
        if state.get("random") is not None:
            random.setstate(state["random"])
        try:
            yield
        finally:
            state["random"] = random.getstate()
            random.setstate(outer)


def watch_invalid(game_state, record: dict[str, Any]) -> None:
    """Set `record["flagged"]` whenever the game flags a move invalid (the class's own method still runs,
    so a deep copy of the game gets a fresh watcher rather than one bound to the original)."""
    original = type(game_state).set_invalid_move.__get__(game_state)

    def flagged(*args, **kwargs):
        record["flagged"] = True
        return original(*args, **kwargs)

    game_state.set_invalid_move = flagged


@TASKS.register("textarena", "rows that only seed TextArena episodes (env.name: textarena)")
def textarena_task(cfg: TaskConfig) -> TaskData:
    question = f"Play the TextArena game {cfg.params.get('game', 'TicTacToe-v0')}."
    rows = [{"uid": f"textarena-{i}", "question": question, "answer": ""} for i in range(cfg.num_train + cfg.num_eval)]
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("textarena", "a TextArena game; the policy is player 0 against a built-in opponent")
class TextArenaEnv:
    """`game` (a textarena env id) against `opponent`; `num_players` 1 or 2 (None: what the game accepts)."""

    def __init__(self, game: str = "TicTacToe-v0", opponent: str = "random", opponent_action: str | None = None,
                 num_players: int | None = None, attribution: str = "outcome", invalid_penalty: float = -0.5,
                 bracket: bool = True):
        self.ta = textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            raise ValueError(f"textarena: unknown game {game!r} (textarena.envs.registration.ENV_REGISTRY)")
        if opponent not in OPPONENTS:
            raise ValueError(f"textarena: opponent must be one of {', '.join(OPPONENTS)}, got {opponent!r}")
        if opponent == "fixed" and not opponent_action:
            raise ValueError("textarena: opponent 'fixed' needs opponent_action, e.g. '[cooperate]'")
        if attribution not in ("outcome", "delayed"):
            raise ValueError(f"textarena: attribution must be 'outcome' or 'delayed', got {attribution!r}")
        self.game, self.opponent, self.opponent_action = game, opponent, opponent_action
        self.attribution, self.invalid_penalty, self.bracket = attribution, invalid_penalty, bracket
        self.num_players = num_players or self._players()

    def _make(self):
        env = self.ta.make(self.game)
        while isinstance(env, self.ta.Wrapper):  # the adapter formats observations itself
            env = env.env
        return env

    def _players(self) -> int:
        """2 if the game resets with two players, else 1 (probed once, under the random lock)."""
        for n in (2, 1):
            try:
                with episode_random({}):
                    self._make().reset(num_players=n, seed=0)
                return n
            except (AssertionError, ValueError):
                continue
        raise ValueError(f"textarena: {self.game} is neither a one- nor a two-player game")

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        state: dict[str, Any] = {"random": None, "rng": random.Random(seed), "players": [], "invalid": [],
                                 "stuck": 0, "flagged": False, "opponent_seen": []}
        with episode_random(state):
            env = self._make()
            env.reset(num_players=self.num_players, seed=seed)
            state["env"] = env
            watch_invalid(env.state, state)
            done, text = self._advance(state)
        if done:
            raise RuntimeError(f"textarena: {self.game} ended before the policy's first move")
        return [{"role": "user", "content": text}], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        env, text, rewards = state["env"], "", None
        with episode_random(state):
            state["players"].append(env.state.current_player_id)
            state["flagged"] = False
            done, _ = env.step(action=self.action(reply))
            state["invalid"].append(state["flagged"])
            if not done:
                done, text = self._advance(state)
            if done:
                rewards = self._close(env)
        if rewards is None:
            return Step([{"role": "user", "content": text}], 0.0, False, {"metrics": self.metrics(state, None)})
        outcome = float(rewards.get(0, 0.0))
        info: dict[str, Any] = {"metrics": self.metrics(state, rewards)}
        if self.opponent == "self":
            info["turn_rewards"] = [self.invalid_penalty if bad else float(rewards.get(p, 0.0))
                                    for p, bad in zip(state["players"], state["invalid"])]
            info["turn_eligible"] = [True] * len(state["players"])
        elif self.attribution == "delayed":
            info.update(delayed_attribution(outcome, [not bad for bad in state["invalid"]],
                                            invalid_penalty=self.invalid_penalty))
        return Step(None, outcome, True, info)

    def action(self, reply: str) -> str:
        reply = reply.strip()
        return f"[{reply}]" if self.bracket and "[" not in reply and "]" not in reply else reply

    def _advance(self, state: dict[str, Any]) -> tuple[bool, str]:
        """Let the opponent move until it is the policy's turn; (done, the policy's new observation)."""
        env = state["env"]
        while True:
            player, messages = env.get_observation()
            if player == 0 or self.opponent == "self":
                return False, self._text(state, player, messages)
            done, _ = env.step(action=self._opponent_move(state, messages))
            if done:
                return True, ""

    def _text(self, state: dict[str, Any], player: int, messages: list) -> str:
        """The messages a player has not seen yet, as text: its own moves left out, boards but the last."""
        names, board = state["env"].state.role_mapping, self.ta.ObservationType.GAME_BOARD
        last_board = max((i for i, (_, _, kind) in enumerate(messages) if kind == board), default=None)
        lines = [text if sender == self.ta.GAME_ID else f"[{names.get(sender, f'Player {sender}')}] {text}"
                 for i, (sender, text, kind) in enumerate(messages)
                 if sender != player and (kind != board or i == last_board)]
        if self.opponent == "self" and self.num_players > 1:
            lines.insert(0, f"(You play Player {player} now.)")
        return "\n".join(lines).strip() or "Your move."

    def _opponent_move(self, state: dict[str, Any], messages: list) -> str:
        if self.opponent == "fixed":
            return self.opponent_action
        action = self.ta.ObservationType.PLAYER_ACTION
        state["opponent_seen"][:0] = [text for _, text, kind in reversed(messages) if kind != action]
        candidates = list(dict.fromkeys(m for text in state["opponent_seen"] for m in BRACKETED.findall(text)))
        candidates = candidates[:MAX_CANDIDATES]
        if self.opponent == "random":
            state["rng"].shuffle(candidates)
        for move in candidates:
            if self._accepted(state, move):
                return move
        state["stuck"] += 1
        return candidates[0] if candidates else "[pass]"

    def _accepted(self, state: dict[str, Any], move: str) -> bool:
        """Whether the game takes `move` without flagging it invalid, tried on a copy of the game."""
        before = random.getstate()
        trial, seen = copy.deepcopy(state["env"]), {"flagged": False}
        watch_invalid(trial.state, seen)
        try:
            trial.step(action=move)
        except Exception:  # a move the game cannot even parse
            seen["flagged"] = True
        random.setstate(before)
        return not seen["flagged"]

    @staticmethod
    def _close(env) -> dict[int, float]:
        result = env.close()
        rewards = result[0] if isinstance(result, tuple) else result
        return dict(rewards or {})

    def metrics(self, state: dict[str, Any], rewards: dict[int, float] | None) -> dict[str, float]:
        out = {"env/invalid": sum(state["invalid"]) / len(state["invalid"]),
               "env/opponent_stuck": float(state["stuck"])}
        if rewards is not None:
            out["env/outcome"] = float(rewards.get(0, 0.0))
            if len(rewards) > 1:
                out["env/win"] = float(rewards.get(0, 0.0) > max(v for p, v in rewards.items() if p != 0))
        return out
