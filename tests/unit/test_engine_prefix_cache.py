"""Prefix KV reuse of the hf engine across calls: same tokens and log-probs as without, less prefill."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer
from lmrl.engines import HFEngine, SamplingParams
from lmrl.envs import Step
from lmrl.envs.episodes import Limits, run_episodes
from lmrl.models import tiny_llama

EOS = [2, 9]  # for this model and these prompts, greedy rows stop after 1–7 tokens or run to the limit
PROMPTS = [[5, 6, 7, 8], [9, 10], [4, 5, 6, 7, 8, 9, 10], [2, 2]]


@pytest.fixture
def model():
    return tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)


def play(engine, turns: int = 3, keep: bool = True, prefill_widths: list[int] | None = None):
    """Greedy turns straight through the engine; row i's observation is i + turn + 1 tokens."""
    prompts, turns_out = [list(p) for p in PROMPTS], []
    for turn in range(turns):
        params = SamplingParams(max_new_tokens=8, greedy=True, keep_prefix=keep)
        widths: list[int] = []
        hook = engine.model.get_decoder().register_forward_pre_hook(
            lambda mod, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
        try:
            out = engine.generate(prompts, 1, params)
        finally:
            hook.remove()
        if prefill_widths is not None:
            prefill_widths.append(widths[0])
        turns_out.append([(list(prompt), g[0]) for prompt, g in zip(prompts, out)])
        prompts = [p + g[0].token_ids + [11 + i] * (i + turn + 1) for i, (p, g) in enumerate(zip(prompts, out))]
    return turns_out


def test_greedy_turns_with_reuse_match_turns_without(model):
    plain = play(HFEngine(model, EOS, pad_token_id=0), keep=False)
    reused = play(HFEngine(model, EOS, pad_token_id=0), keep=True)
    lengths = set()
    for turn_a, turn_b in zip(plain, reused):
        for (prompt_a, a), (prompt_b, b) in zip(turn_a, turn_b):
            assert prompt_a == prompt_b and a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)
            lengths.add((len(a.token_ids), a.finish_reason))
    assert {reason for _, reason in lengths} == {"stop", "length"}
    assert len({n for n, reason in lengths if reason == "stop"}) >= 3  # rows finish at different steps


def test_reuse_prefills_only_the_new_tokens(model):
    engine = HFEngine(model, EOS, pad_token_id=0)
    widths: list[int] = []
    turns = play(engine, prefill_widths=widths)
    stats = engine.prefix_stats
    prompt_tokens = sum(len(p) for turn in turns for p, _ in turn)
    assert stats["prompt_tokens"] == prompt_tokens
    assert stats["reused_tokens"] > 0 and stats["prefill_tokens"] == prompt_tokens - stats["reused_tokens"]
    # from turn 2 on, each row's stored prefix is its previous prompt and completion less the last token
    reused = sum(len(prev_p) + len(prev_c.token_ids) - 1 for prev_turn in turns[:-1] for prev_p, prev_c in prev_turn)
    assert stats["reused_tokens"] == reused
    for prev, turn, width in zip(turns, turns[1:], widths[1:]):
        suffixes = [len(p) - len(prev_p) - len(prev_c.token_ids) + 1 for (p, _), (prev_p, prev_c) in zip(turn, prev)]
        assert width == max(suffixes) < max(len(p) for p, _ in turn)
    kv = sum(len(p) + len(c.token_ids) - 1 for p, c in turns[-1]) * 2 * 2 * 32 * 4  # layers, k/v, hidden, fp32
    assert stats["kv_bytes"] == kv


def test_nothing_is_reused_after_a_weight_update(model):
    engine = HFEngine(model, EOS, pad_token_id=0)
    first = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=4, greedy=True, keep_prefix=True))
    assert engine.prefix_stats["kv_bytes"] > 0
    engine.update_weights(None, version=1)
    assert engine.prefix_stats["kv_bytes"] == 0
    follow = [p + g[0].token_ids + [11] for p, g in zip(PROMPTS, first)]
    engine.generate(follow, 1, SamplingParams(max_new_tokens=4, greedy=True, keep_prefix=True))
    assert engine.prefix_stats["reused_tokens"] == 0


def test_calls_without_the_flag_neither_keep_nor_reuse(model):
    engine = HFEngine(model, EOS, pad_token_id=0)
    engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=4))
    assert engine.prefix_stats == {"prompt_tokens": 0, "reused_tokens": 0, "prefill_tokens": 0, "kv_bytes": 0,
                                   "kv_bytes_peak": 0}


def full_forward_logprobs(model, prompt, completion):
    logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def test_sampled_samples_with_reuse_share_a_prompt_and_match_a_full_forward(model):
    engine = HFEngine(model, EOS, pad_token_id=0)
    params = SamplingParams(max_new_tokens=6, keep_prefix=True)
    gen = torch.Generator().manual_seed(0)
    first = engine.generate(PROMPTS[:2], 3, params, gen)
    follow = [PROMPTS[0] + c.token_ids + [12, 13] for c in first[0]] + [PROMPTS[0]]  # 3 stored, 1 cropped
    out = engine.generate(follow, 2, params, gen)
    assert engine.prefix_stats["reused_tokens"] > 0
    for prompt, group in zip(follow, out):
        for c in group:
            expected = full_forward_logprobs(model, prompt, c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(expected), atol=1e-5, rtol=0)


class Chat:
    """Three turns, each answered with a short user message."""

    def reset(self, row, seed):
        return [{"role": "user", "content": row["question"]}], {"turn": 0}

    def step(self, reply, state):
        state["turn"] += 1
        done = state["turn"] >= 3
        return Step(None if done else [{"role": "user", "content": "go on " * state["turn"]}], 0.0, done)


class Recording:
    """The hf engine, recording the completions it returned."""

    def __init__(self, engine):
        self.engine, self.returned = engine, []
        self.pad_token_id = engine.pad_token_id

    def generate(self, prompts, n, params, generator=None):
        out = self.engine.generate(prompts, n, params, generator)
        self.returned += [(list(p), g[0]) for p, g in zip(prompts, out)]
        return out


def turn_starts(sample):
    """Where each policy turn starts in the completion: the starts of the runs of loss-mask 1."""
    mask = sample.loss_mask
    return [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]


def test_sampled_episodes_with_reuse_train_on_the_sampled_ids():
    tok = make_tokenizer()
    model = tiny_llama(vocab_size=len(tok), hidden=32, layers=2, heads=4, seed=0)
    engine = Recording(HFEngine(model, [tok.eos_token_id], tok.pad_token_id))
    rows = [{"uid": f"r{i}", "question": q, "answer": ""} for i, q in enumerate(["hi", "what is 2+2?"])]
    groups = run_episodes(engine, tok, rows, 2, SamplingParams(max_new_tokens=12), Chat(), Limits(),
                          torch.Generator().manual_seed(0))
    assert engine.engine.prefix_stats["reused_tokens"] > 0
    by_prompt: dict[tuple, list] = {}  # the opening prompt is shared by a row's two episodes
    for p, c in engine.returned:
        by_prompt.setdefault(tuple(p), []).append(c)
    turns = 0
    for x in (x for g in groups for x in g.samples):
        full = x.prompt_ids + x.completion_ids
        for start, length in zip(turn_starts(x), x.info["turn_lengths"]):
            ids = x.completion_ids[start:start + length]
            c = next(c for c in by_prompt[tuple(full[:len(x.prompt_ids) + start])] if c.token_ids == ids)
            assert x.behaviour_logprobs[start:start + length] == c.logprobs  # trained ids = sampled ids
            expected = full_forward_logprobs(model, full[:len(x.prompt_ids) + start], c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(expected), atol=1e-5, rtol=0)
            turns += 1
    assert turns >= 8

