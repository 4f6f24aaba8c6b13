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


def test_gpu_benchmark_runs_the_sharded_learner_and_an_engine_server(tmp_path):
    """`--sharding fsdp` under 2 ranks and `--servers 1` (an engine server in its own process, weights
    broadcast over gloo) each run the real loop on the tiny shape; the table names the layout."""
    base = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--shapes", "tiny", "--device", "cpu", "--steps", "2",
            "--prompts", "2", "--group", "4", "--prompt-len", "8", "--new-tokens", "8", "--variants", "full"]
    for extra, said in ((["--ranks", "2", "--sharding", "fsdp"], "learner sharding fsdp"),
                        (["--servers", "1", "--broadcast", "gloo"], "1 engine server(s), weights broadcast (gloo)")):
        out = tmp_path / f"{extra[0][2:]}.md"
        done = subprocess.run([*base, *extra, "--out", str(out)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        text = out.read_text()
        row = next(ln for ln in text.splitlines() if ln.startswith("| tiny |"))
        assert said in text and float(row.split("|")[3]) > 0 and float(row.split("|")[4]) > 0
        if extra[0] == "--servers":
            assert float(row.split("|")[7]) > 0  # the broadcast's seconds per step
