"""A judge trained by RL through the real loop: a tiny-model run records its rollouts, `task_files` writes judge
rows and rubric rows from them, and the shipped `grrm_judge` and `evolm_generator` recipes train 2 steps on them
(the rubric generator against a scripted frozen judge)."""
from __future__ import annotations

import json
import math

from conftest import ScriptedJudge, make_tokenizer, save_tiny_model, toy_run_config
from lmrl.loading import load_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.task_files import main as task_files


def run(cfg, judge=None) -> list[dict]:
    """Train `cfg` on the tiny model; `judge` replaces the first reward component's judge client."""
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    if judge is not None:
        stages.scorer.components[0].instance.client = judge
    lines = (train(cfg, stages=stages).run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "reward/mean" in row]


def recorded_rollouts(tmp_path):
    cfg = toy_run_config(tmp_path / "teacher", 3, run={"save_rollouts": True}, rollout={"max_new_tokens": 4})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    return train(cfg, stages=stages).run_dir / "rollouts.jsonl"


def shipped(tmp_path, name, dataset, **overrides):
    model = save_tiny_model(tmp_path / "model")
    tree = {"model.path": model, "task.dataset": dataset, "task.num_eval": 0, "trainer.steps": 2,
            "trainer.bf16": False, "rollout.prompts_per_step": 2, "rollout.max_new_tokens": 8,
            "eval.at_start": False, "eval.at_end": False, "run.output_dir": tmp_path / "runs", "run.name": name,
            "run.progress": False, "run.checkpoint_every": 0, **overrides}
    return load_config(name, [f"{k}={v}" for k, v in tree.items()])


def test_grrm_judge_recipe_trains_on_judge_rows_of_recorded_rollouts(tmp_path):
    rows = tmp_path / "judge_rows.jsonl"
    assert task_files(["judge_rows", str(rows), "--rollouts", str(recorded_rollouts(tmp_path)),
                       "--max-candidates", "3"]) == 0
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(written) >= 2 and all(len(r["reference_scores"]) >= 2 for r in written)
    steps = run(shipped(tmp_path, "grrm_judge", rows, **{"task.max_prompt_tokens": 500}))
    assert len(steps) == 2
    for step in steps:
        assert 0.0 <= step["reward/grrm_rm"] <= 2.0 and step["grrm_rm/unparsed"] == 1.0  # a random model's replies
        assert math.isfinite(step["grad_norm"])


def test_evolm_generator_recipe_trains_against_a_frozen_judge(tmp_path):
    rollouts = recorded_rollouts(tmp_path)
    rows = tmp_path / "rubric_rows.jsonl"
    assert task_files(["rubric_rows", str(rows), "--current", str(rollouts)]) == 0
    judge = ScriptedJudge(lambda text, _: f"Score: {1 + len(text.split('Response:')[1]) % 10}")
    steps = run(shipped(tmp_path, "evolm_generator", rows), judge)
    assert len(steps) == 2
    assert all(0.0 <= s["reward/evolm_generator"] <= 1.0 and math.isfinite(s["grad_norm"]) for s in steps)
    rubrics = sum(round(8 * (1 - s["evolm_generator/empty_rubric"])) for s in steps)  # 2 prompts x 4 rubrics a step
    assert len(judge.calls) == 2 * rubrics  # J(y+|R) and J(y-|R) for each rubric that is not empty
