"""Simulated-user environments in the real loop on tiny random models: `sales` trains with the shopper
in-process (a model directory loaded like any model argument) and over HTTP (a real `lmrl serve`
server in a thread); `doctor` trains with its per-turn rewards re-attributed at the end."""
from __future__ import annotations

import json
import threading

import pytest
import torch

import lmrl.envs.doctor  # noqa: F401  (registers the doctor environment and task)
import lmrl.envs.sales  # noqa: F401  (registers the sales environment and task)
from conftest import make_tokenizer, toy_run_config
from lmrl.envs.environment import build_env
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.serve import build_server


def tiny():
    """The tiny shopper, with room for the sales prompt (one token per character, over 512: the default)."""
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    model.config.max_position_embeddings = 4096
    return model, tok


@pytest.fixture
def model_dir(tmp_path):
    """A tiny model and its tokenizer saved as a transformers directory: a simulated user's model path."""
    model, tok = tiny()
    path = tmp_path / "user-model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def run(cfg):
    model, tok = tiny()
    result = train(cfg, stages=build_stages(cfg, model=model, tokenizer=tok))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def sales_config(tmp_path, steps, user):
    params = {"user": user, "max_turns": 2, "user_max_tokens": 6}
    return toy_run_config(tmp_path, steps, task={"name": "sales", "num_train": 8, "num_eval": 0},
                          env={"name": "sales", "params": params, "max_turns": 2, "max_episode_tokens": 128},
                          reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                          rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6})


def test_sales_trains_with_an_in_process_shopper(tmp_path, model_dir):
    rows = run(sales_config(tmp_path, 2, {"model": model_dir}))
    assert len(rows) == 2
    for r in rows:
        assert r["excluded"] == 0.0 and r["env/error"] == 0.0
        assert r["env/turns"] == 2.0 and r["env/decided"] == 0.0  # the tiny shopper never writes BUY / LEAVE
        assert 0.0 <= r["reward/env"] <= 1.0 and "env/aligned" in r and "env/recommended_acceptable" in r


def test_sales_shopper_over_http_from_lmrl_serve(tmp_path):
    model, tok = tiny()
    server = build_server(model, tok, port=0, model_name="shopper")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        user = {"base_url": url, "model": "shopper", "retries": 0, "timeout_s": 60, "api_key_env": None}
        cfg = sales_config(tmp_path, 1, user)
        rows = run(cfg)
        assert len(rows) == 1 and rows[0]["excluded"] == 0.0 and rows[0]["env/turns"] == 2.0
        client = build_env("sales", cfg.env.params).user.client  # the run's environment (built once, cached)
        assert client.stats["requests"] >= 2 * 4 and client.stats["failures"] == 0  # one request per shopper turn
    finally:
        server.shutdown()
        server.server_close()


def test_doctor_trains_with_per_turn_shapley_rewards(tmp_path, model_dir):
    params = {"scorer": {"model": model_dir}, "user": {"model": model_dir}, "max_turns": 2, "user_max_tokens": 6}
    cfg = toy_run_config(tmp_path, 2, task={"name": "doctor", "num_train": 8, "num_eval": 0},
                         env={"name": "doctor", "params": params, "max_turns": 2, "max_episode_tokens": 128},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
                         algo={"advantage": "turn_discounted", "advantage_params": {"gamma": 0.0}})
    rows = run(cfg)
    assert len(rows) == 2
    for r in rows:
        assert r["excluded"] == 0.0 and r["env/error"] == 0.0 and 1.0 <= r["env/turns"] <= 2.0
        assert "env/facts_revealed" in r and "env/gain" in r and r["env/correct"] == 0.0


def test_usergrpo_trains_the_shopper_role_against_a_frozen_salesperson(tmp_path):
    cfg = sales_config(tmp_path, 1, {"role": "shopper"})
    tree = json.loads(cfg.model_dump_json())
    tree["model"]["lora"] = {"r": 4, "alpha": 8}
    tree["trainer"]["train_steps"] = []
    tree["roles"] = {"shopper": {"model": "adapter", "max_new_tokens": 6, "trainer": {"lr": 1e-2},
                                 "reward": {"components": [{"name": "shopper_fidelity"}],
                                            "accuracy_component": "shopper_fidelity"}}}
    from lmrl.loading import build_config

    cfg = build_config(tree)
    model, tok = tiny()
    stages = build_stages(cfg, model=model, tokenizer=tok)
    before = {k: v.clone() for k, v in model.named_parameters() if ".default." in k}
    result = train(cfg, stages=stages)
    (row,) = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
              if "reward/mean" in line]
    assert row["role/shopper/samples"] == 2 * 4 * 2  # 2 personas × 4 episodes × 2 shopper turns (no decision)
    assert row["role/shopper/reward/mean"] == row["env/aligned"]  # w_da = 1: the episodes' decision alignment
    assert "role/shopper/lr" in row and "lr" not in row  # the shopper's learner stepped; the salesperson has none
    assert all(torch.equal(v, before[k]) for k, v in model.named_parameters() if k in before)
    assert stages.roles["shopper"].learner.optimizer_steps == 1
