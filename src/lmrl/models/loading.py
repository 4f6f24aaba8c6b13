"""Resolve a model argument to a local transformers directory and load tokenizer and model from it.

A model argument is ``"default"`` (the embedded SmolLM2), a transformers directory, or a
``.gguf`` file (converted once into a cache keyed by its hash). Hub names are rejected up front
with a clear message, because lmrl runs without access to a model hub.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lmrl.models.convert import convert_gguf, lmrl_home, sha256_file
from lmrl.models.default import pull_default_model


def resolve_model_path(path: str | os.PathLike) -> Path:
    """Map ``"default"``, a transformers directory or a ``.gguf`` file to a transformers directory."""
    if str(path) == "default":
        return pull_default_model()
    candidate = Path(path).expanduser()
    if candidate.is_dir() and (candidate / "config.json").is_file():
        return candidate
    if candidate.is_file() and candidate.suffix.lower() == ".gguf":
        digest = sha256_file(candidate)
        return convert_gguf(candidate, lmrl_home() / "models" / f"gguf-{digest[:16]}", digest)
    raise FileNotFoundError(
        f"model {str(path)!r} not found: expected a transformers directory containing config.json, "
        "a .gguf file, or \"default\" (the embedded SmolLM2-135M-Instruct). Model hub names "
        "cannot be downloaded here; convert or copy the model to a local path first."
    )


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load the tokenizer for a model argument, with a pad token guaranteed (eos if none)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load a causal LM for a model argument in ``dtype``."""
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=dtype)


def tiny_llama(
    vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0
) -> LlamaForCausalLM:
    """A tiny randomly initialised Llama for tests; the global torch RNG is left untouched."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)
