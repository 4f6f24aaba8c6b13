"""Failure-mode guards (algos/guards.py) and rollback (loops/run_state.py): hand-checked detection, the streak,
rollback to the last good checkpoint, in the inline and the background batch source."""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_tokenizer, toy_run_config
from lmrl.algos.algorithm import Algorithm
from lmrl.algos.guards import Guard, GuardError, bad_signals, ratio_outside, Verdict
from lmrl.config import AlgoConfig, GuardConfig
from lmrl.learners.checkpoint import list_checkpoints, load_checkpoint
from lmrl.loading import load_config
from lmrl.loops import RunResult, build_stages, loop as step_loop, train
from lmrl.loops.run_dir import RunDir
from lmrl.loops.run_state import RunState
from lmrl.models import tiny_llama

LOG3 = math.log(3.0)


def test_ratio_outside_counts_valid_tokens_beyond_the_bound():
    behaviour = torch.zeros(1, 5)
    logp = torch.tensor([[0.0, LOG3, -LOG3, 0.5, 5.0]])  # ratios 1, 3, 1/3, 1.65, e^5 (masked out)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    assert ratio_outside(logp, behaviour, mask, bound=2.0) == pytest.approx(2 / 4)
    assert ratio_outside(logp, behaviour, mask, bound=4.0) == 0.0
    nan = torch.tensor([[float("nan"), 0.0, 0.0, 0.0, 0.0]])
    assert ratio_outside(nan, behaviour, mask, bound=2.0) == pytest.approx(1 / 4)  # NaN counts as outside
    assert ratio_outside(logp, behaviour, torch.zeros(1, 5), bound=2.0) == 0.0


def test_bad_signals_name_each_failure():
    cfg = GuardConfig(enabled=True, max_ratio_share=0.1, min_entropy=0.05)
    fine = {"guard/ratio_outside": 0.1, "grad_norm": 1.0, "pg_loss": 0.3, "entropy": 0.5, "skipped_updates": 0.0}
    assert bad_signals(fine, cfg) == []
    assert bad_signals({**fine, "guard/ratio_outside": 0.11}, cfg) == ["ratio"]
    assert bad_signals({**fine, "skipped_updates": 1.0}, cfg) == ["nonfinite"]  # the learner skipped a NaN step
    assert bad_signals({**fine, "grad_norm": float("nan")}, cfg) == ["nonfinite"]
    assert bad_signals({**fine, "pg_loss": float("inf")}, cfg) == ["nonfinite"]
    assert bad_signals({**fine, "entropy": 0.01}, cfg) == ["entropy"]
    assert bad_signals({**fine, "entropy": 0.01, "guard/ratio_outside": 0.5}, cfg) == ["ratio", "entropy"]
    assert bad_signals({"skipped_updates": 1.0}, cfg) == []  # no update this step (nothing scored): not a failure
    defaults = GuardConfig(enabled=True)  # entropy not checked; a share of exactly max_ratio_share is allowed
    assert bad_signals({**fine, "entropy": 0.0, "guard/ratio_outside": 0.05}, defaults) == []


def test_guard_trips_after_patience_bad_steps_in_a_row():
    guard = Guard(GuardConfig(enabled=True, patience=2, min_entropy=0.1))
    good, bad = {"grad_norm": 1.0, "entropy": 1.0}, {"grad_norm": 1.0, "entropy": 0.0}
    seen = [guard.check(step, m) for step, m in enumerate([bad, good, bad, bad, bad], start=1)]
    assert [v.tripped for v in seen] == [False, False, False, True, False]
    assert [v.since for v in seen] == [1, None, 3, 3, 5]  # a trip starts a new streak
    assert seen[3].reasons == ("entropy",) and seen[3].metrics["guard/tripped"] == 1.0
    assert seen[3].metrics["guard/entropy"] == 1.0 and seen[3].metrics["guard/ratio"] == 0.0
    assert guard.state_dict() == {"streak": 1, "since": 5, "rollbacks": 0}


def test_the_guard_is_a_checkpointed_state_that_logs_the_ratio_share():
    algo = Algorithm(AlgoConfig(guards=GuardConfig(enabled=True)), 8)
    assert isinstance(algo.states["guard"], Guard) and "guard" in algo.state_dict()
    assert "guard" not in Algorithm(AlgoConfig(), 8).states
    assert load_config("quickstart", ["algo.guards.enabled=true", "algo.guards.patience=3"]).algo.guards.patience == 3


def guarded_run(tmp_path, steps=3, **guards):
    tok = make_tokenizer()
    cfg = toy_run_config(tmp_path, steps, run={"checkpoint_every": 1, "keep_checkpoints": steps},
                         algo={"guards": {"enabled": True, **guards}})
    s = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=s)
    return s, result.run_dir


def run_state_of(s, run_dir) -> RunState:
    return RunState(s, RunDir(run_dir), RunResult(run_dir, s.cfg.trainer.steps))


def test_rollback_restores_the_last_good_checkpoint_lowers_the_lr_and_counts(tmp_path):
    s, run_dir = guarded_run(tmp_path, max_rollbacks=2)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["guard/ratio_outside"] <= 1.0 for r in rows if "grad_norm" in r)
    root = run_dir / "checkpoints"
    state = run_state_of(s, run_dir)
    saved = torch.load(list_checkpoints(root)[1] / "state.pt", weights_only=False)
    guard = s.algorithm.states["guard"]

    out = state.rollback(guard, Verdict(True, ("ratio",), 3), step=3)  # bad since step 3: step 2 is good
    assert out["guard/restored_step"] == 2.0 and out["guard/rollbacks"] == 1.0
    assert [p.name for p in list_checkpoints(root)] == ["step-000001", "step-000002"]  # the bad one is gone
    fresh = build_stages(s.cfg, model=tiny_llama(len(s.tokenizer), hidden=32, layers=2, heads=4, seed=5),
                         tokenizer=make_tokenizer())
    load_checkpoint(root / "step-000002", fresh.model, fresh.learner.optimizer, fresh.learner.scheduler)
    for (name, a), (_, b) in zip(s.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), name
    assert s.sampler.state_dict() == saved["sampler"]
    assert torch.equal(s.learner.shuffle.get_state(), saved["rng"]["generators"]["shuffle"])
    assert not torch.equal(s.generator.get_state(), saved["rng"]["generators"]["rollout"])  # new completions
    assert s.learner.optimizer.param_groups[0]["lr"] == pytest.approx(1.5e-3)  # 3e-3 × 0.5
    assert s.learner.scheduler.base_lrs == [pytest.approx(1.5e-3)]

    out = state.rollback(guard, Verdict(True, ("ratio",), 3), step=4)  # again to step 2: twice halved
    assert out["guard/rollbacks"] == 2.0 and out["guard/lr"] == pytest.approx(0.75e-3)
    with pytest.raises(GuardError, match=r"after 2 rollback\(s\) \(algo.guards.max_rollbacks=2\): stopping"):
        state.rollback(guard, Verdict(True, ("nonfinite",), 3), step=5)


def test_guard_step_rolls_back_on_a_trip_and_refuses_without_a_good_checkpoint(tmp_path):
    s, run_dir = guarded_run(tmp_path, steps=2, patience=2)
    state = run_state_of(s, run_dir)
    nan = {"grad_norm": float("nan"), "skipped_updates": 1.0}
    assert state.guard_step(3, nan)["guard/tripped"] == 0.0
    out = state.guard_step(4, nan)
    assert out["guard/tripped"] == 1.0 and out["guard/nonfinite"] == 1.0 and out["guard/restored_step"] == 2.0
    state.guard_step(5, nan)
    with pytest.raises(GuardError, match="no checkpoint from before step 1 is left"):
        state.rollback(s.algorithm.states["guard"], Verdict(True, ("nonfinite",), 1), step=6)


@pytest.mark.parametrize("rollout", [{"max_staleness": 1}, {"max_staleness": 1, "stream_chunks": 2}],
                         ids=["whole", "chunks"])
def test_a_background_run_that_trips_rolls_back_restarts_its_producer_and_goes_on(tmp_path, monkeypatch, rollout):
    tok = make_tokenizer()
    cfg = toy_run_config(tmp_path, 6, rollout=rollout, run={"checkpoint_every": 1, "keep_checkpoints": 6},
                         algo={"guards": {"enabled": True, "patience": 1}})
    s = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    name = "learn_streamed" if "stream_chunks" in rollout else "learn"
    real, calls = getattr(step_loop, name), []

    def learn_once_non_finite(*args):
        out = real(*args)
        calls.append(out)
        learned = out[1] if isinstance(out, tuple) else out
        if len(calls) == 3:  # the update of step 3 looks broken, once
            learned["grad_norm"] = float("nan")
        return out

    monkeypatch.setattr(step_loop, name, learn_once_non_finite)
    run_dir = train(cfg, stages=s).run_dir
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in logged if "reward/mean" in r]
    assert [r["step"] for r in logged] == list(range(1, 7))
    assert [r["guard/tripped"] for r in logged] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert logged[2]["guard/restored_step"] == 2.0 and logged[2]["guard/lr"] == pytest.approx(1.5e-3)
    # the restarted producer makes step 4 on from the restored weights, published as version 3
    assert [r["async/staleness"] for r in logged] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    root = run_dir / "checkpoints"
    restored, after_trip = (load_file(root / f"step-00000{step}" / "model" / "model.safetensors") for step in (2, 3))
    assert restored.keys() == after_trip.keys()  # saved after the rollback: step 2's weights
    assert all(torch.equal(restored[k], after_trip[k]) for k in restored)
