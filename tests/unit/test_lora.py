"""LoRA through peft (`model.lora`): only adapters train, the reference is the base with adapters disabled
(no copy), checkpoints hold the adapters and resume exactly, `lmrl export --merge` writes a plain model."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import make_tokenizer, toy_run_config
from lmrl import cli
from lmrl.config import ConfigError, LoraConfig, TrainerConfig
from lmrl.engines import HFEngine, SamplingParams
from lmrl.learners import Learner
from lmrl.learners.checkpoint import list_checkpoints, load_checkpoint
from lmrl.loading import load_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.models.lora import apply_lora, frozen_base_in_bf16
from lmrl.types import Sample, collate

LORA = {"r": 4, "alpha": 8}


def tiny(tok):
    return tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)


def stages_for(cfg, model=None):
    tok = make_tokenizer()
    return build_stages(cfg, model=model or tiny(tok), tokenizer=tok)


def lora_config(tmp_path, steps=2, **sections):
    model = {"lora": LORA, **sections.pop("model", {})}
    return toy_run_config(tmp_path, steps, model=model, **sections)


def make_batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        n_prompt, n_comp = 2 + i % 3, 1 + (i * 2) % 5
        samples.append(Sample(prompt_ids=torch.randint(4, vocab, (n_prompt,), generator=g).tolist(),
                              completion_ids=torch.randint(4, vocab, (n_comp,), generator=g).tolist(),
                              behaviour_logprobs=[-1.0] * n_comp, reward=float(i % 2)))
    return collate(samples, [0, 0, 0, 1, 1, 1], pad_id=0)


def perturb_adapters(model, seed=1):
    """Seeded adapter weights with B non-zero, so the adapted policy differs from the base (peft starts B at 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def base_weights(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}


def test_only_the_adapters_train(tmp_path):
    s = stages_for(lora_config(tmp_path))
    trainable = [n for n, p in s.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for g in s.learner.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in s.model.parameters() if p.requires_grad}
    adapted = {n.rsplit(".lora_", 1)[0] for n in trainable}
    assert len(adapted) == 2 * 7  # every linear layer of both blocks (q k v o gate up down), not the LM head
    assert not any("lm_head" in n or "embed" in n for n in trainable)


def test_the_reference_is_the_base_with_adapters_disabled_and_no_copy(tmp_path, tokenizer):
    s = stages_for(lora_config(tmp_path, algo={"kl_coef": 0.01}))
    assert s.algorithm.needs_reference and s.learner.reference is None
    modules = [m for m in vars(s.learner).values() if isinstance(m, torch.nn.Module)]
    held = {id(p) for m in modules for p in m.parameters()}
    assert s.model in modules and held == {id(p) for p in s.model.parameters()}  # no weights but the policy's
    perturb_adapters(s.model)
    batch = make_batch(len(tokenizer))
    reference = s.learner.logprobs(batch, reference=True)
    base = Learner(tiny(tokenizer), TrainerConfig(bf16=False)).logprobs(batch)
    policy = s.learner.logprobs(batch)
    assert torch.equal(reference, base)
    assert not torch.allclose(policy, base)  # the adapters are on again after the reference pass


def test_a_real_update_changes_only_adapter_weights(tmp_path):
    s = stages_for(lora_config(tmp_path, steps=2, algo={"kl_coef": 0.01}))
    before_base = base_weights(s.model)
    before_lora = {n: p.clone() for n, p in s.model.named_parameters() if p.requires_grad}
    train(s.cfg, stages=s)
    after_base = base_weights(s.model)
    assert all(torch.equal(before_base[k], after_base[k]) for k in before_base)
    changed = [n for n, p in s.model.named_parameters() if p.requires_grad and not torch.equal(p, before_lora[n])]
    assert any("lora_B" in n for n in changed) and any("lora_A" in n for n in changed)


def test_checkpoint_holds_adapters_and_a_resumed_run_is_bit_identical(tmp_path):
    cfg_full = lora_config(tmp_path / "a", steps=4, algo={"kl_coef": 0.01})
    full = stages_for(cfg_full)
    train(cfg_full, stages=full)

    cfg_half = lora_config(tmp_path / "b", steps=2, algo={"kl_coef": 0.01}, run={"checkpoint_every": 1})
    result = train(cfg_half, stages=stages_for(cfg_half))
    saved = list_checkpoints(result.run_dir / "checkpoints")[-1] / "model"
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in saved.iterdir()}
    assert not (saved / "model.safetensors").exists()
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == LORA["r"]

    cfg_resumed = lora_config(tmp_path / "b", steps=4, algo={"kl_coef": 0.01}, run={"checkpoint_every": 1})
    resumed = stages_for(cfg_resumed)
    train(cfg_resumed, resume=result.run_dir, stages=resumed)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(full.learner.optimizer.state.values(), resumed.learner.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [(result.run_dir / "metrics.jsonl"), (tmp_path / "a" / "runs" / "toy" / "metrics.jsonl")]
    rewards = [[json.loads(ln).get("reward/mean") for ln in r.read_text().splitlines()] for r in rows]
    assert rewards[0] == rewards[1]


def test_a_lora_checkpoint_does_not_load_into_a_full_fine_tuning_run(tmp_path):
    cfg = lora_config(tmp_path / "a", steps=1)
    result = train(cfg, stages=stages_for(cfg))
    with pytest.raises(ConfigError, match="model.lora.alpha is None but the run started with 8.0"):
        train(toy_run_config(tmp_path / "a", 2), resume=result.run_dir)
    plain = stages_for(toy_run_config(tmp_path / "c", 2))
    ckpt = list_checkpoints(result.run_dir / "checkpoints")[-1]
    with pytest.raises(RuntimeError, match="holds LoRA adapters but the model has none"):
        load_checkpoint(ckpt, plain.model, plain.learner.optimizer, plain.learner.scheduler)


def saved_base(tmp_path, tok):
    """A tiny base model on disk, as `model.path` names it (export reloads the base from there)."""
    path = tmp_path / "base"
    tiny(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_export_merge_writes_a_plain_model_with_the_peft_models_logprobs(tmp_path, tokenizer):
    base = saved_base(tmp_path, tokenizer)
    cfg = lora_config(tmp_path, steps=2, model={"path": str(base)})
    s = build_stages(cfg, tokenizer=make_tokenizer())
    result = train(cfg, stages=s)
    out = tmp_path / "merged"
    assert cli.main(["export", str(result.run_dir), "--merge", str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(merged, "peft_config") and (out / "tokenizer.json").exists()
    batch = make_batch(len(tokenizer))
    want = s.learner.logprobs(batch)
    got = Learner(merged, TrainerConfig(bf16=False)).logprobs(batch)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, Learner(AutoModelForCausalLM.from_pretrained(base),
                                           TrainerConfig(bf16=False)).logprobs(batch), atol=1e-5)


def test_export_of_a_full_fine_tuning_run_copies_its_model(tmp_path, tokenizer, capsys):
    cfg = toy_run_config(tmp_path, 2, run={"checkpoint_every": 1})
    s = stages_for(cfg)
    result = train(cfg, stages=s)
    out = tmp_path / "exported"
    assert cli.main(["export", str(result.run_dir), "--step", "1", "--merge", str(out)]) == 0
    step1 = list_checkpoints(result.run_dir / "checkpoints")[0] / "model"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in step1.iterdir())
    assert cli.main(["export", str(result.run_dir), "--step", "7", "--merge", str(tmp_path / "x")]) == 2
    assert "no checkpoint at step 7; it has steps [1, 2]" in capsys.readouterr().err
    assert cli.main(["export", str(result.run_dir), "--merge", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_leaves_logprobs_and_gradients_unchanged(tokenizer, lora):
    batch = make_batch(len(tokenizer))
    batch.advantages = torch.randn(batch.completion_mask.shape, generator=torch.Generator().manual_seed(2))
    results = []
    for checkpointing in (False, True):
        model = tiny(tokenizer)
        if lora:
            model = apply_lora(model, LoraConfig(**LORA))
            perturb_adapters(model)
        learner = Learner(model, TrainerConfig(bf16=False, gradient_checkpointing=checkpointing))
        assert model.is_gradient_checkpointing == checkpointing
        model.train()
        saved = []  # what autograd keeps for backward: much less with the layers checkpointed
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            logp = learner.forward_logprobs(model, batch, with_entropy=False)["logp"]
        (logp * batch.advantages * batch.completion_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        assert grads and all(g.abs().sum() > 0 for g in grads.values())
        results.append((logp.detach(), grads, sum(saved)))
    (logp_off, grads_off, saved_off), (logp_on, grads_on, saved_on) = results
    assert saved_on < saved_off / 4
    assert torch.equal(logp_off, logp_on)
    for name in grads_off:
        assert torch.allclose(grads_off[name], grads_on[name], atol=1e-6, rtol=1e-5), name


def test_frozen_base_in_bf16_gives_the_same_numbers_under_autocast(tokenizer):
    batch = make_batch(len(tokenizer))
    batch.advantages = torch.randn(batch.completion_mask.shape, generator=torch.Generator().manual_seed(2))
    results = []
    for in_bf16 in (False, True):
        model = apply_lora(tiny(tokenizer), LoraConfig(**LORA))
        perturb_adapters(model)
        if in_bf16:
            frozen_base_in_bf16(model)
        dtypes = {n: p.dtype for n, p in model.named_parameters()}
        assert {dtypes[n] for n in dtypes if "base_layer" in n} == {torch.bfloat16 if in_bf16 else torch.float32}
        assert {dtypes[n] for n in dtypes if "base_layer" not in n} == {torch.float32}  # adapters, norms, embeddings
        learner = Learner(model, TrainerConfig(bf16=False), needs_reference=True, bf16=True)
        model.train()
        logp = learner.forward_logprobs(model, batch, with_entropy=False)["logp"]
        (logp * batch.advantages * batch.completion_mask).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        engine = HFEngine(model, eos_token_ids=[2], pad_token_id=0, bf16=True)
        rollout = engine.generate([[5, 6, 7], [8, 9]], 3, SamplingParams(max_new_tokens=6),
                                  torch.Generator().manual_seed(0))
        results.append((logp.detach(), learner.logprobs(batch, reference=True), grads,
                        [(c.token_ids, c.logprobs) for g in rollout for c in g]))
    (logp_a, ref_a, grads_a, roll_a), (logp_b, ref_b, grads_b, roll_b) = results
    assert torch.equal(logp_a, logp_b) and torch.equal(ref_a, ref_b) and roll_a == roll_b
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def test_lora_settings_are_checked_and_named(tmp_path):
    cfg = load_config("quickstart", ["model.lora={}"])
    assert (cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.target_modules) == (16, 32.0, "all-linear")
    with pytest.raises(ConfigError, match=r"model.lora.r: Input should be greater than or equal to 1"):
        load_config("quickstart", ["model.lora.r=0"])
    with pytest.raises(ConfigError, match=r"model.lora.rank"):
        load_config("quickstart", ["model.lora.rank=8"])
    cfg = lora_config(tmp_path, model={"lora": {**LORA, "target_modules": ["nope_proj"]}})
    with pytest.raises(ConfigError, match=r"model.lora.target_modules=\['nope_proj'\]"):
        stages_for(cfg)
