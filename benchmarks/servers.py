"""The learner's idle time per step with engine servers against the colocated engine, side by side.

    python benchmarks/servers.py [--steps 6] [--hidden 256] [--layers 4] [--modes colocated,servers,...]

Each mode trains the toy task (prompts "say 7", reward 1 for a 7; the test suite's) with the same
random Llama for `--steps` steps, one mode after the other in this process: `colocated` (the `hf`
engine on the learner's module), `servers`
(one `hf` engine server in its own process, weights broadcast through gloo), every process with one torch thread,
and the same two with rollouts one version ahead (`rollout.max_staleness=1`: `colocated_async1`,
whose engine is a copy of the model in a thread of the learner's process, and `servers_async1`).
Reported per step (the first left out, with its warm-up): step time, the learner's busy time
(`timing/train_s`: the update and, in the inline loop, the weight sync after it), the weight sync,
and the learner's idle time (step − busy: making or waiting for the rollouts and their scores), with
its share of the step and its ratio to the colocated engine's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from machine import cpu_model, load_average

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SERVER = {"backend": "local", "servers": True, "rollout_workers": 1, "worker_threads": 1}
MODES = {"colocated": ({"threads": 1}, {}, {}),
         "servers": ({"threads": 1}, {}, SERVER),
         "colocated_async1": ({"threads": 1}, {"max_staleness": 1}, {}),
         "servers_async1": ({"threads": 1}, {"max_staleness": 1}, SERVER)}


def run(mode: str, steps: int, hidden: int, layers: int, workdir: Path) -> dict:
    from conftest import make_tokenizer, toy_run_config
    from lmrl.loops import build_stages, train
    from lmrl.models import tiny_llama

    trainer, rollout, dist = MODES[mode]
    cfg = toy_run_config(workdir / mode, steps, trainer=trainer, rollout={"prompts_per_step": 4, "group_size": 8,
                                                                         "max_new_tokens": 16, **rollout},
                         dist=dist)
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=hidden, layers=layers, heads=4, seed=0)
    stages = build_stages(cfg, model=model, tokenizer=tok)
    try:
        result = train(cfg, stages=stages)
    finally:
        if hasattr(stages.engine, "close"):
            stages.engine.close()
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "timing/step_s" in r][1:]
    step = statistics.mean(r["timing/step_s"] for r in timed)
    update = statistics.mean(r["timing/train_s"] for r in timed)
    sync = statistics.mean(r.get("timing/weight_sync_s", 0.0) for r in timed)
    mb = next((r["weight_sync/mb"] for r in timed if "weight_sync/mb" in r), 0.0)
    return {"mode": mode, "step_s": step, "train_s": update, "sync_s": sync, "sync_mb": mb, "idle_s": step - update}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(mode, args.steps, args.hidden, args.layers, Path(tmp)) for mode in args.modes.split(",")]
    base = next((r["idle_s"] for r in results if r["mode"] == "colocated"), None)
    print(f"CPU: {cpu_model()}; load average {load_average()}; random Llama hidden {args.hidden}, {args.layers} "
          f"layers; {args.steps} steps (the first left out)")
    print("| mode | step s | learner busy s | weight sync s (MB) | learner idle s | idle share | idle vs colocated |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = f"{r['idle_s'] / base:.2f}×" if base else "–"
        print(f"| {r['mode']} | {r['step_s']:.3f} | {r['train_s']:.3f} | {r['sync_s']:.3f} ({r['sync_mb']:.1f}) | "
              f"{r['idle_s']:.3f} | {r['idle_s'] / r['step_s']:.0%} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
