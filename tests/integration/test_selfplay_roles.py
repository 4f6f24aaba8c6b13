"""Methods on roles with tiny random models (docs/roles.md): two-player negotiation with the opponent as the
policy itself (self-play) or as a second learner on its own adapter, and SELF-EMO's recogniser role. A tiny random
policy never writes a valid move, so the negotiation here plays a fixed proposal for it: the opponent role is
asked every round and answers with what its engine samples."""
from __future__ import annotations

import pytest

from conftest import run_tiny, toy_run_config
from lmrl.envs.environment import ENVIRONMENTS, forget_built_environments
from lmrl.envs.negotiation import NegotiationEnv

if "negotiation_proposing" not in ENVIRONMENTS:
    @ENVIRONMENTS.register("negotiation_proposing", "test: negotiation where the policy always proposes one split")
    class ProposingNegotiation(NegotiationEnv):
        def step(self, reply, state):
            return super().step("PROPOSE: balls=1 books=1 hats=1", state)


def opponent_config(tmp_path, model, **role):
    forget_built_environments()
    opponent = {"model": model, "reward": {"components": [{"name": "negotiation_side"}],
                                           "accuracy_component": "negotiation_side"},
                "trainer": {"lr": 1e-2}, "max_new_tokens": 6, "temperature": 1.0, **role}
    return toy_run_config(
        tmp_path, 1, num_train=16, model={"lora": {"r": 4, "alpha": 8}}, roles={"opponent": opponent},
        env={"name": "negotiation_proposing", "params": {"max_rounds": 2, "opponent": {"role": "opponent"}},
             "max_turns": 2, "max_episode_tokens": 1024},
        reward={"components": [{"name": "env"}], "accuracy_component": "env"},
        rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6})


def steps_of(rows):
    return [r for r in rows if "reward/mean" in r]


def test_self_play_the_opponents_moves_join_the_policys_update(tmp_path, monkeypatch):
    import lmrl.loops.loop as loop

    trained, learn = [], loop.learn
    monkeypatch.setattr(loop, "learn", lambda s, kept, step: trained.append(kept) or learn(s, kept, step))
    rows, s = run_tiny(opponent_config(tmp_path, "policy"))
    (row,) = steps_of(rows)
    moves = row["role/opponent/samples"]
    assert 8.0 <= moves <= 16.0  # 8 episodes, asked once or twice each (an ACCEPT in round 1 ends one)
    (kept,) = trained
    own = [g for g in kept if g.uid.startswith("opponent/")]
    assert len(own) == 2 and sum(len(g.samples) for g in own) == moves  # one group per row, beside the policy's 2
    for sample in (x for g in own for x in g.samples):
        assert sample.role == "opponent" and sample.reward is not None
        assert sample.row["values"] == sample.row["side"]["values"] and "mine" not in sample.row
    assert "env/opponent/value_share" in row and "env/scripted/deal" in row


def test_the_opponent_on_its_own_adapter_is_a_second_learner(tmp_path):
    rows, s = run_tiny(opponent_config(tmp_path, "adapter"))
    (row,) = steps_of(rows)
    assert row["role/opponent/samples"] == 16.0 and "role/opponent/loss" in row  # 8 episodes × 2 rounds
    assert s.roles["opponent"].learner.optimizer_steps == 1 and s.learner.optimizer_steps == 1
    assert abs(row["role/opponent/drift/kl"]) < 1e-6  # its adapter starts as the base
    # a tiny random model writes no valid move: each costs it the invalid-move penalty, and the game no deal
    assert row["role/opponent/reward/mean"] == pytest.approx(-0.1) and row["env/opponent/invalid"] == 1.0


def test_self_emo_the_recogniser_role_is_asked_twice_per_episode(tmp_path):
    forget_built_environments()
    recogniser = {"model": "policy", "temperature": 1.0, "max_new_tokens": 6,
                  "reward": {"components": [{"name": "emotion_iou"}, {"name": "emotion_consistency"}],
                             "accuracy_component": "emotion_iou"}}
    cfg = toy_run_config(tmp_path, 1, num_train=16, num_eval=0, roles={"recogniser": recogniser},
                         task={"name": "self_emo", "system_prompt": None},
                         env={"name": "self_emo", "params": {"recogniser": {"role": "recogniser"}}, "max_turns": 1,
                              "max_episode_tokens": 64},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6})
    rows, _ = run_tiny(cfg)
    (row,) = steps_of(rows)
    assert row["role/recogniser/samples"] == 16.0  # 8 episodes: the gold line and the responder's line
    assert "env/explicit_emotion" in row and "env/gold_iou" in row
