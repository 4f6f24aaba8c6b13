"""Rollout engines side by side: `hf` against `vllm` on SmolLM2-135M, in one invocation.

    python benchmarks/engines.py --out docs/engines_result.md

1. Rollout throughput: both engines over the same in-memory model, the same quickstart prompts and
   sampling settings (temperature 1, `--new-tokens` new tokens), at 4/8/16 prompts × 8 samples.
   Each engine first generates once untimed (warm-up); then the sizes run in turn, the engines
   alternating, `--repeats` times; generated tokens (EOS included) / wall seconds, median.
2. Quickstart step time: `lmrl train quickstart` with each engine in its own process for `--steps`
   steps (evaluation and checkpoints off); median step time over the steps after the first, split
   into rollout, update and, for vllm, the weight push that the update includes.

Precision follows `trainer.bf16` (default auto: bf16 where the CPU has fast bf16); the table says
which was used. The engines sample with different random streams, so their completions (and the
trajectories of the two training runs) differ; tokens/s and the response length make that visible.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import cpu_model, load_average

SIZES = (4, 8, 16)  # prompts per call; × 8 samples each = 32 / 64 / 128 rows
GROUP = 8




def rollout_throughput(new_tokens: int, repeats: int, bf16_setting: str, threads: str) -> tuple[dict, bool]:
    """Generated tokens/s of each engine at each size: {(engine, rows): [tok/s per repeat]}, and bf16 used."""
    from lmrl.engines import SamplingParams, build_engine
    from lmrl.envs.pieces import build_pieces
    from lmrl.loading import load_config
    from lmrl.models.precision import resolve_bf16
    from lmrl.models.threads import apply_threads

    def config(engine: str):
        return load_config("quickstart", [f"rollout.engine={engine}", f"trainer.bf16={bf16_setting}",
                                          "trainer.device=cpu", f"rollout.max_new_tokens={new_tokens}",
                                          f"rollout.group_size={GROUP}", f"rollout.prompts_per_step={max(SIZES)}",
                                          "task.num_train=64"])

    cfg = config("hf")
    pieces = build_pieces(cfg, engine=False)  # one model for both engines
    tokenizer, model = pieces.tokenizer, pieces.model
    prompts = [row["prompt_ids"] for row in pieces.train_rows[: max(SIZES)]]
    engines = {name: build_engine(config(name), model, tokenizer) for name in ("hf", "vllm")}
    params = SamplingParams(max_new_tokens=new_tokens)
    gen = torch.Generator().manual_seed(0)
    for engine in engines.values():
        apply_threads(threads)
        engine.generate(prompts[:2], GROUP, params, gen)
    results: dict[tuple[str, int], list[float]] = {}
    for r in range(repeats):
        for size in SIZES:
            order = ("hf", "vllm") if r % 2 == 0 else ("vllm", "hf")
            for name in order:
                apply_threads(threads)
                start = time.perf_counter()
                out = engines[name].generate(prompts[:size], GROUP, params, gen)
                seconds = time.perf_counter() - start
                tokens = sum(len(c.token_ids) for group in out for c in group)
                results.setdefault((name, size * GROUP), []).append(tokens / seconds)
                print(f"rollout {name} {size * GROUP} rows: {tokens} tokens in {seconds:.1f} s", flush=True)
    engines["vllm"].close()
    return results, resolve_bf16(cfg.trainer.bf16, "cpu")


def quickstart_steps(engine: str, steps: int, bf16_setting: str, workdir: Path) -> dict:
    """Median per-step timings of `lmrl train quickstart rollout.engine=<engine>` over steps 2..N."""
    subprocess.run([sys.executable, "-m", "lmrl.cli", "train", "quickstart", f"rollout.engine={engine}",
                    f"trainer.steps={steps}", f"trainer.bf16={bf16_setting}", "eval.at_start=false",
                    "eval.at_end=false", f"run.output_dir={workdir}", f"run.name={engine}", "run.progress=false",
                    "run.checkpoint_every=0", "run.keep_checkpoints=1"], check=True, capture_output=True)
    rows = [json.loads(line) for line in (workdir / engine / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r][1:]  # the first step warms up
    med = lambda key: statistics.median(r.get(key, 0.0) for r in rows)  # noqa: E731
    return {"step_s": med("timing/step_s"), "rollout_s": med("timing/rollout_s"), "train_s": med("timing/train_s"),
            "sync_s": med("timing/weight_sync_s"), "tok_s": med("tokens_per_s"),
            "length": med("response_length/mean")}


def table(rollouts: dict, steps: dict, bf16: bool, a: argparse.Namespace, load: tuple[str, str]) -> str:
    lines = [f"# Rollout engines: hf vs vllm ({cpu_model()}, {os.cpu_count()} cores, "
             f"{'bf16' if bf16 else 'fp32'})", "",
             f"`python benchmarks/engines.py --new-tokens {a.new_tokens} --repeats {a.repeats} --steps {a.steps}`, "
             f"SmolLM2-135M-Instruct, trainer.bf16={a.bf16} (bf16 used: {'yes' if bf16 else 'no'}), "
             f"threads {a.threads}. Load average (1/5/15 min) at start {load[0]}, at end {load[1]}: "
             "more than the core count means other work shared the CPU during the run.", "",
             f"## Rollout throughput (quickstart prompts × {GROUP} samples, up to {a.new_tokens} new tokens, "
             "temperature 1; warm-up excluded)", "",
             "| rows | hf tokens/s | vllm tokens/s | vllm / hf |", "|---:|---:|---:|---:|"]
    for size in SIZES:
        rows = size * GROUP
        hf, vl = statistics.median(rollouts[("hf", rows)]), statistics.median(rollouts[("vllm", rows)])
        lines.append(f"| {rows} | {hf:.1f} | {vl:.1f} | {vl / hf:.2f} |")
    if steps:
        lines += ["", f"## Quickstart step (8 prompts × 8 samples, 40 tokens; median of steps 2–{a.steps})", "",
                  "| engine | step (s) | rollout (s) | update + sync (s) | of which weight sync (s) | rollout tokens/s "
                  "| mean response length |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name in ("hf", "vllm"):
            s = steps[name]
            lines.append(f"| {name} | {s['step_s']:.1f} | {s['rollout_s']:.1f} | {s['train_s']:.1f} | "
                         f"{s['sync_s']:.2f} | {s['tok_s']:.1f} | {s['length']:.1f} |")
        lines.append(f"| vllm / hf | {steps['vllm']['step_s'] / steps['hf']['step_s']:.2f} | "
                     f"{steps['vllm']['rollout_s'] / steps['hf']['rollout_s']:.2f} | "
                     f"{steps['vllm']['train_s'] / steps['hf']['train_s']:.2f} | | "
                     f"{steps['vllm']['tok_s'] / steps['hf']['tok_s']:.2f} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="passes over the sizes (median taken)")
    p.add_argument("--steps", type=int, default=4, help="quickstart steps per engine (the first not timed); 0: skip")
    p.add_argument("--bf16", default="auto", help="trainer.bf16: auto, true or false")
    p.add_argument("--threads", default="auto", help="torch threads for the rollout part (as trainer.threads)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    load_start = load_average()
    rollouts, bf16 = rollout_throughput(a.new_tokens, a.repeats, a.bf16, a.threads)
    steps = {}
    if a.steps:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("hf", "vllm"):
                steps[name] = quickstart_steps(name, a.steps, a.bf16, Path(tmp))
                print(f"quickstart {name}: {steps[name]}", flush=True)
    text = table(rollouts, steps, bf16, a, (load_start, load_average()))
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
