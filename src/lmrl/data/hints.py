"""KnowRL's offline hint choice: each training row's minimal-sufficient knowledge points, found by Constrained
Subset Search with the recipe's own policy and reward, written as a JSON-lines task for `data.demonstrations: hints`.

    python -m lmrl.data.hints RECIPE OUT.jsonl [overrides] [--samples 8] [--delta 0.03] [--rows N]

The recipe's task rows carry the candidate points (`data.source_params.field`, default `hints`). For
each row the prompt plus all of them is rolled out `samples` times, then every subset of size 1, 2, …,
until one scores within `delta` of all points (`lmrl.data.guidance.search_hints`); its indices are
written in the field `data.source_params.selected` (default `hint_index`).
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from lmrl.data.demonstrations import source_params
from lmrl.data.guidance import extended_row, group_accuracy, search_hints
from lmrl.data.peers import FIELDS_LEFT_OUT


def choose_hints(cfg, rows: list[dict], engine, tokenizer, samples: int, delta: float, generator=None) -> list[dict]:
    """`rows`, each with the indices of its chosen points (rows without points are left as they are)."""
    from lmrl.engines import sampling_params
    from lmrl.envs import rollout
    from lmrl.rewards import RewardScorer

    params, scorer = source_params(cfg), RewardScorer(cfg.reward)

    def accuracies(row: dict, subsets: list[tuple[int, ...]]) -> list[float]:
        hinted = [extended_row(row, params.text([row[params.field][i] for i in s]), tokenizer,
                               cfg.task.system_prompt, "css") for s in subsets]
        groups = rollout(engine, tokenizer, hinted, samples, sampling_params(cfg), generator)
        scorer.score(groups)
        return [group_accuracy(g, cfg.reward.accuracy_component) or 0.0 for g in groups]

    out = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k not in FIELDS_LEFT_OUT}
        if row.get(params.field):
            kept[params.selected] = list(search_hints(len(row[params.field]), partial(accuracies, row), delta))
        out.append(kept)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from lmrl.config import load_config
    from lmrl.envs.pieces import build_pieces

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe")
    p.add_argument("out", type=Path)
    p.add_argument("overrides", nargs="*", help="config overrides of the recipe, e.g. model.path=...")
    p.add_argument("--samples", type=int, default=8, help="rollouts per prompt and subset")
    p.add_argument("--delta", type=float, default=0.03, help="accuracy a subset may lose against all points")
    p.add_argument("--rows", type=int, help="only the first ROWS training prompts")
    a = p.parse_args(argv)
    cfg = load_config(a.recipe, [*a.overrides, "data.demonstrations=hints"])
    if not source_params(cfg).selected:
        p.error("data.source_params.selected names no field to write the chosen indices to")
    pieces = build_pieces(cfg)
    train = pieces.train_rows
    generator = torch.Generator().manual_seed(cfg.trainer.seed)
    rows = choose_hints(cfg, train[: a.rows] if a.rows else train, pieces.engine, pieces.tokenizer, a.samples,
                        a.delta, generator)
    a.out.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    print(f"{len(rows)} prompts with their chosen hints written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
