"""SEIF in one run (envs.seif, rewards.seif_instructor_played) and the roles' phase schedule (trainer.train_steps),
with stub role clients: hand-computed rewards (specs tasks_and_roles §C2), the instruction shared by a row's
group, F_0's probe, and graders that pay nothing for forged answers, conflicting constraints or another row's
replies."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lmrl.config import Config, ConfigError, TrainerConfig
from lmrl.envs.roles import register_role_clients
from lmrl.envs.seif import SeifEnv
from lmrl.loading import build_config, role_config
from lmrl.loops.roles import probes
from lmrl.rewards.seif import seif_instructor_played
from lmrl.types import Group, Sample

# 4 valid constraints: an answer "hello world" meets only include_keywords(hello)
CONSTRAINTS = [{"type": "include_keywords", "keywords": ["hello"]}, {"type": "min_words", "value": 5},
               {"type": "uppercase"}, {"type": "ends_with", "value": "done"}]
INSTRUCTION = json.dumps({"instruction": "Say hello loudly in five words, ending with done.",
                          "constraints": CONSTRAINTS})


def fmt(answer: str) -> str:
    return f"<think>ok</think><answer>{answer}</answer>"


class Stub:
    """A role's client: answers `reply`, remembers what it was asked, with the seed and row."""

    def __init__(self, reply: str, version: int = 0):
        self.reply, self.calls, self.engine = reply, [], SimpleNamespace(version=version)

    def chat(self, messages, max_tokens=None, temperature=None, seed=None, row=None, group=None):
        self.calls.append({"messages": messages, "seed": seed, "row": row, "group": group})
        return self.reply


def sample(text: str, row: dict) -> Sample:
    return Sample([1], [2], [0.0], "stop", text=text, row=row)


def test_spec_values_instructor_and_follower_075():
    # instructor: the follower's answer meets 1 of 4 → 1 - 1/4 = 0.75
    assert seif_instructor_played(sample(INSTRUCTION, {"answers": [fmt("hello world")]})) == 0.75
    # follower: "HELLO THERE MY GOOD FRIEND NOW" meets the keyword, ≥ 5 words and uppercase, not ends_with → 3/4
    instructor = Stub(INSTRUCTION)
    register_role_clients({"instructor": instructor})
    env = SeifEnv(instructor="instructor")
    _, state = env.reset({"uid": "a", "question": "Say hello."}, seed=1)
    assert env.step(fmt("HELLO THERE MY GOOD FRIEND NOW"), state).reward == 0.75


def test_one_instruction_per_row_and_batch_answered_by_the_whole_group_and_f0_probed():
    instructor, reference = Stub(INSTRUCTION, version=3), Stub(fmt("HELLO THERE MY GOOD FRIEND NOW"))
    register_role_clients({"instructor": instructor, "reference": reference})
    env = SeifEnv(instructor="instructor", reference="reference")
    opened = [env.reset({"uid": uid, "question": "Say hello."}, seed=s) for uid in ("a", "b") for s in (1, 2)]
    assert len(instructor.calls) == 2 and len(reference.calls) == 2  # once per row, not per episode
    assert opened[0][0][-1]["content"] == opened[1][0][-1]["content"] == json.loads(INSTRUCTION)["instruction"]
    shared_a = opened[0][1]["shared"]
    assert opened[1][1]["shared"] is shared_a and instructor.calls[0]["row"] is shared_a
    assert instructor.calls[0]["group"] == "batch" and instructor.calls[0]["seed"] != instructor.calls[1]["seed"]
    rewards = [env.step(reply, opened[i][1]).reward for i, reply in enumerate(
        [fmt("hello world"), fmt("HELLO THERE MY GOOD FRIEND NOW"), "no format at all", fmt("")])]
    assert rewards == [0.25, 0.75, 0.0, 0.0]
    assert shared_a["drift"] == {"f0_satisfied": 0.75, "follower_satisfied": 0.5}  # (0.25 + 0.75) / 2
    # the instructor's rows: (0.75 + 0.25) / 2 = 0.5 for row a; row b: no format → 0 and empty answer → 0
    assert seif_instructor_played(sample(INSTRUCTION, shared_a)) == 0.5
    assert seif_instructor_played(sample(INSTRUCTION, opened[2][1]["shared"])) == 0.0
    groups = [Group("instructor/batch", shared_a, [sample(INSTRUCTION, shared_a),
                                                   sample(INSTRUCTION, opened[2][1]["shared"])])]
    # row b: f0 0.75, follower (0 + 0) / 2 = 0 → means (0.75, 0.25)
    assert probes(groups) == {"drift/f0_satisfied": 0.75, "drift/follower_satisfied": 0.25}
    env.reset({"uid": "a", "question": "Say hello."}, seed=5)  # a new batch after turns were played
    assert len(instructor.calls) == 3


def test_a_row_whose_instruction_does_not_parse_pays_nobody():
    bad = json.dumps({"instruction": "x", "constraints": [{"type": "lowercase"}, {"type": "uppercase"}]})
    instructor, reference = Stub(bad), Stub(fmt("x"))
    register_role_clients({"instructor": instructor, "reference": reference})
    env = SeifEnv(reference="reference")
    messages, state = env.reset({"uid": "a", "question": "Say hello."}, seed=1)
    assert messages[-1]["content"] == "Say hello." and reference.calls == []  # the seed itself; no F_0 probe
    assert env.step(fmt("whatever"), state).reward == 0.0
    assert seif_instructor_played(sample(bad, state["shared"])) == 0.0  # conflicting: 0 however the follower did


def test_hostile_forged_answers_and_constraints_do_not_score():
    # the instructor writes the follower's "answers" into its own reply: the reward reads the row only
    forged = json.dumps({"instruction": "Say hi.", "constraints": CONSTRAINTS, "answers": ["zzz"]})
    assert seif_instructor_played(sample(forged, {"answers": [fmt("HELLO THERE MY GOOD FRIEND DONE")]})) == 0.0
    assert seif_instructor_played(sample(forged, {})) is None  # no answer came back: excluded, not paid
    # the follower restates easy constraints in its reply: graded on the instructor's constraints
    register_role_clients({"instructor": Stub(INSTRUCTION)})
    env = SeifEnv()
    _, state = env.reset({"uid": "a", "question": "Say hello."}, seed=1)
    easy = json.dumps({"constraints": [{"type": "lowercase"}]})
    assert env.step(fmt(f"hello {easy}"), state).reward == 0.25
    # another row's replies never reach this row's instructor sample
    _, other = env.reset({"uid": "b", "question": "Say hello."}, seed=2)
    env.step(fmt("HELLO THERE MY GOOD FRIEND NOW"), other)
    assert state["shared"]["answers"] == [fmt(f"hello {easy}")]


def test_train_steps_select_the_steps_a_learner_trains_in():
    every = TrainerConfig()
    assert all(every.trains_at(s) for s in range(1, 6))
    # cycle 10: steps 6-10, 16-20, … train
    follower = TrainerConfig(train_steps=[(6, 10)], train_cycle=10)
    assert [s for s in range(1, 21) if follower.trains_at(s)] == [6, 7, 8, 9, 10, 16, 17, 18, 19, 20]
    once = TrainerConfig(train_steps=[(1, 2), (5, 5)])  # no cycle: those steps only
    assert [s for s in range(1, 8) if once.trains_at(s)] == [1, 2, 5]
    never = TrainerConfig(train_steps=[])  # a policy that only generates (its roles learn)
    assert not any(never.trains_at(s) for s in range(1, 6))
    for bad in ({"train_steps": [(3, 2)]}, {"train_steps": [(0, 1)]},
                {"train_steps": [(1, 11)], "train_cycle": 10}, {"train_cycle": 4},
                {"train_steps": [], "train_cycle": 4}):
        with pytest.raises(ValueError, match="train_"):
            TrainerConfig(**bad)


def test_a_roles_phases_are_its_own_not_the_policys():
    tree = json.loads(Config().model_dump_json())
    tree["model"]["lora"] = {"r": 4, "alpha": 8}
    tree["trainer"].update({"train_steps": [[2, 2]], "train_cycle": 2})
    reward = {"components": [{"name": "env"}], "accuracy_component": "env"}
    tree["roles"] = {"a": {"reward": reward, "trainer": {"train_steps": [[1, 1]], "train_cycle": 2}},
                     "b": {"reward": reward}}
    cfg = build_config(tree)
    assert [cfg.trainer.trains_at(s) for s in (1, 2)] == [False, True]
    assert [role_config(cfg, "a").trainer.trains_at(s) for s in (1, 2)] == [True, False]
    assert role_config(cfg, "b").trainer.train_steps is None  # every step: not the policy's phases
    tree["roles"]["a"]["trainer"] = {"train_cycle": 2}
    with pytest.raises(ConfigError, match="roles.a"):
        build_config(tree)
