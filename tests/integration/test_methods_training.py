"""The real loop on a tiny random model with the losses of methods_control / methods_group that the
loop can feed today (output_reset, gft, acrl): reward rises on a toy task, and each method's own
metrics reach the run's metrics file."""
from __future__ import annotations

import json
import math

import pytest

from conftest import make_tokenizer, write_toy_task
from lmrl.config import build_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS


def _contains_seven(sample, **_):
    return float("7" in sample.info["text"])


if "contains_7" not in REWARD_FNS:
    REWARD_FNS.register("contains_7", "toy reward for tests")(_contains_seven)


def toy_config(tmp_path, steps, algo, trainer):
    tree = {
        "recipe": "toy",
        "task": {"name": "jsonl", "dataset": str(write_toy_task(tmp_path / "toy.jsonl")), "system_prompt": None,
                 "num_eval": 8, "num_train": 56},
        "reward": {"components": [{"name": "contains_7"}], "accuracy_component": "contains_7"},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 6},
        "algo": algo,
        "trainer": {"steps": steps, "lr": 3e-3, "bf16": False, "seed": 1, **trainer},
        "eval": {"at_start": False, "at_end": False},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False, "checkpoint_every": 0},
    }
    return build_config(tree)


def train_toy(tmp_path, algo, trainer, steps=15):
    cfg = toy_config(tmp_path, steps, algo, trainer)
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    return [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


# With one optimiser step per batch logp = logp_roll, where Output Reset's gradient is 0.4× the PPO
# one (Adam makes that the same step); two mini-batches let the second one start past ℓ = 0.
METHODS = [
    ({"loss": "output_reset", "loss_params": {"or_margin": 0.2}}, {"mini_batches": 2}, "or/active_frac"),
    ({"loss": "gft", "loss_params": {"gft_tau": 0.1}}, {}, "gft/coef_mean"),
    ({"loss": "acrl", "loss_params": {"acrl_band": 2.0}}, {}, "acrl/discrepancy"),
]


@pytest.mark.parametrize("algo, trainer, metric", METHODS, ids=[a["loss"] for a, _, _ in METHODS])
def test_tiny_model_learns_toy_task(tmp_path, algo, trainer, metric):
    rows = [r for r in train_toy(tmp_path, algo, trainer) if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, (algo, rewards)
    assert all(r["skipped_updates"] == 0 for r in rows)
    values = [r[metric] for r in rows if metric in r]
    assert values and all(math.isfinite(v) for v in values)
