"""Tree rollouts (`rollout.controller: tree`): n leaves per prompt branched from shared segments, each leaf's
tokens and behaviour log-probs exactly what the model gives them, the path recorded for the tree advantages."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer, toy_run_config, train_tiny
from lmrl.config import ConfigError
from lmrl.engines.base import Completion, SamplingParams
from lmrl.engines.hf import HFEngine
from lmrl.envs.tree_rollout import TreeRollout, share_out, tree_metrics
from lmrl.models import tiny_llama
from lmrl.types import Group, Sample


def test_children_are_shared_out_up_to_the_leaves_left():
    assert share_out(8, 4, None) == [2, 2, 2, 2]
    assert share_out(5, 4, None) == [2, 1, 1, 1]
    assert share_out(8, 2, 2) == [2, 2]  # capped by the divergence
    assert share_out(3, 2, 2) == [2, 1]  # capped by the leaves left
    assert share_out(2, 2, 2) == [1, 1]


@pytest.fixture(scope="module")
def engine_and_prompts():
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).eval()
    prompts = [tok("say 7", add_special_tokens=False)["input_ids"], tok("add 1+2", add_special_tokens=False)["input_ids"]]
    return model, HFEngine(model, [tok.eos_token_id], tok.pad_token_id), prompts


def test_a_tree_has_n_leaves_whose_tokens_and_logprobs_are_exact(engine_and_prompts):
    model, engine, prompts = engine_and_prompts
    tree = TreeRollout(segment_tokens=3, divergence=2, depth=3)
    out = tree.complete(engine, prompts, 8, SamplingParams(max_new_tokens=12), torch.Generator().manual_seed(0))
    assert [len(leaves) for leaves in out] == [8, 8]
    for prompt, leaves in zip(prompts, out):
        paths = [c.info["tree"]["nodes"] for c in leaves]
        assert [p[0] for p in paths] == ["0"] * 4 + ["1"] * 4  # 8 // 2^2 branches at the first depth
        assert paths[0] == ["0", "0.0", "0.0.0"] and paths[-1] == ["1", "1.1", "1.1.1"]
        for c in leaves:
            ends = c.info["tree"]["ends"]
            assert ends[:2] == [3, 6] and ends[-1] == len(c.token_ids) and len(c.logprobs) == len(c.token_ids)
            with torch.no_grad():  # the model's own log-probs of the leaf's tokens given everything before them
                ids = torch.tensor([prompt + c.token_ids])
                logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
            want = logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-5, rtol=1e-5)
        by_node = {}
        for c in leaves:  # a shared segment holds the same tokens in every leaf through it
            starts = [0] + c.info["tree"]["ends"][:-1]
            for node, a, b in zip(c.info["tree"]["nodes"], starts, c.info["tree"]["ends"]):
                assert by_node.setdefault(node, c.token_ids[a:b]) == c.token_ids[a:b]
        assert len(by_node) == 2 + 4 + 8


def test_prefix_dedup_trains_every_generated_token_once(engine_and_prompts):
    _, engine, prompts = engine_and_prompts
    tree = TreeRollout(segment_tokens=3, divergence=2, depth=3, prefix_dedup=True)
    out = tree.complete(engine, prompts[:1], 8, SamplingParams(max_new_tokens=12), torch.Generator().manual_seed(0))
    samples = [Sample(prompt_ids=prompts[0], completion_ids=c.token_ids, behaviour_logprobs=c.logprobs,
                      loss_mask=c.loss_mask, info=c.info) for c in out[0]]
    metrics = tree_metrics([Group("g", {}, samples)])
    assert sum(sum(x.loss_mask) for x in samples) == metrics["rollout/tree_tokens"]
    assert metrics["rollout/leaf_tokens"] == sum(len(x.completion_ids) for x in samples)
    assert samples[0].loss_mask == [1] * len(samples[0].completion_ids)  # the first leaf keeps its whole path
    assert samples[1].loss_mask[:6] == [0] * 6  # the second shares "0" and "0.0" with it


class EndsFirstBranch:
    """Ends the first prompt of its first call at once (EOS); every other branch runs to the token limit."""

    version = 0

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, params, generator=None):
        self.calls.append(len(prompts))
        first = len(self.calls) == 1
        return [[Completion([9] if first and i == 0 else [5] * params.max_new_tokens,
                            [-0.5] if first and i == 0 else [-1.0] * params.max_new_tokens,
                            "stop" if first and i == 0 else "length")] for i in range(len(prompts))]


def test_a_branch_that_ends_early_gives_its_leaves_to_the_others():
    engine = EndsFirstBranch()
    out = TreeRollout(segment_tokens=2, divergence=2, depth=2).complete(engine, [[1, 2]], 4, SamplingParams(max_new_tokens=6))
    paths = [c.info["tree"]["nodes"] for c in out[0]]
    assert paths == [["0"], ["1", "1.0"], ["1", "1.1"], ["1", "1.2"]]  # "1" takes the 3 leaves left
    assert engine.calls == [2, 3]
    assert out[0][0].token_ids == [9] and out[0][1].token_ids == [5] * 6 and out[0][1].info["tree"]["ends"] == [2, 6]
    assert out[0][1].logprobs == [-1.0] * 6 and out[0][1].policy_version == [0] * 6


def test_the_controller_trains_end_to_end_and_is_checked_before_the_model_loads(tmp_path):
    cfg = toy_run_config(tmp_path, 2, rollout={"controller": "tree", "group_size": 4,
                                               "controller_params": {"segment_tokens": 2, "divergence": 2, "depth": 2}})
    rows, stages = train_tiny(cfg)
    assert len(rows) == 2 and 0 < rows[0]["rollout/tree_token_share"] < 1
    assert rows[0]["rollout/leaf_tokens"] > rows[0]["rollout/tree_tokens"]
    with pytest.raises(ConfigError, match="rollout.controller: unknown rollout controller 'forest'"):
        toy_run_config(tmp_path, 1, rollout={"controller": "forest"})
    with pytest.raises(ConfigError, match=r"controller_params of tree: divergence: Input should be greater than or equal to 1 \(got 0\)"):
        toy_run_config(tmp_path, 1, rollout={"controller": "tree", "controller_params": {"divergence": 0}})
    with pytest.raises(ConfigError, match="but rollout.controller is not"):
        toy_run_config(tmp_path, 1, rollout={"controller_params": {"depth": 2}})
