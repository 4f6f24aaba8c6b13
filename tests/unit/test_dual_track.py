"""EqLen's dual-track controller: pairs of tracks masked to the shorter one's length in the loss (the spec's
lengths 3 and 5 -> [1,1,1] and [1,1,1,0,0]), the tail still scored, and the masked tail out of every loss term."""
from __future__ import annotations

import pytest

from conftest import toy_run_config, train_tiny
from lmrl.config import ConfigError
from lmrl.engines.base import Completion, SamplingParams
from lmrl.envs.dual_track import DualTrack
from lmrl.types import Sample, collate


class Lengths:
    """Completions of the given lengths for every prompt (token 5, log-prob -1)."""

    version = 0

    def __init__(self, lengths):
        self.lengths = lengths

    def generate(self, prompts, n, params, generator=None):
        assert n == len(self.lengths)
        return [[Completion([5] * k, [-1.0] * k, "stop") for k in self.lengths] for _ in prompts]


def test_each_pair_is_masked_to_its_shorter_track_and_an_odd_track_keeps_its_length():
    out = DualTrack().complete(Lengths([3, 5, 4, 2, 6]), [[1, 2]], 5, SamplingParams(max_new_tokens=8))[0]
    assert [c.loss_mask for c in out] == [[1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0], [1, 1], [1] * 6]
    assert [c.info["eqlen"] for c in out] == [{"pair": 0, "segment": 3}, {"pair": 0, "segment": 3},
                                              {"pair": 1, "segment": 2}, {"pair": 1, "segment": 2},
                                              {"pair": 2, "segment": 6}]
    assert [len(c.token_ids) for c in out] == [3, 5, 4, 2, 6]  # every track whole, for its reward


def test_the_tail_is_out_of_the_batch_completion_mask():
    out = DualTrack().complete(Lengths([3, 5]), [[1, 2]], 2, SamplingParams(max_new_tokens=8))[0]
    samples = [Sample(prompt_ids=[1, 2], completion_ids=c.token_ids, behaviour_logprobs=c.logprobs, reward=1.0,
                      loss_mask=c.loss_mask) for c in out]
    batch = collate(samples, [0, 0], pad_id=0)
    assert batch.completion_mask.sum(-1).tolist() == [3.0, 3.0]  # a token-mean denominator of 6, not 8


def test_eqlen_trains_end_to_end_on_dual_tracks_and_refuses_knobs(tmp_path):
    cfg = toy_run_config(tmp_path, 2, algo={"preset": "eqlen"}, rollout={"controller": "dual_track"})
    rows, stages = train_tiny(cfg)
    assert len(rows) == 2 and all(r["loss"] == r["loss"] for r in rows)
    with pytest.raises(ConfigError, match="controller_params of dual_track: segment: Extra inputs are not permitted"):
        toy_run_config(tmp_path, 1, rollout={"controller": "dual_track", "controller_params": {"segment": 3}})
