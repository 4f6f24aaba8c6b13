"""Where a tree rollout's segments end (`split: tokens | delimiter | entropy`): at the first step delimiter past
`segment_tokens` (or the window `max_segment_tokens`), or before the most uncertain token, with every leaf's
tokens and behaviour log-probs still exactly what the model gives them."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer, toy_run_config, train_tiny
from lmrl.config import ConfigError
from lmrl.engines.base import Completion, SamplingParams
from lmrl.engines.hf import HFEngine
from lmrl.envs.controllers import build_controller
from lmrl.envs.tree_rollout import TreeParams, cut_segment
from lmrl.models import tiny_llama

TOK = make_tokenizer()


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_the_cut_of_each_split():
    seg = ids("ab cde fg")
    logprobs = [-5.0, -0.1, -0.2, -3.0, -0.3, -0.1, -0.4, -0.2, -0.1]
    assert cut_segment(TreeParams(split="tokens"), seg, logprobs, TOK) == 9
    # the first delimiter at or after 4 tokens ends "ab cde " (the one after "ab" comes too early)
    assert cut_segment(TreeParams(split="delimiter", delimiter=" ", segment_tokens=4), seg, logprobs, TOK) == 7
    assert cut_segment(TreeParams(split="delimiter", delimiter=" ", segment_tokens=2), seg, logprobs, TOK) == 3
    assert cut_segment(TreeParams(split="delimiter", delimiter="\n", segment_tokens=3), seg, logprobs, TOK) == 9
    # the most uncertain token after the first (−log p = 3.0 at index 3) is left for the children to resample
    assert cut_segment(TreeParams(split="entropy"), seg, logprobs, TOK) == 3


class Surprising:
    """Samples token 5 with the log-probs -0.1, -2.0, -0.5, -3.0, then -0.1: the fourth token is the most uncertain."""

    version = 0

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, n, params, generator=None):
        self.prompts.append(prompts)
        pattern = [-0.1, -2.0, -0.5, -3.0]
        return [[Completion([5] * params.max_new_tokens, [pattern[i] if i < 4 else -0.1
                                                          for i in range(params.max_new_tokens)], "length")]
                for _ in prompts]


def test_entropy_forks_before_the_most_uncertain_token():
    engine = Surprising()
    tree = build_controller("tree", {"split": "entropy", "segment_tokens": 4, "divergence": 2, "depth": 2})
    out = tree.complete(engine, [[1, 2]], 2, SamplingParams(max_new_tokens=10))
    assert [c.info["tree"]["ends"] for c in out[0]] == [[3, 10], [3, 10]]
    assert [c.info["tree"]["nodes"] for c in out[0]] == [["0", "0.0"], ["0", "0.1"]]
    assert engine.prompts[1] == [[1, 2, 5, 5, 5]] * 2  # the children continue the kept three tokens
    assert out[0][0].logprobs == [-0.1, -2.0, -0.5] + [-0.1, -2.0, -0.5, -3.0, -0.1, -0.1, -0.1]


@pytest.mark.parametrize("knobs", [{"split": "delimiter", "delimiter": " ", "segment_tokens": 2, "max_segment_tokens": 5},
                                   {"split": "entropy", "segment_tokens": 4}])
def test_leaves_are_exact_under_every_split(knobs):
    model = tiny_llama(len(TOK), hidden=32, layers=2, heads=4, seed=0).eval()
    engine = HFEngine(model, [TOK.eos_token_id], TOK.pad_token_id)
    tree = build_controller("tree", {**knobs, "divergence": 2, "depth": 3}, TOK)
    prompts = [ids("say 7"), ids("add 1+2")]
    out = tree.complete(engine, prompts, 4, SamplingParams(max_new_tokens=14), torch.Generator().manual_seed(0))
    cuts = 0
    for prompt, leaves in zip(prompts, out):
        assert len(leaves) == 4
        for c in leaves:
            assert len(c.token_ids) <= 14 and len(c.logprobs) == len(c.token_ids) == c.info["tree"]["ends"][-1]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1].float(), -1)
            want = logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=1e-5)
            starts = [0] + c.info["tree"]["ends"][:-1]
            for a, b in list(zip(starts, c.info["tree"]["ends"]))[:-1]:  # the segments before the last depth
                segment = c.token_ids[a:b]
                if knobs["split"] == "delimiter":
                    assert 2 <= len(segment) <= 5 and (len(segment) == 5 or TOK.decode(segment).endswith(" "))
                else:
                    assert 1 <= len(segment) <= 3  # cut before the most uncertain of 4 sampled tokens
                cuts += 1
    assert cuts > 0


def test_the_tree_steps_settings_train_and_bad_knobs_are_refused(tmp_path):
    cfg = toy_run_config(tmp_path, 2, rollout={"controller": "tree", "group_size": 4, "max_new_tokens": 8,
                                               "controller_params": {"split": "delimiter", "delimiter": " ",
                                                                     "segment_tokens": 2, "depth": 2}},
                         algo={"advantage": "tree_segment"})
    rows, _ = train_tiny(cfg)
    assert len(rows) == 2 and rows[0]["rollout/leaf_tokens"] >= rows[0]["rollout/tree_tokens"] > 0
    with pytest.raises(ConfigError, match="max_segment_tokens=2 must be at least segment_tokens=4"):
        toy_run_config(tmp_path, 1, rollout={"controller": "tree", "controller_params": {
            "split": "delimiter", "segment_tokens": 4, "max_segment_tokens": 2}})
    with pytest.raises(ConfigError, match="split"):
        toy_run_config(tmp_path, 1, rollout={"controller": "tree", "controller_params": {"split": "words"}})
    with pytest.raises(ValueError, match="needs the tokenizer"):
        build_controller("tree", {"split": "delimiter"}).complete(None, [[1]], 2, SamplingParams(max_new_tokens=4))
