"""Learner update time with and without shared-prompt packing, side by side on one rollout batch.

Usage: python benchmarks/learner_step.py [--prompts 8] [--group 8] [--max-new-tokens 40] [--repeats 3]
Both settings train on the same batch, from the same weights, alternating; prints medians and the ratio.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from lmrl.learners import Learner
from lmrl.loading import load_config
from lmrl.loops.setup import build_stages
from lmrl.loops.batching import to_batch
from lmrl.inputs import provide
from lmrl.loops.collect import batch_inputs, collect_groups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cfg = load_config("quickstart", [f"rollout.prompts_per_step={a.prompts}", f"rollout.group_size={a.group}",
                                     f"rollout.max_new_tokens={a.max_new_tokens}", "task.num_eval=1"])
    s = build_stages(cfg)
    _, kept, _ = collect_groups(s)
    inputs = batch_inputs(s, kept, step=1)
    batch = to_batch(inputs, s.engine.pad_token_id)
    provide(batch, inputs, with_learner=True)
    s.algorithm.prepare(batch)
    print(f"batch: {batch.num_rows} samples, {int(batch.attention_mask.sum())} tokens "
          f"({int(batch.completion_mask.sum())} generated), padded width {batch.input_ids.shape[1]}")
    initial = copy.deepcopy(s.model.state_dict())
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.repeats):
        for share in (False, True):
            s.model.load_state_dict(initial)
            learner = Learner(s.model, cfg.trainer.model_copy(update={"share_prompt": share}), bf16=s.learner.bf16)
            t = time.perf_counter()
            learner.update(batch, s.algorithm)
            times[share].append(time.perf_counter() - t)
            print(f"share_prompt={share}: {times[share][-1]:.2f} s", flush=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"\nmedian update: separate rows {off:.2f} s, shared prompt {on:.2f} s, ratio {on / off:.2f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
