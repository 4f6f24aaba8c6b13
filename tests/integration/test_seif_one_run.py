"""SEIF in one run on a tiny random model (envs.seif, recipe seif_coevolve): the instructor role is asked once per
row and batch, its samples scored by `seif_instructor_played`, the frozen reference answers only parsed
instructions, and the phases alternate. A random model writes no JSON, so every instruction is unparsable:
nobody is paid (rewards 0), which is what the spec asks of an unparsable instruction."""
from __future__ import annotations

from conftest import run_tiny, toy_run_config
from lmrl.envs.environment import forget_built_environments


def test_seif_in_one_run_wires_the_instructor_the_follower_and_f0(tmp_path):
    forget_built_environments()
    instructor = {"model": "adapter", "max_new_tokens": 8, "temperature": 1.0,
                  "reward": {"components": [{"name": "seif_instructor_played"}],
                             "accuracy_component": "seif_instructor_played"},
                  "trainer": {"lr": 1e-2, "train_steps": [[1, 1]], "train_cycle": 2}}
    cfg = toy_run_config(
        tmp_path, 2, num_train=8, task={"name": "seif_seeds", "system_prompt": None, "num_train": 8, "num_eval": 0},
        env={"name": "seif", "params": {"reference": "reference"}, "max_turns": 1, "max_episode_tokens": 96},
        reward={"components": [{"name": "env"}], "accuracy_component": "env"}, model={"lora": {"r": 4, "alpha": 8}},
        rollout={"prompts_per_step": 2, "group_size": 3, "max_new_tokens": 6},
        trainer={"steps": 2, "train_steps": [[2, 2]], "train_cycle": 2},
        roles={"instructor": instructor,
               "reference": {"model": "adapter", "trains": False, "max_new_tokens": 6}})
    rows, s = run_tiny(cfg)
    rows = [r for r in rows if "reward/mean" in r]
    assert [r["role/instructor/samples"] for r in rows] == [2.0, 2.0]  # one instruction per row and batch
    assert [r["role/instructor/trains"] for r in rows] == [1.0, 0.0]
    assert all(r["role/instructor/reward/mean"] == 0.0 and r["reward/mean"] == 0.0 for r in rows)
    assert all(r["env/instruction_valid"] == 0.0 for r in rows)
    assert not any("role/instructor/drift/f0_satisfied" in r for r in rows)  # F_0 answers parsed ones only
    assert s.roles["instructor"].learner.optimizer_steps == 1 and s.roles["reference"].learner is None
