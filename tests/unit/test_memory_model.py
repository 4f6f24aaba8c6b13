"""The memory model against hand-computed values, and against the sizes a tiny model really has.

The hand shape: hidden 8, 2 layers, 2 heads (head_dim 4), 1 KV head (d_kv 4), vocabulary 10,
intermediate 16, untied. A layer has q, o 8·8 each, k, v 8·4 each, the MLP 3·8·16 and two norms of 8:
128 + 64 + 384 + 16 = 592; the model 2·592 + 10·8 (embedding) + 10·8 (head) + 8 (final norm) = 1352.
Activations per token: a layer keeps 8·8 + 2·4 + 4·16 + 2 heads + 2 = 140 elements; two layers and 3·8
around them 304; the float32 logits 10·4 = 40 bytes.
"""
from __future__ import annotations

import pytest
import torch

from lmrl.algos.logprobs import selected_logprobs
from lmrl.models.loading import tiny_model
from lmrl.models.memory import GIB, MemoryEstimate, ModelShape, estimate_memory, inference_memory

HAND = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, vocab=10, intermediate=16)


def test_parameters_of_the_hand_shape():
    assert HAND.layer_params == 592 and HAND.params == 1352
    assert ModelShape(8, 2, 2, 1, 10, 16, tied=True).params == 1352 - 80
    assert ModelShape(8, 2, 2, 1, 10, 16, qkv_bias=True).params == 1352 + 2 * (8 + 4 + 4)


@pytest.mark.parametrize("family", ["llama", "llama_tied", "qwen2"])
def test_parameters_are_those_of_the_transformers_model(family):
    model = tiny_model(family, 100, hidden=32, layers=2, heads=4)
    assert ModelShape.from_hf(model.config).params == sum(p.numel() for p in model.parameters())


def test_published_sizes():
    assert round(ModelShape(896, 24, 14, 2, 151936, 4864, tied=True, qkv_bias=True).params / 1e6) == 494  # Qwen2.5-0.5B
    assert round(ModelShape(4096, 32, 32, 8, 128256, 14336).params / 1e9, 2) == 8.03  # Llama-3-8B


def test_float32_one_process():
    est = estimate_memory(HAND, micro_batch_tokens=10, kv_tokens=5)
    assert (est.params, est.grads, est.optimiser) == (1352 * 4, 1352 * 4, 1352 * 8)
    assert est.activations == 10 * (304 * 4 + 40)  # 12560
    assert est.kv_cache == 2 * 2 * 4 * 5 * 4  # keys and values, 2 layers, d_kv 4, 5 tokens, float32
    assert est.total == 5408 + 5408 + 10816 + 12560 + 320


def test_checkpointing_keeps_each_layer_input_and_recomputes_one_layer():
    est = estimate_memory(HAND, micro_batch_tokens=10, checkpointing=True)
    assert est.activations == 10 * ((2 * 8 + 24 + 140) * 4 + 40)  # 7600


def test_fsdp_divides_the_state_and_adds_the_gathered_layer():
    est = estimate_memory(HAND, precision="bf16", sharding="fsdp", ranks=4, micro_batch_tokens=10)
    assert est.params == est.grads == (1352 / 4 + 592) * 2  # 1860: a quarter, plus a layer gathered whole
    assert est.optimiser == 1352 / 4 * 12  # fp32 master weights and two moments
    assert est.activations == 10 * (304 * 2 + 40)  # bf16 activations, float32 logits
    assert estimate_memory(HAND, sharding="none", ranks=4).params == 1352 * 4  # replicas hold everything


def test_a_reference_model_is_a_second_copy_of_the_weights():
    est = estimate_memory(HAND, precision="bf16_autocast", reference=True)
    assert est.params == 2 * 1352 * 4 and est.grads == 1352 * 4


def test_the_dry_run_line():
    est = MemoryEstimate(params=GIB, grads=GIB / 2, optimiser=0, activations=1.5 * 2**20, kv_cache=0)
    assert est.line() == ("memory per rank: params 1.00 GiB, grads 512.0 MiB, optimiser 0.0 MiB, "
                          "activations 1.5 MiB, KV cache 0.0 MiB = 1.50 GiB")


def test_unknown_precision_or_sharding_is_refused():
    with pytest.raises(ValueError, match="precision must be one of fp32"):
        estimate_memory(HAND, precision="fp8")
    with pytest.raises(ValueError, match="sharding must be none or fsdp"):
        estimate_memory(HAND, sharding="zero3")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_are_what_autograd_saves_in_a_tiny_llama(checkpointing):
    """The forward pass's saved tensors (parameters excluded) equal the model's kept figure within 1 %."""
    model = tiny_model("llama", 1000, hidden=64, layers=3, heads=4)
    model.config._attn_implementation = "sdpa"
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(1000, (2, 50), generator=torch.Generator().manual_seed(0))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        selected_logprobs(model(ids, use_cache=False).logits[:, :-1], ids[:, 1:], False)
    est = estimate_memory(ModelShape.from_hf(model.config), micro_batch_tokens=100, checkpointing=checkpointing)
    recomputed = 100 * (8 * 64 + 2 * 64 + 4 * 256 + 4 + 2) * 4 if checkpointing else 0
    assert sum(saved.values()) == pytest.approx(est.activations - recomputed, rel=0.01)


def test_the_dry_run_prints_the_configured_runs_memory(tmp_path):
    """The toy run (tiny Llama: hidden 32, 2 layers, d_kv 32), 4 prompts × 8 samples of up to 512 + 6 tokens:
    the KV cache of one rank is 2·2·32·(32·518)·4 bytes = 8.1 MiB, of each of 2 ranks half of it."""
    from conftest import save_tiny_model, toy_run_config
    from lmrl.loops.setup import preflight

    model = {"path": str(save_tiny_model(tmp_path / "model"))}
    one = preflight(toy_run_config(tmp_path / "one", 1, model=model, trainer={"device": "cpu"}))
    two = preflight(toy_run_config(tmp_path / "two", 1, model=model, trainer={"device": "cpu"},
                                   dist={"backend": "ray", "learner_ranks": 2}))
    assert "memory per rank: params " in one and "KV cache 8.1 MiB = " in one and "(1 rank, sharding none)" in one
    assert "KV cache 4.0 MiB = " in two and "(2 ranks, sharding none)" in two


def test_an_inference_engine_splits_weights_and_kv_heads_over_tensor_parallel_gpus():
    kv = 2 * 2 * 4 * 100 * 2  # keys and values, 2 layers, d_kv 4, 100 tokens, bf16
    assert inference_memory(HAND, kv_tokens=100) == 1352 * 2 + kv
    assert inference_memory(HAND, kv_tokens=100, tensor_parallel=2) == 1352 + kv  # one KV head: copied, not split
