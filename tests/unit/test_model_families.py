"""Nothing is SmolLM2-specific: Llama (tied and untied embeddings) and Qwen2 roll out, score, train,
checkpoint and resume the same way, and the chat template comes from the tokenizer."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import CHAT_TEMPLATE, make_tokenizer, toy_run_config
from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.engines import HFEngine, SamplingParams
from lmrl.envs.single_turn import encode_prompt
from lmrl.learners import Learner
from lmrl.learners.checkpoint import load_checkpoint, save_checkpoint
from lmrl.loops import build_stages, train
from lmrl.models import TINY_FAMILIES, tiny_model
from lmrl.types import Sample, collate

VOCAB = 24


def full_forward_logprobs(model, prompt, completion):
    logp = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def rollout_batch(model, seed=0):
    """Completions sampled by the hf engine from prompts of different lengths, collated for the learner."""
    engine = HFEngine(model, eos_token_ids=[3], pad_token_id=0)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    out = engine.generate(prompts, 3, SamplingParams(max_new_tokens=7), torch.Generator().manual_seed(seed))
    samples, groups = [], []
    for g, (prompt, group) in enumerate(zip(prompts, out)):
        for j, c in enumerate(group):
            samples.append(Sample(prompt_ids=prompt, completion_ids=c.token_ids, behaviour_logprobs=c.logprobs,
                                  reward=float(j % 2)))
            groups.append(g)
    return prompts, out, collate(samples, groups, pad_id=0)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_families_differ_where_they_should(family):
    model = tiny_model(family, VOCAB, hidden=32)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied == (family == "llama_tied")
    assert (model.config.model_type == "qwen2") == (family == "qwen2")


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="qwen2"):
        tiny_model("gpt9", VOCAB)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_engine_logprobs_match_a_full_forward(family):
    model = tiny_model(family, VOCAB, hidden=32)
    prompts, out, _ = rollout_batch(model)
    for prompt, group in zip(prompts, out):
        for c in group:
            assert c.logprobs == pytest.approx(full_forward_logprobs(model, prompt, c.token_ids), abs=1e-4)


@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_learner_logprobs_match_the_engine(family, share_prompt):
    model = tiny_model(family, VOCAB, hidden=32)
    _, _, batch = rollout_batch(model)
    learner = Learner(model, TrainerConfig(micro_batch_tokens=16, bf16=False, share_prompt=share_prompt))
    logp = learner.logprobs(batch)
    mask = batch.completion_mask > 0
    assert torch.allclose(logp[mask], batch.behaviour_logprobs[mask], atol=1e-4)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_update_and_checkpoint_round_trip(family, tmp_path):
    model = tiny_model(family, VOCAB, hidden=32)
    _, _, batch = rollout_batch(model)
    algo = Algorithm(AlgoConfig(), max_new_tokens=7)
    learner = Learner(model, TrainerConfig(lr=1e-2, bf16=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    algo.prepare(batch)
    learner.update(batch, algo)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert "lm_head.weight" in changed and "model.embed_tokens.weight" in changed
    path = save_checkpoint(tmp_path, 1, model, make_tokenizer(), learner.optimizer, learner.scheduler, {"step": 1})

    fresh = tiny_model(family, VOCAB, hidden=32, seed=7)
    fresh_learner = Learner(fresh, TrainerConfig(lr=1e-2, bf16=False))
    load_checkpoint(path, fresh, fresh_learner.optimizer, fresh_learner.scheduler)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    tied = fresh.get_output_embeddings().weight.data_ptr() == fresh.get_input_embeddings().weight.data_ptr()
    assert tied == (family == "llama_tied")  # loading did not untie (or tie) the head


@pytest.mark.parametrize("family", ["llama_tied", "qwen2"])
def test_the_loop_trains_and_resumes_each_family(family, tmp_path):
    def run(path, steps, resume=None):
        cfg = toy_run_config(path, steps, run={"checkpoint_every": 1})
        tok = make_tokenizer()
        stages = build_stages(cfg, model=tiny_model(family, len(tok), hidden=32), tokenizer=tok)
        result = train(cfg, resume=resume, stages=stages)
        return stages, result

    full, _ = run(tmp_path / "a", 4)
    _, half = run(tmp_path / "b", 2)
    resumed, _ = run(tmp_path / "b", 4, resume=half.run_dir)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    rows = [json.loads(line) for line in (half.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(abs(r["mismatch_kl"]) < 1e-4 for r in rows)  # engine and learner agree on every family


def test_the_chat_template_comes_from_the_tokenizer():
    chatml, plain = make_tokenizer(), make_tokenizer()
    plain.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant: {% endif %}")
    row = {"question": "say 7"}
    for tok in (chatml, plain):
        expected = tok.apply_chat_template([{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": "say 7"}], add_generation_prompt=True)
        expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "input_ids") else expected
        assert encode_prompt(tok, row, "be brief") == list(expected)
    assert plain.decode(encode_prompt(plain, row, "be brief")) == "system: be brief\nuser: say 7\nassistant: "
    assert chatml.chat_template == CHAT_TEMPLATE
