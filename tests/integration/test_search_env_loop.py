"""The search environment in the real loop: two training steps on a tiny random model over the fictional atlas."""
from __future__ import annotations

import json

import lmrl.envs.search  # noqa: F401  (registers the search environment and the search_qa task)
from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


def test_search_trains_end_to_end(tmp_path):
    cfg = toy_run_config(tmp_path, 2, task={"name": "search_qa", "num_train": 16, "num_eval": 0},
                         env={"name": "search", "params": {"top_k": 2}, "max_turns": 3, "max_episode_tokens": 400},
                         reward={"components": [{"name": "env"}], "accuracy_component": "env"},
                         rollout={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [r for r in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines())
            if "reward/mean" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["env/error"] == 0.0 and r["excluded"] == 0.0 and "reward/env" in r
        assert {"env/searches", "env/answered", "env/exact_match", "env/gold_retrieved"} <= set(r)
