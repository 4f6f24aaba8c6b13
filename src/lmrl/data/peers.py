"""Peer rollouts for Mutual RL's PRP: another model's completions of a task's training prompts, with
their log-probabilities, written as a JSON-lines task for `data.demonstrations: peers`.

    python -m lmrl.data.peers quickstart peers.jsonl --model PEER [--samples 4] [--rows 256] [overrides]

Each written row is a training row of the recipe's task (prompt, gold answer and the other fields)
plus `peer_rollouts`: [{"text": ..., "logprob": ...}], the peer's sampled texts and the sum of their
behaviour log-probs at the recipe's rollout temperature (the distribution the peer sampled from, so
π_self(y)/π_peer(y) is the right importance weight). Only text and one number cross over, so the
peer may use another tokenizer. Train on the file with the `prp` preset:
`task.name=jsonl task.dataset=peers.jsonl algo.preset=prp`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.progress import Progress

FIELDS_LEFT_OUT = {"prompt_ids", "variants"}  # encoded by whichever tokenizer reads the file


def peer_rows(recipe: str, overrides: list[str], model: str, samples: int, rows: int | None) -> list[dict]:
    """The recipe's training rows (the first `rows`), each with `samples` rollouts of `model`."""
    import torch

    from lmrl.config import load_config
    from lmrl.engines import sampling_params
    from lmrl.envs import rollout
    from lmrl.envs.pieces import build_pieces

    cfg = load_config(recipe, [*overrides, f"model.path={model}"])
    pieces = build_pieces(cfg)
    engine, tokenizer = pieces.engine, pieces.tokenizer
    train = pieces.train_rows[:rows] if rows else pieces.train_rows
    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    chunk = cfg.rollout.prompts_per_step
    out = []
    with Progress(disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("peer rollouts", total=len(train))
        for start in range(0, len(train), chunk):
            for group in rollout(engine, tokenizer, train[start: start + chunk], samples, sampling_params(cfg),
                                 generator):
                row = {k: v for k, v in group.row.items() if k not in FIELDS_LEFT_OUT}
                row["peer_rollouts"] = [{"text": x.text, "logprob": float(sum(x.behaviour_logprobs))}
                                        for x in group.samples]
                out.append(row)
            bar.advance(task, len(train[start: start + chunk]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe")
    p.add_argument("out", type=Path)
    p.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. rollout.temperature=0.8")
    p.add_argument("--model", required=True, help="the peer: a model directory, .gguf file or 'default'")
    p.add_argument("--samples", type=int, default=4, help="rollouts per prompt")
    p.add_argument("--rows", type=int, help="only the first ROWS training prompts")
    a = p.parse_args(argv)
    if a.samples < 1 or (a.rows is not None and a.rows < 1):
        p.error("--samples and --rows must be >= 1")
    rows = peer_rows(a.recipe, a.overrides, a.model, a.samples, a.rows)
    a.out.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    print(f"{len(rows)} prompts × {a.samples} peer rollouts written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
