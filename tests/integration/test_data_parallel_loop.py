"""The training loop on 2 gloo ranks: each rank generates half of every batch and trains half of it, and
the run ends with the parameters of a one-process run that samples the same chunks (2 local rollout
workers) and trains the whole batch."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from conftest import toy_run_config, toy_run_on_disk
from lmrl.dist import spawn_local
from lmrl.loops import build_stages, train


def train_rank(parallel, cfg):
    result = train(cfg)
    return {"rank": parallel.rank, "run_dir": str(result.run_dir)}


def configs(tmp_path):
    common = dict(**toy_run_on_disk(tmp_path), trainer={"threads": 1, "mini_batches": 2}, eval={"at_end": True},
                  run={"checkpoint_every": 2})
    ranks = toy_run_config(tmp_path / "ranks", 3, **common)
    single = toy_run_config(tmp_path / "single", 3, dist={"backend": "local", "rollout_workers": 2}, **common)
    return ranks, single


def final_weights(run_dir):
    return load_file(str(next((run_dir / "checkpoints").glob("step-000003")) / "model" / "model.safetensors"))


def logged(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["reward/mean"] for r in rows if "reward/mean" in r], [r for r in rows if "eval/accuracy" in r]


def test_two_ranks_train_like_one_process_with_the_same_rollouts(tmp_path):
    ranks_cfg, single_cfg = configs(tmp_path)
    results = spawn_local(train_rank, 2, ranks_cfg)
    assert [r["rank"] for r in results] == [0, 1] and results[0]["run_dir"] == results[1]["run_dir"]
    ranks_dir = tmp_path / "ranks" / "runs" / "toy"
    single_result = train(single_cfg, stages=build_stages(single_cfg))

    ranks_rewards, ranks_eval = logged(ranks_dir)
    single_rewards, single_eval = logged(single_result.run_dir)
    assert len(ranks_rewards) == 3 and ranks_rewards == single_rewards  # one log, the same samples
    assert [e["eval/accuracy"] for e in ranks_eval] == [e["eval/accuracy"] for e in single_eval]
    a, b = final_weights(ranks_dir), final_weights(single_result.run_dir)
    for k in a:  # gradients are summed over ranks in another order: float32 rounding only
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
