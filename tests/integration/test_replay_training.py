"""Offline training from recorded rollouts through the real loop: a tiny-model run writes rollouts.jsonl
(`run.save_rollouts`), rewound without duplicates on resume; a second run trains on them with REGEN's loss
(the file as its task, `data.demonstrations: replay`), and CoAct's self-consistency reward trains in the loop."""
from __future__ import annotations

import json
import math
import shutil

from conftest import make_tokenizer, toy_run_config
from lmrl.models.checkpoint_dirs import list_checkpoints
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


def run(cfg, resume=None):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    return train(cfg, resume=resume, stages=stages).run_dir


def lines(path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_rollouts_are_written_then_trained_on_offline(tmp_path):
    teacher = run(toy_run_config(tmp_path / "teacher", 2, run={"save_rollouts": True}))
    records = lines(teacher / "rollouts.jsonl")
    assert [r["step"] for r in records] == [1] * 4 + [2] * 4  # prompts_per_step groups a step
    assert all(len(r["rollouts"]) == 8 and r["uid"] == f"{r['row_uid']}@{r['step']}" for r in records)
    first = records[0]["rollouts"][0]
    assert len(first["behaviour_logprobs"]) == len(first["completion_ids"]) and first["policy_version"]
    assert all(x < 0 for x in first["behaviour_logprobs"])

    cfg = toy_run_config(tmp_path / "student", 2, dataset=teacher / "rollouts.jsonl", num_eval=0, num_train=8,
                         data={"demonstrations": "replay"}, rollout={"group_size": 2},
                         algo={"loss": "regen", "aggregation": "seq_mean_token_sum",
                               "loss_params": {"regen_alpha": 1.0}})
    rows = [r for r in lines(run(cfg) / "metrics.jsonl") if "replay/samples" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["replay/samples"] == 4 * 8  # the recorded groups, not the 2 fresh rollouts of each prompt
        assert r["skipped_updates"] == 0
        assert all(math.isfinite(r[k]) for k in ("pg_loss", "grad_norm", "regen/ratio_mean", "replay/reward"))
        assert 0 < r["regen/ratio_mean"] <= 10.0  # π_θ/μ against the recorded behaviour log-probs


def test_a_resumed_run_rewinds_its_rollouts(tmp_path):
    cfg = toy_run_config(tmp_path, 3, run={"save_rollouts": True, "checkpoint_every": 2, "keep_checkpoints": 2})
    path = run(cfg)
    shutil.rmtree(list_checkpoints(path / "checkpoints")[-1])  # killed after step 3, before its checkpoint
    run(cfg, resume=path)
    assert [r["step"] for r in lines(path / "rollouts.jsonl")] == [1] * 4 + [2] * 4 + [3] * 4


def test_coact_reward_trains_and_logs_its_oracle_share(tmp_path):
    cfg = toy_run_config(tmp_path, 3, reward={"components": [{"name": "coact", "params": {"pattern": r"(\d)"}},
                                                             {"name": "contains_7", "weight": 0.0}]})
    rows = [r for r in lines(run(cfg) / "metrics.jsonl") if "coact/oracle" in r]
    assert len(rows) == 3
    for r in rows:
        assert 0.0 <= r["coact/oracle"] <= 1.0 and 0.0 <= r["coact/self_label"] + r["coact/oracle"] <= 1.0
        assert math.isfinite(r["coact/agreement"])
