"""The memory model (`lmrl.models.memory`) against measured sizes, on random models this machine can run.

Usage: python benchmarks/memory_model.py [--tokens 512] [--shapes tiny,small,qwen2]

For each shape (random weights; `smollm2` is SmolLM2-135M's shape, opt-in) and with and without
gradient checkpointing, a fresh process runs two bare training steps in float32 (forward, the
learner's log-probabilities, backward, AdamW) on one micro-batch of `--tokens` tokens and measures:
parameters, gradients and AdamW state as the sizes of their tensors; activations as the bytes of
the tensors autograd saves during the forward pass (a saved-tensors hook, parameters excluded),
next to the model's kept figure; the KV cache as the size of the cache of one generation forward
over the same tokens; and the process's peak resident memory growth over the steps (VmHWM) against
the model's total. Prints a markdown table (docs/scaling.md, "What fits where").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

SHAPES = {  # hidden, layers, heads, kv_heads, vocab, intermediate, family
    "tiny": (256, 4, 4, 4, 2048, 1024, "llama"),
    "small": (512, 8, 8, 8, 8192, 1536, "llama"),
    "qwen2": (384, 6, 6, 2, 8192, 1024, "qwen2"),
    "smollm2": (576, 30, 9, 3, 49152, 1536, "llama_tied"),
}


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(ln for ln in status if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def build(name: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv_heads, vocab, intermediate, family = SHAPES[name]
    fields = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                  tie_word_embeddings=family == "llama_tied", attn_implementation="sdpa")
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**fields))
    return LlamaForCausalLM(LlamaConfig(**fields))


def saved_forward_bytes(model, ids):
    """Bytes of the tensors autograd saves in one forward pass and the log-probabilities (parameters excluded)."""
    import torch

    from lmrl.algos.logprobs import selected_logprobs

    storages: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logp, _ = selected_logprobs(model(ids, use_cache=False).logits[:, :-1], ids[:, 1:], False)
    return -logp.mean(), sum(storages.values())


def child(name: str, tokens: int, checkpointing: bool) -> dict:
    import torch

    from lmrl.models.memory import ModelShape, activation_elements, estimate_memory

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(name)
    sequences = 4
    ids = torch.randint(model.config.vocab_size, (sequences, tokens // sequences))
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    baseline = peak_rss_bytes()
    saved = 0
    for _ in range(2):
        loss, saved = saved_forward_bytes(model, ids)
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=False)
    peak = peak_rss_bytes() - baseline
    model.gradient_checkpointing_disable()
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        kv_bytes = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
        del cache
    shape = ModelShape.from_hf(model.config)
    est = estimate_memory(shape, micro_batch_tokens=ids.numel(), checkpointing=checkpointing, kv_tokens=ids.numel())
    kept, _, logits = activation_elements(shape, checkpointing)
    return {
        "shape": name, "params_n": shape.params, "checkpointing": checkpointing, "tokens": ids.numel(),
        "params": (sum(p.nbytes for p in model.parameters()), est.params),
        "grads": (sum(p.grad.nbytes for p in model.parameters()), est.grads),
        "optimiser": (sum(t.nbytes for s in optimiser.state.values() for k, t in s.items() if k != "step"),
                      est.optimiser),
        "activations_kept": (saved, ids.numel() * (kept * 4 + logits)),
        "activations_model": est.activations,
        "kv_cache": (kv_bytes, est.kv_cache),
        "peak_growth": peak, "model_total": est.total - est.kv_cache,
        "weights_at_start": baseline,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default="tiny,small,qwen2")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.tokens, a.checkpointing)))
        return
    mib = 2**20
    print("| shape | params | ckpt | params MiB (meas / model) | grads | AdamW | activations kept (meas / model) "
          "| model activations (peak) | KV cache | train-state peak RSS growth / model (weights excluded) |")
    print("|---|---:|---|---|---|---|---|---:|---|---|")
    for name in a.shapes.split(","):
        for checkpointing in (False, True):
            args = [sys.executable, __file__, "--child", name, "--tokens", str(a.tokens)]
            row = json.loads(subprocess.run(args + (["--checkpointing"] if checkpointing else []), check=True,
                                            capture_output=True, text=True).stdout.splitlines()[-1])

            def pair(key):
                measured, modelled = row[key]
                return f"{measured / mib:.2f} / {modelled / mib:.2f}"

            growth = row["peak_growth"] / mib
            state_without_weights = (row["model_total"] - row["params"][1]) / mib
            print(f"| {name} | {row['params_n'] / 1e6:.2f} M | {'yes' if checkpointing else 'no'} | {pair('params')} "
                  f"| {pair('grads')} | {pair('optimiser')} | {pair('activations_kept')} "
                  f"| {row['activations_model'] / mib:.2f} | {pair('kv_cache')} "
                  f"| {growth:.1f} / {state_without_weights:.1f} |", flush=True)


if __name__ == "__main__":
    main()
