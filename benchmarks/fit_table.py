"""What fits where: the smallest layouts of 0.5B–70B Qwen2.5 / Llama-3 shapes on 80 GB GPUs, by the memory model.

Usage: python benchmarks/fit_table.py [--gpu-gb 80] [--usable 0.8] [--micro-batch-tokens 8192]
       [--engine-sequences 64] [--engine-tokens 4096]

A computation (`lmrl.models.memory`), no model is loaded. The learner trains in bf16 with float32 master
weights and AdamW moments (16 bytes a parameter) on micro-batches of `--micro-batch-tokens` tokens; a layout
fits when its per-rank total is at most `--usable` of the GPU (room for temporaries and the allocator, which
the model does not count). FSDP degrees are powers of two; "none" is one GPU (or data-parallel replicas).
An inference engine holds bf16 weights and the KV cache of `--engine-sequences` sequences of
`--engine-tokens` tokens, over the fewest tensor-parallel GPUs (a power of two) that fit.
"""
from __future__ import annotations

import argparse

from lmrl.models.memory import ModelShape, estimate_memory, inference_memory

SHAPES = {
    "Qwen2.5-0.5B": ModelShape(896, 24, 14, 2, 151936, 4864, tied=True, qkv_bias=True),
    "Qwen2.5-7B": ModelShape(3584, 28, 28, 4, 152064, 18944, qkv_bias=True),
    "Qwen2.5-32B": ModelShape(5120, 64, 40, 8, 152064, 27648, qkv_bias=True),
    "Llama-3-70B": ModelShape(8192, 80, 64, 8, 128256, 28672),
}
DEGREES = [1, 2, 4, 8, 16, 32, 64, 128]


def smallest_learner(shape: ModelShape, budget: float, **knobs) -> str:
    for ranks in DEGREES:
        est = estimate_memory(shape, precision="bf16", sharding="fsdp" if ranks > 1 else "none", ranks=ranks, **knobs)
        if est.total <= budget:
            where = "1 GPU" if ranks == 1 else f"FSDP {ranks}"
            return f"{where} ({est.total / 1e9:.1f} GB: state {(est.total - est.activations) / 1e9:.1f}, " \
                   f"act. {est.activations / 1e9:.1f})"
    floor = estimate_memory(shape, precision="bf16", sharding="fsdp", ranks=DEGREES[-1], **knobs).activations
    return f"no ({floor / 1e9:.0f} GB of activations per rank)"


def smallest_engine(shape: ModelShape, budget: float, kv_tokens: int) -> str:
    for tp in DEGREES:
        per_gpu = inference_memory(shape, kv_tokens, tensor_parallel=tp)
        if per_gpu <= budget:
            return f"TP {tp} ({per_gpu / 1e9:.1f} GB)"
    return "no"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-gb", type=float, default=80)
    ap.add_argument("--usable", type=float, default=0.8)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--engine-sequences", type=int, default=64)
    ap.add_argument("--engine-tokens", type=int, default=4096)
    a = ap.parse_args()
    budget = a.gpu_gb * 1e9 * a.usable
    kv_tokens = a.engine_sequences * a.engine_tokens
    print(f"| model | params | learner, checkpointing | learner, no checkpointing | learner + bf16 reference, "
          f"checkpointing | engine ({a.engine_sequences} × {a.engine_tokens} tokens) |")
    print("|---|---:|---|---|---|---|")
    for name, shape in SHAPES.items():
        micro = dict(micro_batch_tokens=a.micro_batch_tokens)
        print(f"| {name} | {shape.params / 1e9:.2f} B "
              f"| {smallest_learner(shape, budget, checkpointing=True, **micro)} "
              f"| {smallest_learner(shape, budget, checkpointing=False, **micro)} "
              f"| {smallest_learner(shape, budget, checkpointing=True, reference=True, **micro)} "
              f"| {smallest_engine(shape, budget, kv_tokens)} |")


if __name__ == "__main__":
    main()
