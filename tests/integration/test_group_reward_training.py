"""Label-free training in the real loop: a tiny model trains with `majority_vote`, gold never used.

Two runs with the same seed differ only in their gold answers (one deliberately wrong): the
training rewards, and so the trained weights, must be identical; only the logged accuracy
(the `answer` component at weight 0) may see the gold answers.
"""
from __future__ import annotations

import json

import torch

from conftest import make_tokenizer
from lmrl.loading import build_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama

FIRST_CHAR = r"^\s*(\S)"  # the "answer" of a random tiny model: its first visible character


def label_free_config(tmp_path, gold: str, steps: int = 3):
    tmp_path.mkdir(parents=True, exist_ok=True)
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"question": f"q{i % 10} say 7", "answer": gold}) + "\n" for i in range(64)))
    return build_config({
        "recipe": "label_free_toy",
        "task": {"name": "jsonl", "dataset": str(task), "system_prompt": None, "num_eval": 8, "num_train": 56},
        "reward": {"components": [
            {"name": "majority_vote", "params": {"pattern": FIRST_CHAR, "compare": "exact"}},
            {"name": "answer", "weight": 0.0, "params": {"pattern": FIRST_CHAR}},
        ], "accuracy_component": "answer"},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 6},
        "trainer": {"steps": steps, "lr": 3e-3, "bf16": False, "seed": 1},
        "eval": {"at_start": False, "at_end": True},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False, "checkpoint_every": 0},
    })


def run(cfg):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return stages, [r for r in rows if "reward/mean" in r], result


def test_majority_vote_trains_without_reading_gold(tmp_path):
    right, right_rows, right_result = run(label_free_config(tmp_path / "right", gold="7"))
    wrong, wrong_rows, _ = run(label_free_config(tmp_path / "wrong", gold="zz wrong"))

    assert len(right_rows) == 3 and all(r["skipped_updates"] == 0 for r in right_rows)
    votes = [r["reward/majority_vote"] for r in right_rows]
    assert all(0.0 < v <= 1.0 for v in votes)  # groups do agree, so there is a training signal
    assert [r["reward/mean"] for r in right_rows] == votes  # the answer component weighs nothing
    # the deliberately wrong gold answers change nothing that trains ...
    assert votes == [r["reward/majority_vote"] for r in wrong_rows]
    for (name, a), (_, b) in zip(right.model.named_parameters(), wrong.model.named_parameters()):
        assert torch.equal(a, b), name
    # ... while accuracy against gold is still logged, and can never be met by the wrong gold
    assert all("reward/answer" in r and "accuracy" in r for r in right_rows)
    assert all(r["accuracy"] == 0.0 for r in wrong_rows)
    assert "eval/accuracy" in right_result.eval_after
