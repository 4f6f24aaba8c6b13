"""Reflect and revise (LA-RL-style): the policy answers, a verifier says whether it is right, and a
wrong answer may be revised.

The environment grades each reply with the strict answer grader (`rewards.functions.final_answer`
and `answers_match`, the same rules as the `answer` reward: a number literal for numeric gold, no
restated question, no hedges). A right answer ends the episode; a wrong one (or none) is answered
with feedback and another attempt, up to `max_attempts`. Reward: 1 for a right answer on the first
attempt, `revision_credit` (0.5) for one found by revising, 0 otherwise — paid on the turn that
answers. Metrics: `env/first_try` (right at once), `env/revised` (right only after feedback) and
`env/attempts`.

Task rows are any rows with `question` and `answer` (e.g. reasoning-gym's); the opening message is
the row's question after an optional `system` instruction.
"""
from __future__ import annotations

from typing import Any

from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.rewards.functions import answers_match, final_answer

FEEDBACK = ("That is not right. Check your work step by step, then give your corrected final answer as "
            "'Answer: <answer>'.")
MISSING = "I could not find a final answer. End your reply with 'Answer: <answer>'."


@ENVIRONMENTS.register("revise", "answer, get the verifier's verdict, revise a wrong answer (LA-RL-style)")
class ReviseEnv:
    """Up to `max_attempts` answers to a row's question, graded by the strict answer grader."""

    def __init__(self, max_attempts: int = 2, revision_credit: float = 0.5, system: str | None = None):
        if max_attempts < 1:
            raise ValueError(f"revise: max_attempts must be ≥ 1, got {max_attempts}")
        self.max_attempts, self.revision_credit, self.system = max_attempts, revision_credit, system

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        state = {"question": row["question"], "gold": str(row["answer"]), "attempts": 0}
        return system + [{"role": "user", "content": row["question"]}], state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        state["attempts"] += 1
        answer = final_answer(reply, fallback="last_number", question=state["question"])
        right = answer is not None and answers_match(answer, state["gold"], question=state["question"])
        first = state["attempts"] == 1
        if right or state["attempts"] >= self.max_attempts:
            reward = (1.0 if first else self.revision_credit) if right else 0.0
            metrics = {"env/first_try": float(right and first), "env/revised": float(right and not first),
                       "env/attempts": float(state["attempts"])}
            return Step(None, reward, True, {"metrics": metrics})
        return Step([{"role": "user", "content": FEEDBACK if answer is not None else MISSING}], 0.0, False)
