"""benchmarks/interpolation_sweep.py on tiny models: one row per λ, the endpoints evaluated as themselves."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from conftest import make_tokenizer, write_toy_task
from lmrl.models import tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "interpolation_sweep.py"


def load_script():
    spec = importlib.util.spec_from_file_location("interpolation_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save_tiny(path, seed):
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_sweep_evaluates_each_lambda_on_held_out_prompts(tmp_path):
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(yaml.safe_dump({
        "description": "toy", "task": {"name": "jsonl", "dataset": str(write_toy_task(tmp_path / "toy.jsonl", 16)),
                                       "system_prompt": None, "num_eval": 4, "num_train": 12},
        "reward": {"components": [{"name": "answer", "params": {"fallback": "last_number"}}]},
        "rollout": {"max_new_tokens": 4}, "trainer": {"bf16": False, "device": "cpu"}}))
    sft, rl = save_tiny(tmp_path / "sft", 0), save_tiny(tmp_path / "rl", 1)
    sweep = load_script()
    out = tmp_path / "sweep.md"
    rows = sweep.main([sft, rl, "--recipe", str(recipe), "--out", str(out), "eval.num_prompts=3"])
    assert [r["lambda"] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [r["distance"] for r in rows] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0], abs=1e-6)
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 and r["eval/num_prompts"] == 3 for r in rows)
    assert out.read_text().count("\n| ") == 6  # header and five λ rows
    same = sweep.sweep(sft, sft, str(recipe), lambdas=(0.5,))[0]  # θ_SFT merged with itself is θ_SFT
    assert same["eval/response_length"] == rows[0]["eval/response_length"]
    assert sweep.sweep(sft, rl, str(recipe), lambdas=(0.5,), method="slerp")[0]["distance"] > 0
