"""The negotiation game in the real loop on a tiny random model: two training steps, with the outcome
as the episode's reward and attributed to every turn."""
from __future__ import annotations

import json

import pytest

import lmrl.envs.negotiation  # noqa: F401  (registers the negotiation task and environment)
from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


@pytest.mark.parametrize("attribution, advantage", [("episode", "grpo"), ("delayed", "turn_discounted")])
def test_negotiation_trains_end_to_end(tmp_path, attribution, advantage):
    cfg = toy_run_config(tmp_path, 2, task={"name": "negotiation", "params": {"max_rounds": 2}},
                         env={"name": "negotiation", "params": {"max_rounds": 2, "attribution": attribution},
                              "max_turns": 2, "max_episode_tokens": 600},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
                         algo={"advantage": advantage,
                               "advantage_params": {"gamma": 0.0} if attribution == "delayed" else {}})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward/mean" in r]
    assert len(rows) == 2
    for r in rows:
        # a random model never writes a well-formed move: every turn is invalid and the deadline ends it
        assert r["env/turns"] == 2.0 and r["env/invalid"] == 1.0 and r["env/deal"] == 0.0
        assert r["env/value_share"] == 0.0 and r["env/error"] == 0.0 and r["excluded"] == 0.0
        assert r["reward/env"] == pytest.approx(-0.2)  # two invalid moves, either attribution
