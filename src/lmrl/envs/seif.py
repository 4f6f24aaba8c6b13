"""SEIF in one run (specs tasks_and_roles §C2, docs/methods/seif.md): the instructor is a role, the follower the policy.

Each task row is a seed instruction. At an episode's reset the `instructor` role (`roles:`, docs/roles.md) rewrites
it into a harder instruction with checkable constraints (`rewards.seif`: one JSON object); the policy, the
follower, answers that instruction in one turn and is paid the fraction of the constraints its `<answer>` meets
(0 without the `<think>/<answer>` format, or when the instruction did not parse or its constraints conflict).

One instruction per row and rollout batch: every episode of a row's group answers the same instruction, so the
follower's group-relative advantage compares answers to one instruction, as SEIF's follower rounds do. The
episode runner runs all resets of a batch before its first turn, so a row's instruction is drawn at its first
reset after a turn was played; its seed comes from the row's uid and the instructor's version (resumable). The
instructor's recorded sample has as its row the state the row's episodes share: their replies (`answers`, what
`seif_instructor_played` pays it by: 1 − their satisfied fraction) and its collusion probes (`drift`):

- `f0_satisfied`: the frozen reference follower's satisfied fraction on the instruction, when `reference` names
  a frozen role (F_0: a frozen `model: adapter` role is the policy's base, its adapter never trained);
- `follower_satisfied`: the current follower's mean over the group.

Both are logged as `role/<instructor>/drift/…` (`loops.roles`). The instructor's samples of a batch are one
group: with one instruction per row, its baseline is the batch's mean (SEIF groups five per seed instruction).
"""
from __future__ import annotations

import threading
import zlib
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.roles import role_client
from lmrl.envs.tasks import TASKS, TaskData
from lmrl.rewards.seif import follower_reward, parse_instruction

INSTRUCTOR_SYSTEM = (
    "Rewrite the instruction into a harder one with checkable constraints. Reply with JSON only: "
    '{"instruction": "<the full instruction, constraints included>", "constraints": [{"type": ...}, ...]}. '
    'Constraint types: min_words/max_words {"value": n}, include_keywords/exclude_keywords {"keywords": [...]}, '
    'starts_with/ends_with {"value": text}, lowercase, uppercase, no_commas, paragraphs {"value": n}.')
FOLLOWER_SYSTEM = "Think inside <think></think>, then give your reply inside <answer></answer>."
TOPICS = ["the ocean", "a rainy city", "learning to cook", "an old library", "a mountain hike", "the night sky",
          "a busy market", "a first job", "winter mornings", "a small robot", "a garden", "a long train ride"]
FORMS = ["Write a short note about {}.", "Describe {} to a child.", "Give three tips about {}.",
         "Write a two-sentence story about {}."]


@TASKS.register("seif_seeds", "seed instructions for SEIF's instructor (topics × forms; env.name: seif)")
def seif_seeds(cfg: TaskConfig) -> TaskData:
    seeds = [form.format(topic) for form in FORMS for topic in TOPICS]
    rows = [{"uid": f"seif-{i}", "question": seeds[i % len(seeds)], "answer": ""}
            for i in range(cfg.num_train + cfg.num_eval)]
    return TaskData(rows[: cfg.num_train], rows[cfg.num_train:])


@ENVIRONMENTS.register("seif", "SEIF in one run: the instructor role writes a constrained instruction per row, "
                       "the policy (follower) answers it; paid the fraction of constraints met")
class SeifEnv:
    """`instructor`: the role that writes instructions; `reference`: a frozen role answering them as F_0 (None:
    no probe); `require_format`: the follower's answer is its `<answer>` part, else 0."""

    def __init__(self, instructor: str = "instructor", reference: str | None = None, require_format: bool = True):
        self.instructor, self.reference, self.require_format = instructor, reference, require_format
        self.lock = threading.Lock()
        self.drawn: dict[str, dict[str, Any]] = {}
        self.played = False

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        with self.lock:
            if self.played:  # a new rollout batch: fresh instructions
                self.drawn, self.played = {}, False
            uid = str(row.get("uid", row["question"]))
            shared = self.drawn.get(uid)
            if shared is None:
                shared = self.drawn[uid] = self.draw(uid, row["question"])
        prompt = shared["instruction"] or row["question"]
        state = {"shared": shared, "seed": seed}
        return [{"role": "system", "content": FOLLOWER_SYSTEM}, {"role": "user", "content": prompt}], state

    def draw(self, uid: str, seed_instruction: str) -> dict[str, Any]:
        """The instructor's instruction for a row (recorded with the shared state as its row), and F_0's probe."""
        client = role_client(self.instructor)
        seed = zlib.crc32(f"{uid}:{client.engine.version}".encode())
        shared: dict[str, Any] = {"uid": uid, "seed_instruction": seed_instruction, "answers": [], "drift": {}}
        reply = client.chat([{"role": "system", "content": INSTRUCTOR_SYSTEM},
                             {"role": "user", "content": seed_instruction}], seed=seed, row=shared, group="batch")
        parsed = parse_instruction(reply)
        shared["instruction"], shared["constraints"] = parsed if parsed is not None else (None, None)
        if parsed is not None and self.reference is not None:
            answer = role_client(self.reference).chat([{"role": "system", "content": FOLLOWER_SYSTEM},
                                                       {"role": "user", "content": parsed[0]}], seed=seed)
            shared["drift"]["f0_satisfied"] = follower_reward(answer, parsed[1], self.require_format)
        return shared

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        shared = state["shared"]
        valid = shared["constraints"] is not None
        score = follower_reward(reply, shared["constraints"], self.require_format) if valid else 0.0
        with self.lock:
            self.played = True
            shared["answers"].append(reply)
            if valid:
                seen = shared.setdefault("scores", [])
                seen.append(score)
                shared["drift"]["follower_satisfied"] = sum(seen) / len(seen)
        return Step(None, score, True, {"metrics": {"env/instruction_valid": float(valid), "env/satisfied": score}})
