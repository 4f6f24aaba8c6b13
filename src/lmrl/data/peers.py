"""Peer rollouts for Mutual RL's PRP: another model's completions of a task's training prompts, with
their log-probabilities, written as a JSON-lines task for `data.demonstrations: peers`.

    python -m lmrl.task_files peers quickstart peers.jsonl --model PEER [--samples 4] [--rows 256] [overrides]

Each written row is a training row of the recipe's task (prompt, gold answer and the other fields)
plus `peer_rollouts`: [{"text": ..., "logprob": ...}], the peer's sampled texts and the sum of their
behaviour log-probs at the recipe's rollout temperature (the distribution the peer sampled from, so
π_self(y)/π_peer(y) is the right importance weight). Only text and one number cross over, so the
peer may use another tokenizer. Train on the file with the `prp` preset:
`task.name=jsonl task.dataset=peers.jsonl algo.preset=prp`.
"""
from __future__ import annotations

import sys

from rich.progress import Progress

FIELDS_LEFT_OUT = {"prompt_ids", "variants"}  # encoded by whichever tokenizer reads the file


def peer_rows(cfg, rows: list[dict], engine, tokenizer, samples: int, generator=None) -> list[dict]:
    """`rows` (encoded training rows), each with `samples` rollouts of the peer behind `engine`."""
    from lmrl.engines import sampling_params
    from lmrl.envs import rollout

    chunk = cfg.rollout.prompts_per_step
    out = []
    with Progress(disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("peer rollouts", total=len(rows))
        for start in range(0, len(rows), chunk):
            for group in rollout(engine, tokenizer, rows[start: start + chunk], samples, sampling_params(cfg),
                                 generator):
                row = {k: v for k, v in group.row.items() if k not in FIELDS_LEFT_OUT}
                row["peer_rollouts"] = [{"text": x.text, "logprob": float(sum(x.behaviour_logprobs))}
                                        for x in group.samples]
                out.append(row)
            bar.advance(task, len(rows[start: start + chunk]))
    return out
