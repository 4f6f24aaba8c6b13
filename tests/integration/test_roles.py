"""Several models in one run (docs/roles.md), on tiny random models: a role's samples are routed to it and trained
by its own objective, a role's adapter on the policy's base gives the log-probs a separate model with that adapter
gives, and a run with roles resumes to the straight run's metrics and weights bit for bit."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from conftest import make_tokenizer, run_tiny, toy_run_config
from lmrl.config import ConfigError
from lmrl.envs.environment import ENVIRONMENTS, Step, forget_built_environments
from lmrl.envs.simulated_user import SimulatedUser
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS

ASKED = "Reply with a digit."


@ENVIRONMENTS.register("ask_the_user", "test: the policy speaks once, the run's `user` role answers; both paid for a 7")
class AskTheUser:
    """One policy turn, then the `user` role's answer, recorded with the episode's state as its row."""

    def __init__(self, role: str = "user"):
        self.user = SimulatedUser.build({"role": role}, max_tokens=4, temperature=1.0)

    def reset(self, row, seed):
        return [{"role": "user", "content": row["question"]}], {"seed": seed, "uid": row["uid"]}

    def step(self, reply, state):
        self.user.reply(ASKED, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}],
                               seed=state["seed"], row=state, group=state["uid"])
        state["policy_said"] = reply
        return Step(None, float("7" in reply), True)


def policy_said_seven(sample, **_):
    """The user role's reward in these tests: the policy's reply it answered had a 7 (read from its row, which
    the environment filled in when the episode ended)."""
    return float("7" in sample.row["policy_said"]) + float("7" in sample.text)


if "user_said_seven" not in REWARD_FNS:
    REWARD_FNS.register("user_said_seven", "test reward of the user role")(policy_said_seven)


def roles_config(tmp_path, steps, role=None, **sections):
    forget_built_environments()
    user = {"model": "adapter", "reward": {"components": [{"name": "user_said_seven"}],
                                           "accuracy_component": "user_said_seven"},
            "trainer": {"lr": 1e-2}, "max_new_tokens": 4, "temperature": 1.0, **(role or {})}
    tree = dict(env={"name": "ask_the_user", "max_turns": 1, "max_episode_tokens": 64},
                reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                model={"lora": {"r": 4, "alpha": 8}}, roles={"user": user},
                rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6})
    tree.update(sections)
    return toy_run_config(tmp_path, steps, num_train=16, **tree)


def steps_of(rows):
    return [r for r in rows if "reward/mean" in r]


def test_a_role_on_an_adapter_is_routed_its_samples_and_trains_them_apart_from_the_policy(tmp_path):
    rows, s = run_tiny(roles_config(tmp_path, 2))
    rows = steps_of(rows)
    assert [r["role/user/samples"] for r in rows] == [8.0, 8.0]  # one answer per episode: 2 prompts × 4
    role = s.roles["user"]
    assert role.learner.optimizer_steps == 2 and s.learner.optimizer_steps == 2
    assert 0.0 <= rows[0]["role/user/reward/mean"] <= 2.0 and "role/user/loss" in rows[0]
    assert abs(rows[0]["role/user/drift/kl"]) < 1e-6  # its adapter starts at zero: it is its base
    assert rows[1]["role/user/drift/kl"] > 1e-4  # one update later it has moved from its start
    named = dict(s.model.named_parameters())
    user_b = [v for k, v in named.items() if ".user." in k and "lora_B" in k]
    policy_b = [v for k, v in named.items() if ".default." in k and "lora_B" in k]
    assert user_b and all(p.requires_grad is False for p in user_b)  # the policy's adapter is back in place
    assert any(p.abs().sum() > 0 for p in user_b) and any(p.abs().sum() > 0 for p in policy_b)
    assert set(map(id, role.learner.trained_parameters)) == set(map(id, user_b + [
        v for k, v in named.items() if ".user." in k and "lora_A" in k]))
    assert not set(map(id, role.learner.trained_parameters)) & set(map(id, s.learner.trained_parameters))


def test_the_roles_adapter_gives_the_log_probs_of_a_separate_model_with_that_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model

    from lmrl.models.lora import AdapterSwitch

    tok = make_tokenizer()
    shared = get_peft_model(tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    switch = AdapterSwitch(shared)
    from lmrl.config import LoraConfig as OwnLora
    switch.add("user", OwnLora(r=4, alpha=8))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in shared.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    alone = get_peft_model(tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        theirs = {k.replace(".user.", ".default."): v for k, v in shared.named_parameters() if ".user." in k}
        for name, p in alone.named_parameters():
            if "lora_" in name:
                p.copy_(theirs[name])
    ids = torch.tensor([tok("hello there 7")["input_ids"]])
    with switch.use("user"):
        together = torch.log_softmax(shared(ids).logits, -1)
    policy = torch.log_softmax(shared(ids).logits, -1)
    apart = torch.log_softmax(alone(ids).logits, -1)
    assert torch.allclose(together, apart, atol=1e-6)
    assert (policy - apart).abs().max() > 1e-2  # the policy's own adapter is another model


def test_a_role_records_exactly_what_its_engine_sampled(tmp_path):
    _, s = run_tiny(roles_config(tmp_path, 1))
    role = s.roles["user"]
    client = role.client
    client.trains = True
    reply = client.chat([{"role": "user", "content": "hi"}], seed=5, row={"uid": "x"}, group="g")
    (group,) = client.take()
    (sample,) = group.samples
    assert sample.role == "user" and group.uid == "user/g" and sample.text == reply
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with role.switch(), torch.no_grad():
        logits = s.model(ids).logits[0, len(sample.prompt_ids) - 1:-1] / role.spec.temperature
    full = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]
    assert torch.allclose(full, torch.tensor(sample.behaviour_logprobs), atol=1e-4)


def test_a_run_of_roles_resumes_to_the_straight_runs_metrics_and_weights(tmp_path):
    straight_rows, straight = run_tiny(roles_config(tmp_path / "a", 2))
    cfg = roles_config(tmp_path / "b", 2, run={"checkpoint_every": 1})
    first_rows, _ = run_tiny(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 1})}))
    run_dir = cfg.run.output_dir + "/toy"
    resumed_rows, resumed = run_tiny(cfg, resume=run_dir)
    timing = ("timing/", "tokens_per_s", "train/tokens_per_s")
    keep = lambda r: {k: v for k, v in r.items() if not k.startswith(timing) and k != "time"}  # noqa: E731
    a = [keep(r) for r in steps_of(straight_rows)]
    b = [keep(r) for r in steps_of(resumed_rows)]
    assert a == b and any(k.startswith("role/user/") for k in a[1])
    for (name, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(p, q), name
    assert straight.roles["user"].engine.version == resumed.roles["user"].engine.version == 2


def test_a_role_with_a_model_of_its_own_trains_and_is_saved_loadable(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    cfg = roles_config(tmp_path, 1, role={"model": str(tiny_model_dir)}, run={"checkpoint_every": 1})
    rows, s = run_tiny(cfg)
    (row,) = steps_of(rows)
    assert row["role/user/samples"] == 8.0 and "role/user/loss" in row
    (checkpoint,) = sorted(Path(cfg.run.output_dir, "toy", "checkpoints").glob("step-*"))
    saved = AutoModelForCausalLM.from_pretrained(checkpoint / "roles" / "user" / "model")
    for (name, p), (_, q) in zip(s.roles["user"].model.named_parameters(), saved.named_parameters()):
        assert torch.equal(p, q), name
    assert s.roles["user"].model is not s.model


def test_a_role_playing_the_policys_weights_joins_the_policys_update(tmp_path, monkeypatch):
    import lmrl.loops.loop as loop

    trained, learn = [], loop.learn
    monkeypatch.setattr(loop, "learn", lambda s, kept, step: trained.append(kept) or learn(s, kept, step))
    rows, s = run_tiny(roles_config(tmp_path, 1, role={"model": "policy"}))
    (row,) = steps_of(rows)
    assert row["role/user/samples"] == 8.0 and s.roles["user"].learner is None and s.roles["user"].engine is s.engine
    (kept,) = trained
    own = [g for g in kept if g.uid.startswith("user/")]
    assert len(kept) == 4 and len(own) == 2  # the policy's 2 prompts and the role's 2 groups (one per episode's row)
    assert all(x.role == "user" and x.reward is not None for g in own for x in g.samples)
    assert all(x.role == "" for g in kept if g not in own for x in g.samples)


@pytest.mark.parametrize("change, message", [
    ({"model": {"lora": None}}, "needs model.lora"),
    ({"roles": {"policy": {"reward": {"components": [{"name": "env"}]}}}}, "not a role name"),
    ({"roles": {"user": {"model": "adapter"}}}, "sets no reward"),
    ({"rollout": {"prompts_per_step": 2, "group_size": 4, "max_staleness": 1}}, "synchronous loop"),
    ({"roles": {"user": {"model": "policy", "trains": False, "reward": {"components": [{"name": "env"}]}}}},
     "train with the policy"),
    ({"roles": {"user": {"model": "policy", "temperature": 0.7, "reward": {"components": [{"name": "env"}]}}}},
     "rollout.temperature=1.0"),
    ({"trainer": {"train_steps": []}, "roles": {"user": {"model": "adapter", "trains": False}}}, "nothing would learn"),
])
def test_what_a_run_of_roles_refuses_before_any_model_loads(tmp_path, change, message):
    base = json.loads(roles_config(tmp_path, 1).model_dump_json())
    tree = copy.deepcopy(base)
    for section, values in change.items():
        tree[section] = values if section == "roles" else {**tree[section], **values}
    from lmrl.loading import build_config

    with pytest.raises(ConfigError, match=message):
        build_config(tree)


def test_a_stop_rule_on_a_roles_drift_ends_the_run_when_it_parts_from_its_start(tmp_path):
    cfg = roles_config(tmp_path, 4, trainer={"steps": 4, "lr": 3e-3, "bf16": False, "seed": 1,
                                             "stop_when": [{"metric": "role/user/drift/kl", "above": 1e-4}]})
    rows, s = run_tiny(cfg)
    done = steps_of(rows)
    assert len(done) == 2 and done[-1]["role/user/drift/kl"] > 1e-4  # step 1 measures its start (0); step 2 has moved
    assert "role/user/drift/kl" in done[-1]["stopped"]


def test_lmrl_export_of_a_role_gives_the_model_the_role_answered_with(tmp_path, tiny_model_dir, capsys):
    from transformers import AutoModelForCausalLM

    from lmrl.cli import main

    cfg = roles_config(tmp_path, 1, run={"checkpoint_every": 1},  # the base on disk is the tiny model run_tiny trains
                       model={"path": str(tiny_model_dir), "lora": {"r": 4, "alpha": 8}})
    _, s = run_tiny(cfg)
    out = tmp_path / "shopper-export"
    assert main(["export", str(Path(cfg.run.output_dir, "toy")), "--role", "user", "--merge", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([make_tokenizer()("hello 7")["input_ids"]])
    with s.roles["user"].switch(), torch.no_grad():
        theirs = s.model(ids).logits
    assert torch.allclose(exported(ids).logits, theirs, atol=1e-5)
    assert main(["export", str(Path(cfg.run.output_dir, "toy")), "--role", "judge", "--merge", str(tmp_path / "x")]) == 2
    assert "no such role" in capsys.readouterr().err


def peer_config(tmp_path, steps, **sections):
    peer = {"model": "adapter", "rollouts": True, "max_new_tokens": 6, "temperature": 1.0, "trainer": {"lr": 1e-2},
            "reward": {"components": [{"name": "contains_7"}], "accuracy_component": "contains_7"}}
    return toy_run_config(tmp_path, steps, num_train=16, model={"lora": {"r": 4, "alpha": 8}}, roles={"peer": peer},
                          rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6}, **sections)


def test_a_peer_role_rolls_out_the_steps_prompts_and_learns_beside_the_policy(tmp_path, monkeypatch):
    import lmrl.loops.roles as roles

    played, own_rollouts = [], roles.own_rollouts
    monkeypatch.setattr(roles, "own_rollouts", lambda *a: played.append(own_rollouts(*a)) or played[-1])
    rows, s = run_tiny(peer_config(tmp_path, 2))
    done = steps_of(rows)
    assert [r["role/peer/samples"] for r in done] == [8.0, 8.0]  # 2 prompts × group_size 4, as the policy's
    assert all("role/peer/accuracy" in r and "accuracy" in r for r in done)
    groups = played[0]
    assert all(g.uid.startswith("peer/") and len(g.samples) == 4 for g in groups)
    assert all(x.role == "peer" and x.prompt_ids == g.row["prompt_ids"] for g in groups for x in g.samples)
    assert s.roles["peer"].learner.optimizer_steps == 2 and s.learner.optimizer_steps == 2


def test_a_run_with_a_peer_resumes_to_the_straight_runs_metrics(tmp_path):
    straight, _ = run_tiny(peer_config(tmp_path / "a", 2))
    cfg = peer_config(tmp_path / "b", 2, run={"output_dir": str(tmp_path / "b" / "runs"), "name": "toy",
                                             "progress": False, "checkpoint_every": 1})
    run_tiny(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 1})}))
    resumed, _ = run_tiny(cfg, resume=cfg.run.output_dir + "/toy")
    keep = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "tokens_per_s")) and k != "time"}  # noqa: E731
    assert [keep(r) for r in steps_of(straight)] == [keep(r) for r in steps_of(resumed)]


def test_a_role_on_the_base_of_a_bf16_policy_answers_under_the_policys_autocast(tmp_path):
    rows, _ = run_tiny(roles_config(tmp_path, 1, trainer={"steps": 1, "lr": 3e-3, "bf16": True, "seed": 1}))
    (row,) = steps_of(rows)
    assert row["env/error"] == 0.0 and row["role/user/samples"] == 8.0


def test_an_evaluations_episodes_call_the_roles_without_recording_them(tmp_path):
    cfg = roles_config(tmp_path, 2, eval={"at_start": True, "every": 1, "at_end": False})
    rows, _ = run_tiny(cfg)
    assert any("eval/accuracy" in r for r in rows)  # the held-out episodes ran and asked the user role
    assert [r["role/user/samples"] for r in steps_of(rows)] == [8.0, 8.0]  # the steps' own 2 × 4 episodes only


def test_phases_the_role_trains_in_its_steps_and_the_policy_in_its_own(tmp_path):
    # cycle 2: the role trains in odd steps, the policy in even ones; 3 steps → role 2 updates, policy 1
    cfg = roles_config(tmp_path, 3, role={"trainer": {"lr": 1e-2, "train_steps": [[1, 1]], "train_cycle": 2}},
                       trainer={"steps": 3, "lr": 1e-2, "train_steps": [[2, 2]], "train_cycle": 2})
    rows, s = run_tiny(cfg)
    rows = steps_of(rows)
    assert [r["role/user/trains"] for r in rows] == [1.0, 0.0, 1.0]
    assert s.roles["user"].learner.optimizer_steps == 2 and s.learner.optimizer_steps == 1
    assert ["loss" in r for r in rows] == [False, True, False]
    assert ["role/user/loss" in r for r in rows] == [True, False, True]
    assert all("role/user/drift/kl" in r for r in rows)  # measured in its resting steps too
    assert s.roles["user"].engine.version == 3
