"""Killed at any moment, nothing lost: a real `lmrl train` process is SIGKILLed again and again (at
start-up, mid-step, during evaluation, while a checkpoint is being written) and resumed each time with
`lmrl train --resume RUN`. It must end with the weights, optimiser state and logs of a run that was
never interrupted: bit-identical tensors, the same metric rows, none missing or duplicated.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import make_tokenizer, write_toy_task
from lmrl.models.checkpoint_dirs import latest_checkpoint
from lmrl.models import tiny_llama

STEPS = 40
KILLS = 12
REWARDS = '''
def contains_seven(sample, **_):
    """1 if the completion contains a 7."""
    return float("7" in sample.info["text"])
'''
TIMING = ("time", "timing/", "tokens_per_s")  # wall-clock readings differ between any two runs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("soak")
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "toy_rewards.py").write_text(REWARDS)
    reward = "toy_rewards.py:contains_seven"
    recipe = {
        "model": {"path": str(root / "model")},
        "task": {"name": "jsonl", "dataset": str(write_toy_task(root / "toy.jsonl")), "system_prompt": None,
                 "num_eval": 4, "num_train": 56},
        "reward": {"components": [{"name": reward}], "accuracy_component": reward},
        "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 6},
        "trainer": {"steps": STEPS, "lr": 3e-3, "bf16": False, "seed": 1},
        "eval": {"at_start": True, "at_end": True, "every": 7},
        "run": {"output_dir": "runs", "progress": False, "checkpoint_every": 1, "keep_checkpoints": 2},
    }
    (root / "soak.yaml").write_text(yaml.safe_dump(recipe))
    return root


def lmrl(workdir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "lmrl.cli", "train", *args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def kill_when(proc: subprocess.Popen, run: Path, mode: str, rng: random.Random) -> bool:
    """SIGKILL `proc` at a moment chosen by `mode`; True if a checkpoint was being written at that moment."""
    logged_at_start = size(run / "metrics.jsonl")
    deadline = time.monotonic() + 120
    if mode == "startup":
        time.sleep(rng.uniform(0.0, 2.5))
    while mode != "startup" and proc.poll() is None and time.monotonic() < deadline:
        if mode == "checkpoint" and any(p.name.startswith(".tmp-") for p in (run / "checkpoints").glob(".*")):
            break
        if mode == "step" and size(run / "metrics.jsonl") != logged_at_start:
            time.sleep(rng.uniform(0.0, 0.1))
            break
        time.sleep(0.001)
    writing = any(p.name.startswith(".tmp-") for p in (run / "checkpoints").glob(".*"))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return writing


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)}
            for line in path.read_text().splitlines()]


def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(workdir):
    finish(lmrl(workdir, "soak.yaml", "run.name=whole"))
    rng = random.Random(0)
    killed = workdir / "runs" / "killed"
    proc = lmrl(workdir, "soak.yaml", "run.name=killed")
    modes = ["step", "checkpoint", "startup", "step", "checkpoint", "step", "step", "checkpoint", "startup", "step",
             "checkpoint", "step"]
    during_write = 0
    for number, mode in enumerate(modes[:KILLS], 1):
        assert proc.poll() is None, f"the run ended before kill {number} of {KILLS}"
        during_write += kill_when(proc, killed, mode, rng)
        started = (killed / "config.yaml").exists()
        proc = lmrl(workdir, "--resume", str(killed)) if started else lmrl(workdir, "soak.yaml", "run.name=killed")
    finish(proc)

    assert during_write >= 3, "too few kills landed inside a checkpoint write"
    whole, resumed = latest_checkpoint(workdir / "runs" / "whole" / "checkpoints"), latest_checkpoint(killed / "checkpoints")
    assert resumed.name == whole.name == f"step-{STEPS:06d}"
    a, b = load_file(str(whole / "model" / "model.safetensors")), load_file(str(resumed / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    opt_a = torch.load(whole / "optim.pt", weights_only=False)["optimizer"]["state"]
    opt_b = torch.load(resumed / "optim.pt", weights_only=False)["optimizer"]["state"]
    for index in opt_a:
        for key in opt_a[index]:
            assert torch.equal(opt_a[index][key], opt_b[index][key]), (index, key)
    metrics_a, metrics_b = rows(workdir / "runs" / "whole" / "metrics.jsonl"), rows(killed / "metrics.jsonl")
    assert [r["step"] for r in metrics_b] == [r["step"] for r in metrics_a]
    assert metrics_b == metrics_a
    assert rows(killed / "samples.jsonl") == rows(workdir / "runs" / "whole" / "samples.jsonl")
    assert not [p for p in (killed / "checkpoints").iterdir() if p.name.startswith(".")]  # no leftovers


def test_resuming_a_finished_run_changes_nothing(workdir):
    run = workdir / "runs" / "whole"
    if not run.exists():
        finish(lmrl(workdir, "soak.yaml", "run.name=whole"))
    before = (run / "metrics.jsonl").read_text()
    finish(lmrl(workdir, "--resume", str(run)))
    assert (run / "metrics.jsonl").read_text() == before
