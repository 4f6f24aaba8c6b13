"""KnowRL's offline hint choice: each training row's minimal-sufficient knowledge points, found by Constrained
Subset Search with the recipe's own policy and reward, written as a JSON-lines task for `data.demonstrations: hints`.

    python -m lmrl.task_files hints RECIPE OUT.jsonl [overrides] [--samples 8] [--delta 0.03] [--rows N]

The recipe's task rows carry the candidate points (`data.source_params.field`, default `hints`). For
each row the prompt plus all of them is rolled out `samples` times, then every subset of size 1, 2, …,
until one scores within `delta` of all points (`lmrl.data.guidance.search_hints`); its indices are
written in the field `data.source_params.selected` (default `hint_index`).
"""
from __future__ import annotations

from functools import partial

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

