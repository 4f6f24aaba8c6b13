"""Rollout throughput of multi-turn episodes against single-turn generation, side by side in one run.

Both sides generate exactly the same number of policy tokens with the `hf` engine on the same model:
E episodes of T turns × M tokens each (the episode runner, `lmrl.envs.episodes`, one engine call per
turn round for all live episodes, with a short user message between turns) against E single-turn
completions of T × M tokens (one engine call). End-of-sequence is disabled on both sides so every
turn runs its full length. Timed rounds alternate the sides (after one untimed warm-up each), so
drifts of a shared machine hit all alike. The ratio multi-turn / single-turn tokens/s is what a
multi-turn run loses to its extra prefills and the environment's own work. The runner asks for
prefix reuse (`SamplingParams.keep_prefix`): the hf engine then keeps each episode's KV between turn
rounds and prefills only the new tokens (vLLM has its own prefix cache, `--engine vllm`). On hf a
third side, "multi-turn, no reuse", forces it off: every turn re-reads its whole episode so far.

    .venv/bin/python benchmarks/multi_turn.py                          # tiny random model
    .venv/bin/python benchmarks/multi_turn.py --model default --out docs/environments_result.md
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch
from machine import cpu_model

from lmrl.engines import ENGINES, SamplingParams
from lmrl.envs import Step
from lmrl.envs.chat import encode_opening
from lmrl.envs.episodes import Limits, run_episodes

QUESTION = "Let us talk for a few turns. Tell me something about the sea."


class Chatty:
    """`turns` turns; each observation is one short user message."""

    def __init__(self, turns: int):
        self.turns = turns

    def reset(self, row, seed):
        return [{"role": "user", "content": QUESTION}], {"turn": 0}

    def step(self, reply, state):
        state["turn"] += 1
        done = state["turn"] >= self.turns
        return Step(None if done else [{"role": "user", "content": "Go on."}], 0.0, done)


class WithoutReuse:
    """An engine with prefix reuse forced off: each turn prefills its whole episode."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, n, params, generator=None):
        return self.engine.generate(prompts, n, replace(params, keep_prefix=False), generator)


def load(model_name: str):
    if model_name == "tiny":
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from conftest import make_tokenizer
        from lmrl.models import tiny_llama

        tok = make_tokenizer()
        return tiny_llama(len(tok), hidden=64, layers=2, heads=4, seed=0), tok
    from lmrl.models import load_model, load_tokenizer, resolve_model_path

    path = resolve_model_path(model_name)
    return load_model(path), load_tokenizer(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (random, char tokenizer) or a model path / 'default'")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens-per-turn", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                    help="vllm keeps a prefix cache across calls, so a turn does not re-read its episode")
    ap.add_argument("--out", help="also write the result table to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    never: list[int] = []  # no EOS id: every turn runs its full length
    if args.engine == "vllm":
        context = 2 * args.turns * args.tokens_per_turn + 64 * args.turns + 128  # turns, observations, opening
        context = min(context, model.config.max_position_embeddings)
        engine = ENGINES.get("vllm")(model, never, pad, max_model_len=context, kv_rows=args.episodes)
    else:
        engine = ENGINES.get("hf")(model, never, pad)
    rows = [{"uid": f"r{i}", "question": QUESTION, "answer": ""} for i in range(args.episodes)]
    prompt = encode_opening(tok, [{"role": "user", "content": QUESTION}])
    env = Chatty(args.turns)
    limits = Limits(max_turns=args.turns, max_episode_tokens=100_000)
    turn_params = SamplingParams(max_new_tokens=args.tokens_per_turn)
    single_params = SamplingParams(max_new_tokens=args.turns * args.tokens_per_turn)

    def multi(gen, runner_engine=engine):
        groups = run_episodes(runner_engine, tok, rows, 1, turn_params, env, limits, gen)
        return sum(x.num_generated for g in groups for x in g.samples)

    def single(gen):
        outs = engine.generate([prompt] * args.episodes, 1, single_params, gen)
        return sum(len(c[0].token_ids) for c in outs)

    sides = {"single-turn": single, "multi-turn": multi}
    if args.engine == "hf":
        sides["multi-turn, no reuse"] = lambda gen: multi(gen, WithoutReuse(engine))
    times: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, int] = {}
    for rnd in range(args.rounds + 1):
        for name, fn in sides.items():
            gen = torch.Generator().manual_seed(rnd)
            t0 = time.perf_counter()
            tokens[name] = fn(gen)
            elapsed = time.perf_counter() - t0
            print(f"round {rnd} {name}: {tokens[name]} tokens in {elapsed:.2f}s", file=sys.stderr, flush=True)
            if rnd:  # round 0 warms up
                times[name].append(elapsed)
    rate = {k: tokens[k] / (sum(v) / len(v)) for k, v in times.items()}
    lines = [
        f"model: {args.model}; {args.episodes} episodes × {args.turns} turns × {args.tokens_per_turn} tokens "
        f"(single-turn: {args.episodes} × {args.turns * args.tokens_per_turn} tokens); {args.engine} engine, fp32, "
        f"{args.threads} threads; CPU: {cpu_model()}; mean of {args.rounds} timed rounds after one warm-up",
        "",
        "| side | generated tokens | seconds (per round) | tokens/s |",
        "|---|---|---|---|",
        *[f"| {k} | {tokens[k]} | {', '.join(f'{t:.2f}' for t in times[k])} | {rate[k]:.1f} |" for k in sides],
        "",
        *[f"{k} / single-turn tokens/s: **{rate[k] / rate['single-turn']:.2f}×**" for k in list(sides)[1:]],
    ]
    if args.engine == "hf":
        st = engine.prefix_stats
        share = st["reused_tokens"] / max(st["prompt_tokens"], 1)
        lines += ["", f"prefix reuse (multi-turn side, all {args.rounds + 1} rounds): {st['reused_tokens']} of "
                  f"{st['prompt_tokens']} prompt tokens reused ({share:.0%}), {st['prefill_tokens']} prefilled; "
                  f"KV kept at most {st['kv_bytes_peak'] / 2**20:.1f} MiB"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
