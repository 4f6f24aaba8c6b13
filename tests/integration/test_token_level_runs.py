"""TLPO's token pairs and StructPO's estimator in the real step loop, on a tiny random model whose vocabulary mixes
Latin and Cyrillic letters: pairs are mined from its own rollouts, trained by token-DPO or unlikelihood, and only
the error positions' tokens move the weights' objective."""
from __future__ import annotations

import json

import pytest

from conftest import CHARS, make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

MIXED = CHARS + list("абвгдежзик")


def run(cfg):
    tok = make_tokenizer(MIXED)
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r], stages


@pytest.mark.parametrize("term, metric", [("dpo", "pref/loss"), ("unlikelihood", "tlpo/unlikelihood")])
def test_token_pairs_are_mined_and_trained(tmp_path, term, metric):
    cfg = toy_run_config(tmp_path, 2, batches={"source": "token_pairs", "params": {"lang": "en", "k": 5, "m": 3}},
                         algo={"terms": [{"name": term}]}, rollout={"group_size": 2, "max_new_tokens": 8})
    rows, _ = run(cfg)
    assert len(rows) == 2
    mined = [r for r in rows if r.get("tlpo/pairs", 0) > 0]
    assert mined, f"no token pair was mined: {rows}"
    for r in mined:
        assert r["tlpo/pairs"] + r["tlpo/no_alternative"] + r["tlpo/over_max_positions"] == r["tlpo/error_positions"]
        assert metric in r and r["grad_norm"] > 0
    if term == "dpo":  # the first update starts at the reference: token-DPO is log 2 there
        assert mined[0]["pref/loss"] == pytest.approx(0.6931, abs=1e-3)


def test_structpo_runs_in_the_loop_with_the_rule_scorer(tmp_path):
    cfg = toy_run_config(tmp_path, 2, reward={"components": [{"name": "structpo_rules", "params": {
        "stages": ["a", "b"], "min_words": 2}}], "accuracy_component": "structpo_rules/global"},
        algo={"advantage": "structpo", "advantage_params": {"stages": ["a", "b"]}},
        task={"name": "staged_abstracts", "num_eval": 2, "num_train": 8}, rollout={"group_size": 4})
    rows, _ = run(cfg)
    assert len(rows) == 2 and all("advantage/abs_mean" in r for r in rows)
