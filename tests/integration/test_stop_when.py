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


METRIC = "eval/pass@1"  # of sampled replies, graded by contains_7 (weight 0), while the run learns to avoid 7s


def lacks_seven(sample, **_):
    return float("7" not in sample.text)


def test_an_evaluation_rule_ends_the_run_at_that_evaluation_and_a_resume_remembers_the_best(tmp_path):
    """A `drop` rule on a held-out metric that falls as the run trains: the run stops at the evaluation that falls
    more than `drop` below the best. Killed before that step (trainer.steps lower) and resumed to the full length,
    the run stops at the same step: the rule's memory of the best value is restored from the checkpoint."""
    from lmrl.rewards import REWARD_FNS

    if "lacks_7" not in REWARD_FNS:
        REWARD_FNS.register("lacks_7", "toy reward for tests")(lacks_seven)

    def config(where, steps, **rule):
        return toy_run_config(
            tmp_path / where, steps=steps, eval={"every": 1, "at_end": True, "samples": 4, "pass_k": [1]},
            reward={"components": [{"name": "lacks_7"}, {"name": "contains_7", "weight": 0.0}]},
            run={"checkpoint_every": 1}, trainer={"stop_when": [{"metric": METRIC, **rule}]})

    full = run(config("full", 8, below=-1.0))
    rows = [r for r in logged(full.run_dir) if METRIC in r]
    held_out = [r[METRIC] for r in rows]
    assert {"eval/reward/contains_7", "eval/reward/lacks_7", "eval/reward"} <= set(rows[0])
    falls = [t for t in range(1, len(held_out)) if held_out[t] < max(held_out[:t])]
    assert falls, f"the toy run's held-out pass@1 never fell: {held_out}"
    stop_at, drop = falls[0] + 1, (max(held_out[:falls[0]]) - held_out[falls[0]]) / 2
    stopped = run(config("stop", 8, drop=drop))
    assert stopped.steps == stop_at and "fell more than" in stopped.stopped
    assert list_checkpoints(stopped.run_dir / "checkpoints")[-1].name == f"step-{stop_at:06d}"
    assert stopped.eval_after[METRIC] == held_out[falls[0]]

    run(config("resumed", stop_at - 1, drop=drop))  # the run killed before the fall
    resumed = run(config("resumed", 8, drop=drop), resume=tmp_path / "resumed/runs/toy")
    assert resumed.steps == stop_at and resumed.stopped == stopped.stopped


def test_an_evaluation_rule_needs_periodic_evaluation(tmp_path):
    with pytest.raises(ConfigError, match="set eval.every"):
        toy_run_config(tmp_path, steps=2, trainer={"stop_when": [{"metric": "eval/accuracy", "drop": 0.1}]})
