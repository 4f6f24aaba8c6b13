"""benchmarks/gpu.py waits for a lent GPU; its tiny CPU smoke run keeps it working until then."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_runs_the_real_loop_on_a_tiny_shape(tmp_path):
    out = tmp_path / "gpu.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--shapes", "tiny", "--device", "cpu", "--steps", "2",
           "--prompts", "2", "--group", "4", "--prompt-len", "8", "--new-tokens", "8", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| tiny |")]
    assert [r.split("|")[2].strip() for r in rows] == ["full", "full+gc", "lora", "lora+gc"]
    for r in rows:
        rollout, train = (float(r.split("|")[i]) for i in (3, 4))
        assert rollout > 0 and train > 0


def test_gpu_benchmark_starts_data_parallel_ranks_under_torchrun(tmp_path):
    """`--ranks 2` relaunches under torchrun (gloo here, NCCL on GPUs); rank 0 alone writes the table."""
    out = tmp_path / "gpu.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--shapes", "tiny", "--device", "cpu", "--steps", "2",
           "--prompts", "2", "--group", "4", "--prompt-len", "8", "--new-tokens", "8", "--variants", "full",
           "--ranks", "2", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert "× 2 rank(s)" in text and len([ln for ln in text.splitlines() if ln.startswith("| tiny |")]) == 1
