"""Streaming consumption and multi-version batches in the asynchronous loop, on a tiny random model:
a batch trained chunk by chunk gives the whole-batch update, configurations where it would not are
refused, `versions: newest` mixes versions within the staleness bound, and a streamed run resumes
mid-stream exactly."""
from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import background, build_stages, loop as step_loop, train
from lmrl.models import tiny_llama

LR = 3e-3  # toy_run_config's learning rate


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def steps_of(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def params(stages):
    return {k: v.detach().clone() for k, v in stages.model.state_dict().items()}


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo"])  # token_mean, horizon, seq_mean_token_mean
def test_streaming_gives_the_whole_batch_update(tmp_path, preset):
    # Two chunks are sampled like a pool of two rollout workers (same split, same seeds), so the
    # non-streaming run with that pool trains on the very same batches, whole.
    algo = {"preset": preset}
    streamed_cfg = toy_run_config(tmp_path / "streamed", 2, algo=algo, rollout={"max_staleness": 1, "stream_chunks": 2})
    whole_cfg = toy_run_config(tmp_path / "whole", 2, algo=algo, rollout={"max_staleness": 1},
                               dist={"backend": "local", "rollout_workers": 2})
    streamed, whole = stages_for(streamed_cfg), stages_for(whole_cfg)
    streamed_log = steps_of(train(streamed_cfg, stages=streamed).run_dir)
    whole_log = steps_of(train(whole_cfg, stages=whole).run_dir)
    for a, b in zip(streamed_log, whole_log):  # the same samples (both batches come from version 0)...
        assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
        for key in ("grad_norm", "advantage/abs_mean", "mismatch_kl", "entropy"):  # ...and the same gradient
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    # The gradients, kept by AdamW's first moments (0.1·(0.9·g1 + g2)), agree to float32 rounding (chunks pack
    # other micro-batches and divide by the denominator last; seen <= 2e-6 of the largest). A wrong
    # denominator would be off by a factor, which Adam's scale invariance hides in the weights but not here.
    moments = [torch.cat([s.learner.optimizer.state[p]["exp_avg"].flatten() for p in s.model.parameters()])
               for s in (streamed, whole)]
    assert float((moments[0] - moments[1]).abs().max()) <= 1e-5 * float(moments[1].abs().max())
    # Weights: not bit-exact, as AdamW's step lr·g/(|g|+eps) turns that rounding, in an element whose gradient is
    # near eps = 1e-8, into a visible fraction of lr (seen <= 4e-3·lr, where |g| ~ 1e-8)
    a, b = params(streamed), params(whole)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=2e-2 * LR, msg=k)
    assert {"async/stream_overlap_s", "async/stream_lead_s", "async/stream_wait_s"} <= streamed_log[0].keys()
    assert "sampler/epoch" in streamed_log[0]  # the sampler reports once per step, as in the other loops


@pytest.mark.parametrize("overrides, reason", [
    ({"algo": {"preset": "reinforce_pp"}}, "does not declare group_local"),
    ({"algo": {"preset": "dapo"}}, "data.group_filter=nonzero_std re-rolls"),
    ({"trainer": {"mini_batches": 2}}, "trainer.epochs and trainer.mini_batches must be 1"),
    ({"algo": {"preset": "sgt"}}, "data.demonstrations=rescue"),
    ({"algo": {"group_by": "answer"}}, "algo.group_by"),
    ({"algo": {"preset": "ppo"}}, "algo.critic"),
])
def test_streaming_is_refused_where_it_would_change_the_update(tmp_path, overrides, reason):
    with pytest.raises(ConfigError, match=reason):  # when the config is read (also by lmrl train --dry-run)
        toy_run_config(tmp_path, 2, rollout={"max_staleness": 1, "stream_chunks": 2}, **overrides)


def test_the_config_refuses_streaming_outside_the_asynchronous_loop(tmp_path):
    for rollout, reason in [({"stream_chunks": 2}, "set rollout.max_staleness"),
                            ({"versions": "newest"}, "set rollout.max_staleness"),
                            ({"max_staleness": 1, "stream_chunks": 5}, "exceeds prompts_per_step")]:
        with pytest.raises(ConfigError, match=reason):
            toy_run_config(tmp_path, 2, rollout=rollout)


def test_newest_versions_mix_within_a_batch_and_keep_the_bound(tmp_path, monkeypatch):
    k = 2
    real_collect, real_learn = background.collect_chunk, step_loop.learn_streamed

    def slow_collect(*args):  # rollouts take time, so a new version can be published mid-batch...
        time.sleep(0.05)
        return real_collect(*args)

    def slow_learn(*args):  # ...and the learner is slower still
        time.sleep(0.15)
        return real_learn(*args)

    monkeypatch.setattr(background, "collect_chunk", slow_collect)
    monkeypatch.setattr(step_loop, "learn_streamed", slow_learn)
    cfg = toy_run_config(tmp_path, 8, rollout={"max_staleness": k, "stream_chunks": 4, "versions": "newest"},
                         run={"save_rollouts": True})
    result = train(cfg, stages=stages_for(cfg))
    versions: dict[int, set[int]] = {}
    for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines():
        group = json.loads(line)  # every sample's recorded version reaches the rollout log
        for sample in group["rollouts"]:
            version = set(sample["policy_version"])
            assert len(version) == 1 and 0 <= group["step"] - 1 - min(version) <= k
            versions.setdefault(group["step"], set()).update(version)
    assert max(len(v) for v in versions.values()) >= 2, versions
    logged = steps_of(result.run_dir)
    assert [r["async/versions"] for r in logged] == [float(len(versions[r["step"]])) for r in logged]
    assert all(r["async/staleness_max"] <= k for r in logged)


@pytest.mark.parametrize("versions", ["fixed", "newest"])
def test_streamed_resume_mid_stream_gives_the_uninterrupted_run(tmp_path, monkeypatch, versions):
    rollout = {"max_staleness": 1, "stream_chunks": 2, "versions": versions}
    full_cfg = toy_run_config(tmp_path / "full", 6, rollout=rollout)
    full = stages_for(full_cfg)
    full_result = train(full_cfg, stages=full)

    cfg = toy_run_config(tmp_path / "cut", 6, rollout=rollout, run={"checkpoint_every": 2})
    real_learn = step_loop.learn_streamed

    def failing_learn(s, producer, first):
        if first.step == 5:
            raise KeyboardInterrupt("killed")
        return real_learn(s, producer, first)

    monkeypatch.setattr(step_loop, "learn_streamed", failing_learn)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stages=stages_for(cfg))
    run_dir = next((tmp_path / "cut" / "runs").iterdir())
    state = torch.load(run_dir / "checkpoints" / "step-000004" / "state.pt", weights_only=False)
    queued = state["async"]["queue"]  # whole steps, chunk by chunk: nothing half-made
    assert [(r.step, r.chunk) for r in queued] == [(5, 0), (5, 1), (6, 0), (6, 1)]

    monkeypatch.setattr(step_loop, "learn_streamed", real_learn)
    resumed = stages_for(cfg)
    train(cfg, resume=run_dir, stages=resumed)
    if versions == "newest":  # timing picks the versions: the bound and the step count are what hold
        assert all(r["async/staleness_max"] <= 1 for r in steps_of(run_dir))
        assert [r["step"] for r in steps_of(run_dir)] == list(range(1, 7))
        return
    a, b = params(full), params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["reward/mean"] for r in steps_of(full_result.run_dir)] == [r["reward/mean"] for r in steps_of(run_dir)]
