"""Online preference pairs in the asynchronous loop: with rollout.max_staleness 0 an online DPO run is the inline
run metric for metric (to float rounding: the background sampler's forward may reduce in another order) and
weight for weight; with staleness 1 each pair's samples carry the version they were
sampled by, and streamed chunks are refused with the reason."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import build_stages, loop as step_loop, train
from lmrl.models import tiny_llama

ONLINE_DPO = {"preset": "online_dpo"}
NO_FILTER = {"group_filter": "none"}  # every prompt is paired or counted unpaired: the pairs vary step by step
# what only the asynchronous loop logs, or what depends on the clock
UNTIMED = ("time", "timing/", "async/", "tokens_per_s")


def run(cfg, monkeypatch=None):
    """The logged steps of `cfg` on a fresh tiny model, its final weights, and each step's trained groups."""
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    trained, real_learn = {}, step_loop.learn

    def recording_learn(s, kept, step):
        trained[step] = kept
        return real_learn(s, kept, step)

    if monkeypatch is not None:
        monkeypatch.setattr(step_loop, "learn", recording_learn)
    result = train(cfg, stages=stages)
    logged = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = {k: v.detach().clone() for k, v in stages.model.state_dict().items()}
    return [r for r in logged if "reward/mean" in r], weights, trained


def untimed(row):
    """The row's clock-free metrics; floats compared to 1e-7, as the sampler's forward in the background thread may
    sum in another order (seen: entropy/rollout off by 4e-9), while every count is compared exactly."""
    return {k: (pytest.approx(v, rel=1e-7, abs=1e-9) if isinstance(v, float) else v)
            for k, v in row.items() if not k.startswith(UNTIMED)}


def test_staleness_zero_gives_the_inline_runs_metrics_exactly(tmp_path):
    inline, inline_weights, _ = run(toy_run_config(tmp_path / "inline", 3, algo=ONLINE_DPO, data=NO_FILTER))
    background, weights, _ = run(toy_run_config(tmp_path / "async", 3, algo=ONLINE_DPO, data=NO_FILTER,
                                                rollout={"max_staleness": 0}))
    assert [r["async/staleness"] for r in background] == [0.0] * 3
    assert [untimed(r) for r in inline] == [{k: v for k, v in r.items() if not k.startswith(UNTIMED)}
                                            for r in background]
    assert all(r["data/pairs"] + r["data/unpaired_groups"] == 4 for r in inline) and "pref/loss" in inline[0]
    assert inline_weights.keys() == weights.keys()
    assert all(torch.equal(inline_weights[k], weights[k]) for k in weights)


def test_staleness_one_trains_pairs_of_the_versions_it_admits(tmp_path, monkeypatch):
    cfg = toy_run_config(tmp_path, 4, algo=ONLINE_DPO, data=NO_FILTER, rollout={"max_staleness": 1})
    logged, _, trained = run(cfg, monkeypatch)
    assert [r["async/staleness"] for r in logged] == [0.0, 1.0, 1.0, 1.0]
    assert [r["data/pairs"] for r in logged] == [float(len(trained[step])) for step in (1, 2, 3, 4)]
    for step, pairs in trained.items():
        version = max(0, step - 2)  # v(j) = max(0, j − 1 − k), k = 1
        for pair in pairs:
            chosen, rejected = pair.samples
            assert (chosen.info["preference"], rejected.info["preference"]) == ("chosen", "rejected")
            assert chosen.reward > rejected.reward
            assert {v for x in pair.samples for v in x.policy_version} == {version}
    assert sum(map(len, trained.values())) >= 4


def test_streamed_chunks_are_refused_with_online_pairs(tmp_path):
    with pytest.raises(ConfigError, match="rollout.stream_chunks=2: batches.source=online_pairs pairs the groups "
                                          "of a whole step"):
        toy_run_config(tmp_path, 1, algo=ONLINE_DPO, data=NO_FILTER, rollout={"max_staleness": 1, "stream_chunks": 2})
