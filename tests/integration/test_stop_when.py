"""`trainer.stop_when`: the run ends after the first step whose logged metric crosses the threshold."""
from __future__ import annotations

import json

import pytest

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.learners.checkpoint import list_checkpoints
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


def run(cfg, resume=None):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    return train(cfg, resume=resume, stages=stages)


def logged(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("rollout", [{}, {"max_staleness": 1}], ids=["sync", "async"])
def test_run_stops_after_the_first_step_past_the_threshold_and_stays_stopped(tmp_path, rollout):
    full = run(toy_run_config(tmp_path / "full", steps=8, rollout=rollout))
    rewards = [r["reward/mean"] for r in logged(full.run_dir) if "reward/mean" in r]
    stop_at = next(i for i in range(1, len(rewards)) if rewards[i] > max(rewards[:i])) + 1  # a first new high
    threshold = max(rewards[:stop_at - 1])
    cfg = toy_run_config(tmp_path / "stop", steps=8, rollout=rollout, trainer={"stop_when": [{"metric": "reward/mean",
                                                                             "above": threshold}]})
    result = run(cfg)
    rows = logged(result.run_dir)
    assert result.steps == stop_at and result.stopped.startswith("reward/mean")
    assert [r["reward/mean"] for r in rows if "reward/mean" in r] == rewards[:stop_at]
    assert [r.get("stopped") is not None for r in rows if "reward/mean" in r] == [False] * (stop_at - 1) + [True]
    assert list_checkpoints(result.run_dir / "checkpoints")[-1].name == f"step-{stop_at:06d}"

    again = run(cfg, resume=result.run_dir)  # resuming a stopped run trains no further
    assert again.steps == stop_at and again.stopped == result.stopped
    assert len(logged(result.run_dir)) == len(rows)


def test_a_metric_the_step_never_logs_is_an_error_naming_the_nearest(tmp_path):
    cfg = toy_run_config(tmp_path, steps=2, trainer={"stop_when": [{"metric": "reward/meen", "above": 0.5}]})
    with pytest.raises(ConfigError, match="reward/mean"):
        run(cfg)


@pytest.mark.parametrize("rule", [{"metric": "x"}, {"metric": "x", "above": 1, "below": 0}])
def test_a_rule_needs_exactly_one_threshold(tmp_path, rule):
    with pytest.raises(Exception, match="exactly one"):
        toy_run_config(tmp_path, steps=2, trainer={"stop_when": [rule]})
