"""Full fine-tuning against LoRA on the quickstart: peak memory, step time, held-out accuracy.

    python benchmarks/lora.py --modes full,lora,lora_gc,full_gc --threads 1 --out docs/lora_result.md

Each mode trains the quickstart recipe (SmolLM2-135M-Instruct, GRPO on basic_arithmetic, 8 prompts
× 8 samples, 40 new tokens) in a fresh child process, one after the other, with its own learning
rate (`--lr-full`, `--lr-lora`). The child reports its peak resident memory (`ru_maxrss` of its own
process: model load, both evaluations and training), its mean step time and update time (from
metrics.jsonl, the first step excluded as warm-up), its trainable parameters and the held-out greedy
accuracy before and after. `--modes` may add `lora_gc` / `full_gc` (gradient checkpointing on).
`--threads 1` gives every mode one core, so that another process on a shared 2-core machine slows
all of them alike (`auto` would pick 2 threads when idle and 1 when busy, mode by mode).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model

MODES = {
    "full": [],
    "lora": ["model.lora={}"],
    "full_gc": ["trainer.gradient_checkpointing=true"],
    "lora_gc": ["model.lora={}", "trainer.gradient_checkpointing=true"],
}


def child(mode: str, steps: int, lr: float, threads: str, workdir: Path) -> dict:
    """Train the quickstart in this process and return its measurements."""
    from lmrl.loading import load_config
    from lmrl.loops import build_stages, train

    overrides = [*MODES[mode], f"trainer.steps={steps}", f"trainer.lr={lr}", f"trainer.threads={threads}",
                 f"run.output_dir={workdir}", f"run.name={mode}", "run.progress=false", "run.checkpoint_every=0",
                 "run.keep_checkpoints=1"]
    cfg = load_config("quickstart", overrides)
    stages = build_stages(cfg)
    trainable = sum(p.numel() for p in stages.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in stages.model.parameters())
    result = train(cfg, stages=stages)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rows = [json.loads(line) for line in (workdir / mode / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "timing/step_s" in r][1:]
    return {"mode": mode, "lr": lr, "steps": steps, "peak_rss_mib": peak_mib, "trainable": trainable, "params": total,
            "step_s": statistics.mean(r["timing/step_s"] for r in timed),
            "rollout_s": statistics.mean(r["timing/rollout_s"] for r in timed),
            "update_s": statistics.mean(r["timing/train_s"] for r in timed),
            "threads": statistics.mean(r["timing/threads"] for r in timed),
            "inert": statistics.mean(r["inert_rows"] for r in timed if "inert_rows" in r),
            "acc_before": result.eval_before.get("eval/accuracy"), "acc_after": result.eval_after.get("eval/accuracy"),
            "bf16": stages.learner.bf16, "device": str(stages.learner.device)}


def run_child(mode: str, steps: int, lr: float, threads: str, workdir: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--steps", str(steps), "--lr-full", str(lr), "--lr-lora", str(lr),
           "--threads", threads, "--workdir", str(workdir)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def table(results: list[dict]) -> list[str]:
    base = results[0]
    names = [r["mode"] for r in results]
    head = "| | " + " | ".join(names) + " | " + " | ".join(f"{n} / {base['mode']}" for n in names[1:]) + " |"
    rule = "|---|" + "---:|" * (2 * len(names) - 1)
    rows = [("learning rate", "lr", "{:g}", False), ("trainable parameters", "trainable", "{:,}", True),
            ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}", True), ("mean step (s)", "step_s", "{:.1f}", True),
            ("mean rollout (s)", "rollout_s", "{:.1f}", True), ("mean update (s)", "update_s", "{:.1f}", True),
            ("rows skipped as inert", "inert", "{:.0%}", False), ("CPU threads used", "threads", "{:.1f}", False),
            ("held-out accuracy before", "acc_before", "{:.2f}", False),
            ("held-out accuracy after", "acc_after", "{:.2f}", False)]
    lines = [head, rule]
    for label, key, fmt, ratio in rows:
        cells = [fmt.format(r[key]) if r[key] is not None else "–" for r in results]
        ratios = [f"{r[key] / base[key]:.2f}" if ratio and base[key] else "" for r in results[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=14, help="training steps per mode (the quickstart's 14)")
    p.add_argument("--lr-full", type=float, default=3e-5, help="full fine-tuning lr (the quickstart's)")
    p.add_argument("--lr-lora", type=float, default=3e-4, help="LoRA lr (quickstart_lora.yaml's)")
    p.add_argument("--threads", default="auto", help="trainer.threads of every mode (1 on a shared machine)")
    p.add_argument("--modes", default="full,lora", help=f"comma-separated, first is the baseline: {', '.join(MODES)}")
    p.add_argument("--out", type=Path, help="also write the markdown result here")
    p.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        lr = a.lr_lora if a.child.startswith("lora") else a.lr_full
        print(json.dumps(child(a.child, a.steps, lr, a.threads, a.workdir)), flush=True)
        return 0
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    results = []
    load = [os.getloadavg()[0]]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="lmrl-lora-") as tmp:
        for mode in modes:
            print(f"training {mode}…", file=sys.stderr, flush=True)
            lr = a.lr_lora if mode.startswith("lora") else a.lr_full
            results.append(run_child(mode, a.steps, lr, a.threads, Path(tmp)))
            load.append(os.getloadavg()[0])
    r0 = results[0]
    lines = [
        f"Quickstart (SmolLM2-135M-Instruct, GRPO, 8 prompts × 8 samples, 40 new tokens), {a.steps} steps per mode, "
        f"each in its own process; {r0['device']}, bf16 autocast {'on' if r0['bf16'] else 'off'}, "
        f"trainer.threads={a.threads}, "
        f"CPU: {cpu_model()} ({os.cpu_count()} cores). Wall time {(time.time() - started) / 60:.0f} min; "
        f"1-minute load average {', '.join(f'{x:.1f}' for x in load)} (before, after each mode).",
        "",
        *table(results),
        "",
        "Peak RSS is the child's `ru_maxrss` (model load, evaluations and training); times are means over steps 2",
        "onwards (update: the learner's share of the step, which depends on how many rows had mixed rewards);",
        "accuracy is greedy on the quickstart's 100 held-out problems.",
    ]
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        a.out.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
