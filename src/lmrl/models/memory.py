"""What a training rank holds: parameters, gradients, optimiser state, activations and KV cache.

`estimate_memory` is a pure function of a decoder's shape (`ModelShape`: Llama / Qwen2 layout,
SwiGLU MLP, grouped-query attention), a precision, the sharding (none, or FSDP over N ranks) and the
token counts of a micro-batch and of the rank's generation, so `lmrl train --dry-run` can say what
a configured run needs per rank and docs/scaling.md can say what fits where. Counted:

- parameters: q and o projections h·h each, k and v h·d_kv each (d_kv = kv_heads·head_dim, biased
  in Qwen2), the MLP 3·h·i, two RMSNorms per layer, the final norm, the embedding and, untied, the
  LM head;
- AdamW: two moments per parameter, plus a float32 master copy when the weights are bf16;
- activations, what autograd saves per token of a micro-batch (SDPA attention, no attention
  matrix): per layer 8·h + 2·d_kv + 4·i + heads + 2 elements (the norms' inputs and outputs, q,
  k and v before and after RoPE, the attention output and its reshaped copy, the MLP's gate, up,
  SiLU and product, the norms' reciprocal RMS and attention's log-sum-exp), 3·h outside the
  layers, and the float32 logits (V·4 bytes) that the log-probabilities' log-sum-exp keeps. With
  gradient checkpointing each layer keeps only its input (h), and backward recomputes one layer
  at a time;
- FSDP over N ranks: parameters, gradients and optimiser state divided by N, plus the largest
  unit (a decoder layer, or the embedding) gathered whole with its gradient;
- KV cache: keys and values, 2·layers·d_kv elements per token the engine holds.

Measured against autograd's saved tensors and the tensors' own sizes in `benchmarks/memory_model.py`
(docs/scaling.md, "What fits where").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int
    tied: bool = False  # LM head shares the embedding (SmolLM2, Qwen2.5-0.5B)
    qkv_bias: bool = False  # Qwen2's biased q, k and v projections

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        attention = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + head + self.hidden

    @classmethod
    def from_hf(cls, config: Any) -> ModelShape:
        """The shape of a transformers config (Llama, Qwen2, Mistral, … field names)."""
        heads = config.num_attention_heads
        return cls(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads, vocab=config.vocab_size,
                   intermediate=config.intermediate_size, tied=bool(getattr(config, "tie_word_embeddings", False)),
                   qkv_bias=config.model_type == "qwen2")


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of weights, gradients and optimiser state; bytes per activation element."""
    weights: int
    grads: int
    optimiser: int
    activations: int


PRECISIONS = {
    "fp32": Precision(weights=4, grads=4, optimiser=8, activations=4),
    "bf16_autocast": Precision(weights=4, grads=4, optimiser=8, activations=2),  # trainer.bf16: fp32 weights
    "bf16": Precision(weights=2, grads=2, optimiser=12, activations=2),  # bf16 weights, fp32 master + moments
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank."""
    params: float
    grads: float
    optimiser: float
    activations: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimiser + self.activations + self.kv_cache

    def line(self) -> str:
        parts = [("params", self.params), ("grads", self.grads), ("optimiser", self.optimiser),
                 ("activations", self.activations), ("KV cache", self.kv_cache)]
        return ("memory per rank: " + ", ".join(f"{name} {readable(value)}" for name, value in parts)
                + f" = {readable(self.total)}")


def activation_elements(shape: ModelShape, checkpointing: bool) -> tuple[int, int, int]:
    """Per token: (elements autograd keeps through the forward pass, elements of the one layer backward
    recomputes under checkpointing, float32 logit bytes)."""
    h, kv, i = shape.hidden, shape.kv_dim, shape.intermediate
    layer = 8 * h + 2 * kv + 4 * i + shape.heads + 2
    if checkpointing:
        return shape.layers * h + 3 * h, layer, 4 * shape.vocab
    return shape.layers * layer + 3 * h, 0, 4 * shape.vocab


def estimate_memory(shape: ModelShape, *, precision: str = "fp32", sharding: Literal["none", "fsdp"] = "none",
                    ranks: int = 1, micro_batch_tokens: int = 0, checkpointing: bool = False,
                    kv_tokens: int = 0, reference: bool = False) -> MemoryEstimate:
    """Per-rank bytes of a rank training `shape` on micro-batches of `micro_batch_tokens` tokens, holding a
    KV cache of `kv_tokens` tokens (its generation batch: sequences × length) in the activation precision.

    `sharding="fsdp"` divides the training state over `ranks` and adds the largest unit gathered whole;
    `"none"` (data-parallel replicas, or one process) keeps all of it on every rank. `reference`: a frozen
    copy of the weights (a KL term's reference model), sharded as the policy is."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if sharding not in ("none", "fsdp") or ranks < 1:
        raise ValueError(f"sharding must be none or fsdp over ranks >= 1, got {sharding!r} over {ranks}")
    p = PRECISIONS[precision]
    share = ranks if sharding == "fsdp" else 1
    gathered = max(shape.layer_params, shape.embedding_params) if share > 1 else 0
    kept, recomputed, logits = activation_elements(shape, checkpointing)
    copies = 2 if reference else 1
    return MemoryEstimate(
        params=copies * (shape.params / share + gathered) * p.weights,
        grads=(shape.params / share + gathered) * p.grads,
        optimiser=shape.params / share * p.optimiser,
        activations=micro_batch_tokens * ((kept + recomputed) * p.activations + logits),
        kv_cache=2 * shape.layers * shape.kv_dim * kv_tokens * p.activations,
    )


def readable(size: float) -> str:
    """Bytes as GiB (from 1 GiB) or MiB."""
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 2**20:.1f} MiB"


def inference_memory(shape: ModelShape, kv_tokens: int, tensor_parallel: int = 1, weight_bytes: int = 2) -> float:
    """Per-GPU bytes of an inference engine: its weights (bf16 by default) and the KV cache of `kv_tokens`
    tokens in the same precision, both split over `tensor_parallel` GPUs (by heads; a KV head is not split)."""
    kv_split = min(tensor_parallel, shape.kv_heads)
    return shape.params * weight_bytes / tensor_parallel + 2 * shape.layers * shape.kv_dim * kv_tokens * weight_bytes \
        / kv_split
