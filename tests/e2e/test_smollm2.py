"""End to end with the embedded SmolLM2-135M: the CLI trains a few steps, checkpoints, reports, evaluates."""
from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from lmrl.cli import main
from lmrl.models.checkpoint_dirs import latest_checkpoint

pytestmark = pytest.mark.e2e

SMALL = ["trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
         "task.num_eval=4", "task.num_train=16", "run.progress=false"]


def test_cli_train_report_eval(tmp_path, capsys):
    args = ["train", "quickstart", *SMALL, f"run.output_dir={tmp_path}", "run.name=e2e"]
    assert main(args) == 0
    run = tmp_path / "e2e"
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["response_length/mean"] > 0 and r["tokens_per_s"] > 0 for r in steps)
    assert sum("eval/accuracy" in r for r in rows) == 2  # before and after
    assert "held-out greedy accuracy (4 prompts)" in capsys.readouterr().err
    ckpt = latest_checkpoint(run / "checkpoints")
    assert ckpt is not None and ckpt.name == "step-000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    assert model.config.vocab_size == 49152

    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    assert "data:image/png;base64," in html

    assert main(["eval", "quickstart", "task.num_eval=4", "rollout.max_new_tokens=8", "--model", str(ckpt / "model"),
                 "--samples", "2", "--k", "[1,2]"]) == 0
    out = capsys.readouterr().out
    assert "eval/accuracy" in out and "eval/pass@2" in out


def test_resume_continues_the_cli_run(tmp_path):
    base = ["train", "quickstart", *SMALL, f"run.output_dir={tmp_path}", "run.name=r", "eval.at_start=false",
            "eval.at_end=false", "run.checkpoint_every=1"]
    assert main(base) == 0
    assert main(["train", "--resume", str(tmp_path / "r"), "trainer.steps=3"]) == 0  # the run's own config
    rows = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
