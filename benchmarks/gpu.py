"""GPU benchmark for a lent accelerator: rollout tokens/s, training tokens/s and MFU of the train step.

Random-initialised models of Qwen2-0.5B and Qwen2-1.5B shape (weights cannot travel to the device
machine), lmrl's `hf` engine and learner, bf16 autocast. Synthetic GRPO batches: P prompts × G samples,
prompt length L_p, up to L_c new tokens (generation stops only at the length limit: random weights
rarely emit EOS).

    python benchmarks/gpu.py --out docs/gpu_results.md     # about 5 minutes on one H200

MFU counts 6·N·tokens for training (forward + backward, N = non-embedding + LM-head parameters) over
the device's dense bf16 peak (`--peak-tflops`, default 989 for an H100/H200 SXM).
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.engines import HFEngine, SamplingParams
from lmrl.learners import Learner
from lmrl.types import Sample, collate

SHAPES = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
}


def build(shape: str, device: str) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=shape == "0.5B",
                      **SHAPES[shape])
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device)


def matmul_params(model) -> int:
    embed = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    return total - embed + (head if model.config.tie_word_embeddings else 0)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench(shape: str, a, device: str) -> dict[str, float]:
    model = build(shape, device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150000, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    engine = HFEngine(model, eos_token_ids=[151643], pad_token_id=151643, bf16=True)
    params = SamplingParams(max_new_tokens=a.new_tokens)
    engine.generate(prompts[:2], 2, SamplingParams(max_new_tokens=8), g)  # warm-up
    sync(device)
    t = time.perf_counter()
    out = engine.generate(prompts, a.group, params, torch.Generator(device="cpu").manual_seed(1))
    sync(device)
    rollout_s = time.perf_counter() - t
    generated = sum(len(c.token_ids) for grp in out for c in grp)
    samples, index = [], []
    for i, (p, grp) in enumerate(zip(prompts, out)):
        for j, c in enumerate(grp):
            samples.append(Sample(p, c.token_ids, c.logprobs, reward=float(j % 2)))
            index.append(i)
    batch = collate(samples, index, pad_id=0)
    algo = Algorithm(AlgoConfig(), max_new_tokens=a.new_tokens)
    algo.prepare(batch)
    result = {"rollout_tok_s": generated / rollout_s}
    for share in (False, True):
        learner = Learner(model, TrainerConfig(bf16=True, micro_batch_tokens=a.micro_tokens, share_prompt=share),
                          bf16=True)
        learner.update(batch, algo)  # warm-up (allocator, kernels)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(device)
        t = time.perf_counter()
        learner.update(batch, algo)
        sync(device)
        train_s = time.perf_counter() - t
        tokens = int(batch.attention_mask.sum())  # tokens of the unpacked batch: the work being done
        key = "shared" if share else "separate"
        result[f"train_tok_s_{key}"] = tokens / train_s
        result[f"mfu_{key}"] = 6 * matmul_params(model) * tokens / train_s / (a.peak_tflops * 1e12)
        if device == "cuda":
            result[f"peak_gib_{key}"] = torch.cuda.max_memory_allocated() / 2**30
        del learner
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--micro-tokens", type=int, default=65536)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--shapes", default="0.5B,1.5B")
    ap.add_argument("--out")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    lines = [f"device: {name}; {a.prompts} prompts × {a.group} samples, prompt {a.prompt_len}, "
             f"up to {a.new_tokens} new tokens, bf16", "",
             "| model | rollout tok/s | train tok/s (separate) | train tok/s (shared prompt) | MFU separate | MFU shared |",
             "|---|---|---|---|---|---|"]
    for shape in a.shapes.split(","):
        r = bench(shape, a, device)
        lines.append(f"| {shape} | {r['rollout_tok_s']:.0f} | {r['train_tok_s_separate']:.0f} | "
                     f"{r['train_tok_s_shared']:.0f} | {r['mfu_separate']:.1%} | {r['mfu_shared']:.1%} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
