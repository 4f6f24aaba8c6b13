"""A game: a repeated two-armed bandit whose arm probabilities swap mid-episode (reversal learning).

Each round the policy picks arm `a` or `b` and is told whether it won (reward 1 with the arm's
probability, else 0). The better arm pays `p_good`, the other `p_bad`; after a reversal round drawn
per episode the two swap, so a policy must notice that its winning arm went bad. The episode's
reward is the sum of the per-round rewards. Metrics: win-stay (same arm after a win) and lose-shift
(other arm after a loss) rates, the share of rounds on the better arm, and invalid replies (no arm
named: reward 0, the round still counts).

Rows only seed episodes (task `bandit`: the rules as the question); the episode seed decides the
better arm, the reversal round and the draws, so a resumed run replays them exactly.
"""
from __future__ import annotations

import random
import re
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.tasks import TASKS, TaskData

RULES = ("You are playing a two-armed bandit for {rounds} rounds. Each round, choose arm a or arm b by "
         "replying with just the letter. An arm pays 1 point with some probability, which you do not know; "
         "the better arm may change during the game. Score as many points as you can.")
CHOICE = re.compile(r"\b([ab])\b", re.IGNORECASE)


@TASKS.register("bandit", "rows that only seed two-armed-bandit episodes (env.name: bandit)")
def bandit_task(cfg: TaskConfig) -> TaskData:
    rounds = int(cfg.params.get("rounds", 8))
    question = RULES.format(rounds=rounds)
    rows = [{"uid": f"bandit-{i}", "question": question, "answer": ""} for i in range(cfg.num_train + cfg.num_eval)]
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("bandit", "two-armed bandit with reversal: reward per round, win-stay / lose-shift metrics")
class BanditEnv:
    """`rounds` rounds; the arms swap after a round drawn uniformly from [`min_reversal`, rounds - `min_reversal`]."""

    def __init__(self, rounds: int = 8, p_good: float = 0.8, p_bad: float = 0.2, min_reversal: int = 2):
        if not 0 < min_reversal <= rounds - min_reversal:
            raise ValueError(f"bandit: min_reversal={min_reversal} leaves no reversal round in {rounds} rounds")
        self.rounds, self.p_good, self.p_bad, self.min_reversal = rounds, p_good, p_bad, min_reversal

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rng = random.Random(seed)
        state = {"rng": rng, "good": rng.choice("ab"), "reversal": rng.randint(self.min_reversal,
                                                                               self.rounds - self.min_reversal),
                 "history": []}
        return [{"role": "user", "content": RULES.format(rounds=self.rounds)}], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        history = state["history"]
        turn = len(history)
        good = state["good"] if turn < state["reversal"] else {"a": "b", "b": "a"}[state["good"]]
        found = CHOICE.search(reply)
        arm = found.group(1).lower() if found else None
        won = arm is not None and state["rng"].random() < (self.p_good if arm == good else self.p_bad)
        history.append((arm, won, arm == good))
        done = len(history) >= self.rounds
        info = {"metrics": strategy_metrics(history)}
        if done:
            return Step(None, float(won), True, info)
        said = f"arm {arm}: you {'won 1 point' if won else 'won nothing'}" if arm else "no arm chosen: reply a or b"
        return Step([{"role": "user", "content": f"{said}. round {len(history) + 1} of {self.rounds}. a or b?"}],
                    float(won), False, info)


def strategy_metrics(history: list[tuple[str | None, bool, bool]]) -> dict[str, float]:
    """Win-stay and lose-shift rates over consecutive valid rounds, better-arm share and invalid share.

    A rate with no qualifying pair is left out (so the logged mean is over the episodes that have one)."""
    out = {"env/better_arm": sum(g for _, _, g in history) / len(history),
           "env/invalid": sum(a is None for a, _, _ in history) / len(history)}
    pairs = [(h, n) for h, n in zip(history, history[1:]) if h[0] and n[0]]
    wins = [n[0] == h[0] for h, n in pairs if h[1]]
    losses = [n[0] != h[0] for h, n in pairs if not h[1]]
    if wins:
        out["env/win_stay"] = sum(wins) / len(wins)
    if losses:
        out["env/lose_shift"] = sum(losses) / len(losses)
    return out
