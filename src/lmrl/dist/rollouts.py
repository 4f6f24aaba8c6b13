"""Rollouts of a data-parallel run: each rank generates its share of a batch, and every rank gets all of it.

`ShardedRollouts` wraps a rank's engine: `generate` splits the prompts into one contiguous chunk
per rank and samples each from a seed drawn from the run's generator (the same on every rank), like
a pool of rollout workers (`engines.workers`); each rank generates its own chunk and the chunks are
gathered in rank order. Every rank then scores, filters and assembles the same batch, and the learner
trains its share of it (`dist.data_parallel`). A 2-rank run therefore samples exactly what a one-process
run with `dist.backend: local` and 2 rollout workers samples. A sharded learner's weights are gathered
whole on every rank for the time of a `generate` (`Parallel.gathered`).
"""
from __future__ import annotations

import torch

from lmrl.dist.data_parallel import Parallel
from lmrl.engines.workers import chunk_seeds, split_evenly


class ShardedRollouts:
    """A rank's engine, generating its chunk of every batch and returning the whole batch."""

    def __init__(self, engine, parallel: Parallel):
        self.engine, self.parallel = engine, parallel

    def __getattr__(self, name: str):  # pad_token_id, version, shares_module, … of the rank's engine
        return getattr(self.engine, name)

    def update_weights(self, named_tensors, version: int) -> dict[str, float]:
        return self.engine.update_weights(named_tensors, version)

    def generate(self, prompts, n, params, generator: torch.Generator | None = None):
        if not prompts:
            return []
        chunks = split_evenly(len(prompts), self.parallel.world_size)
        seeds = chunk_seeds(generator, len(chunks))
        start, end = chunks[self.parallel.rank]
        with self.parallel.gathered():  # sharded: the whole weights, so that decoding steps run no collective
            mine = self.engine.generate(prompts[start:end], n, params,
                                        torch.Generator().manual_seed(seeds[self.parallel.rank])) if end > start else []
        return [group for chunk in self.parallel.gather_objects(mine) for group in chunk]
