"""The asynchronous loop on a tiny random model: with max_staleness 0 it is the synchronous loop bit for
bit; with staleness it learns, records versions, and resumes mid-stream exactly."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import build_stages, loop as step_loop, train
from lmrl.models import tiny_llama


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def rows(run_dir):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_of(run_dir):
    return [r for r in rows(run_dir) if "reward/mean" in r]


def params(stages):
    return {k: v.detach().clone() for k, v in stages.model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_staleness_zero_equals_the_synchronous_loop_bit_for_bit(tmp_path):
    sync_cfg = toy_run_config(tmp_path / "sync", 4)
    sync = stages_for(sync_cfg)
    train(sync_cfg, stages=sync)
    async_cfg = toy_run_config(tmp_path / "async", 4, rollout={"max_staleness": 0})
    asynchronous = stages_for(async_cfg)
    result = train(async_cfg, stages=asynchronous)
    assert_same(params(sync), params(asynchronous))
    logged = steps_of(result.run_dir)
    assert [r["async/staleness"] for r in logged] == [0.0] * 4
    sync_rewards = [r["reward/mean"] for r in steps_of(next((tmp_path / "sync" / "runs").iterdir()))]
    assert [r["reward/mean"] for r in logged] == sync_rewards


def test_staleness_bounds_the_version_gap_and_the_run_learns(tmp_path):
    cfg = toy_run_config(tmp_path, 14, rollout={"max_staleness": 2})
    stages = stages_for(cfg)
    result = train(cfg, stages=stages)
    logged = steps_of(result.run_dir)
    assert [r["async/staleness"] for r in logged] == [0.0, 1.0] + [2.0] * 12
    rewards = [r["reward/mean"] for r in logged]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards


@pytest.mark.parametrize("staleness", [1, 2])
def test_resume_mid_stream_gives_the_uninterrupted_run(tmp_path, monkeypatch, staleness):
    full_cfg = toy_run_config(tmp_path / "full", 6, rollout={"max_staleness": staleness})
    full = stages_for(full_cfg)
    full_result = train(full_cfg, stages=full)

    cfg = toy_run_config(tmp_path / "cut", 6, rollout={"max_staleness": staleness}, run={"checkpoint_every": 2})
    real_learn = step_loop.learn

    def failing_learn(s, kept, step):
        if step == 5:
            raise KeyboardInterrupt("killed")
        return real_learn(s, kept, step)

    monkeypatch.setattr(step_loop, "learn", failing_learn)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stages=stages_for(cfg))
    run_dir = next((tmp_path / "cut" / "runs").iterdir())
    state = torch.load(run_dir / "checkpoints" / "step-000004" / "state.pt", weights_only=False)
    queued = state["async"]["queue"]  # made from versions 3 (and 4) before the checkpoint: kept, not redone
    assert [r.step for r in queued] == [5, 6] and [r.version for r in queued] == [4 - staleness, 5 - staleness]

    monkeypatch.setattr(step_loop, "learn", real_learn)
    resumed = stages_for(cfg)
    train(cfg, resume=run_dir, stages=resumed)
    assert_same(params(full), params(resumed))
    assert [r["reward/mean"] for r in steps_of(full_result.run_dir)] == [r["reward/mean"] for r in steps_of(run_dir)]


@pytest.mark.parametrize("rollout", [{"max_staleness": 1}, {"max_staleness": 1, "stream_chunks": 2}],
                         ids=["whole", "chunks"])
def test_a_run_killed_between_checkpoints_saves_its_last_step_and_resumes_exactly(tmp_path, monkeypatch, rollout):
    full_cfg = toy_run_config(tmp_path / "full", 6, rollout=rollout)
    full = stages_for(full_cfg)
    full_result = train(full_cfg, stages=full)

    cfg = toy_run_config(tmp_path / "cut", 6, rollout=rollout)  # no checkpoint before the last step
    name = "learn_streamed" if "stream_chunks" in rollout else "learn"
    real = getattr(step_loop, name)

    calls = []

    def killed_at_step_4(*args):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        return real(*args)

    monkeypatch.setattr(step_loop, name, killed_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stages=stages_for(cfg))
    run_dir = next((tmp_path / "cut" / "runs").iterdir())
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000003"]
    state = torch.load(run_dir / "checkpoints" / "step-000003" / "state.pt", weights_only=False)
    queued = state["async"]["queue"]  # what step 4 had taken comes first: kept, not redone
    chunks = rollout.get("stream_chunks", 1)
    assert [(r.step, r.chunk, r.version) for r in queued] == [(j, c, j - 2) for j in (4, 5) for c in range(chunks)]

    monkeypatch.setattr(step_loop, name, real)
    resumed = stages_for(cfg)
    train(cfg, resume=run_dir, stages=resumed)
    assert_same(params(full), params(resumed))
    assert [r["reward/mean"] for r in steps_of(full_result.run_dir)] == [r["reward/mean"] for r in steps_of(run_dir)]


def test_a_run_extended_past_its_steps_resumes_from_the_weights_it_has(tmp_path):
    cfg = toy_run_config(tmp_path, 3, rollout={"max_staleness": 2})
    result = train(cfg, stages=stages_for(cfg))
    longer = toy_run_config(tmp_path, 5, rollout={"max_staleness": 2})
    train(longer, resume=result.run_dir, stages=stages_for(longer))
    assert [r["async/staleness"] for r in steps_of(result.run_dir)] == [0.0, 1.0, 2.0, 0.0, 1.0]


def test_an_unknown_weight_transport_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="weight_transport"):
        toy_run_config(tmp_path, 2, rollout={"max_staleness": 1, "weight_transport": "carrier_pigeon"})
