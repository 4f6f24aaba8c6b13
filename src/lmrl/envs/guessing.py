"""A game: guess a hidden number with higher / lower feedback, scored by how fast it is found.

The environment draws a secret in [`low`, `high`] from the episode seed and answers each guess with
"higher", "lower" or "correct". Finding it on guess k of `max_guesses` pays 1 − (k − 1) / max_guesses
at the end (0 if never found); a reply without a number costs `invalid_penalty` that turn. Metrics:
solved share, guesses used, invalid replies, and consistency — the share of guesses inside the
interval the feedback so far allows (a policy that reads its own history keeps this at 1; binary
search also halves the interval, `env/halving`).

Rows only seed episodes (task `guessing`: the rules as the question).
"""
from __future__ import annotations

import random
import re
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.tasks import TASKS, TaskData

RULES = ("I am thinking of a whole number from {low} to {high}. Guess it: reply with just a number. After each "
         "guess I say whether the number is higher or lower. You have {max_guesses} guesses.")
NUMBER = re.compile(r"-?\d+")


@TASKS.register("guessing", "rows that only seed number-guessing episodes (env.name: guessing)")
def guessing_task(cfg: TaskConfig) -> TaskData:
    p = {"low": 1, "high": 100, "max_guesses": 7, **cfg.params}
    question = RULES.format(**p)
    rows = [{"uid": f"guess-{i}", "question": question, "answer": ""} for i in range(cfg.num_train + cfg.num_eval)]
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("guessing", "guess a hidden number with higher/lower feedback; paid for guessing it fast")
class GuessingEnv:
    """A secret in [`low`, `high`], `max_guesses` guesses, feedback after each."""

    def __init__(self, low: int = 1, high: int = 100, max_guesses: int = 7, invalid_penalty: float = -0.1):
        if low >= high or max_guesses < 1:
            raise ValueError(f"guessing: need low < high and max_guesses ≥ 1 (got {low}, {high}, {max_guesses})")
        self.low, self.high, self.max_guesses, self.invalid_penalty = low, high, max_guesses, invalid_penalty

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        secret = random.Random(seed).randint(self.low, self.high)
        state = {"secret": secret, "lo": self.low, "hi": self.high, "guesses": 0, "invalid": 0,
                 "consistent": 0, "halving": 0}
        rules = RULES.format(low=self.low, high=self.high, max_guesses=self.max_guesses)
        return [{"role": "user", "content": rules}], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        state["guesses"] += 1
        found = NUMBER.findall(reply)
        turn = state["guesses"]
        if not found:
            state["invalid"] += 1
            return self._next(state, "Reply with just a number.", self.invalid_penalty)
        guess = int(found[-1])
        lo, hi, secret = state["lo"], state["hi"], state["secret"]
        state["consistent"] += lo <= guess <= hi
        state["halving"] += lo <= guess <= hi and abs(guess - (lo + hi) / 2) <= max(1.0, (hi - lo) / 4)
        if guess == secret:
            return Step(None, 1.0 - (turn - 1) / self.max_guesses, True, {"metrics": metrics(state, solved=True)})
        if guess < secret:
            state["lo"] = max(lo, guess + 1)
        else:
            state["hi"] = min(hi, guess - 1)
        return self._next(state, "Higher." if guess < secret else "Lower.", 0.0)

    def _next(self, state: dict[str, Any], said: str, reward: float) -> Step:
        left = self.max_guesses - state["guesses"]
        if left <= 0:
            return Step(None, reward, True, {"metrics": metrics(state, solved=False)})
        return Step([{"role": "user", "content": f"{said} {left} guesses left."}], reward, False,
                    {"metrics": metrics(state, solved=False)})


def metrics(state: dict[str, Any], solved: bool) -> dict[str, float]:
    valid = state["guesses"] - state["invalid"]
    out = {"env/solved": float(solved), "env/guesses": float(state["guesses"]),
           "env/invalid": state["invalid"] / state["guesses"]}
    if valid:
        out["env/consistent"] = state["consistent"] / valid
        out["env/halving"] = state["halving"] / valid
    return out
