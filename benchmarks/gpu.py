"""GPU benchmark for a lent accelerator: the real lmrl loop (`lmrl.loops.train`) on large shapes.

Random-initialised models of Qwen2-0.5B and Qwen2-1.5B shape (weights cannot travel to the device
machine) with a synthetic word-level tokenizer of Qwen2's vocabulary size, trained by the real loop
(sampler → hf engine → reward → GRPO → learner → checkpoint-free) for a few steps, in four variants:
full fine-tuning and LoRA, each with and without gradient checkpointing. Prompts are `--prompt-len`
random words; generation stops only at the length limit (random weights rarely emit EOS).

    python benchmarks/gpu.py --out docs/gpu_result.md     # about 6 minutes on one H200
    python benchmarks/gpu.py --shapes tiny --device cpu --steps 2   # a smoke run of the script itself
    python benchmarks/gpu.py --ranks 2 --variants full              # data-parallel learner, one GPU per rank (NCCL)
    python benchmarks/gpu.py --ranks 2 --sharding fsdp              # the sharded learner (FSDP2), one GPU per rank
    python benchmarks/gpu.py --servers 1 --server-devices cuda:0    # rollouts from an engine server, weights broadcast

With `--ranks N` the script starts itself under torchrun: N ranks, NCCL on CUDA (gloo on the CPU),
each generating and training its share of the global batch (docs/scaling.md); rank 0 reports, MFU
per device. NCCL needs one GPU per rank. `--sharding fsdp` shards the learner's weights, gradients and
optimiser over those ranks (`trainer.sharding`). `--servers N` generates on N engine servers in processes of
their own (`dist.servers`, `--server-devices` one device each; `--broadcast` the weight group's backend: gloo
when the servers share the learner's GPU, as NCCL needs a device per process), the learner broadcasting the
new weights after every update; the weight-sync column is that broadcast's time per step.

Reported per variant, from the loop's own metrics (the first step is warm-up and not counted):
rollout tokens/s (generated tokens / rollout time), training tokens/s (tokens of the update batch /
update time), MFU of the update (6·N·tokens per second over the device's dense bf16 peak,
`--peak-tflops`, default 989 for an H100/H200 SXM; N = matmul parameters: non-embedding plus the LM
head, the LoRA adapters' own FLOPs left out), and peak device memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from lmrl.loading import build_config
from lmrl.loops import build_stages, train
from lmrl.rewards import REWARD_FNS

SHAPES = {
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1),
    "0.5B": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "1.5B": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
}
VARIANTS = {  # name: (LoRA, gradient checkpointing)
    "full": (False, False), "full+gc": (False, True), "lora": (True, False), "lora+gc": (True, True)}


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer with one word per id (`w0` … `wN`), so any sampled id decodes."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")


def build_model(shape: str) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(max_position_embeddings=8192, tie_word_embeddings=shape != "1.5B", **SHAPES[shape])
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def matmul_params(model) -> int:
    embed = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    return total - embed + (head if model.config.tie_word_embeddings else 0)


def token_parity(sample, **_) -> float:
    """A reward with spread on random weights (so no group is inert and every row trains): id-sum parity."""
    return float(sum(sample.completion_ids) % 2)


def write_task(path: Path, vocab_size: int, prompt_len: int, rows: int) -> Path:
    g = torch.Generator().manual_seed(0)
    with path.open("w") as f:
        for _ in range(rows):
            words = torch.randint(2, vocab_size, (prompt_len,), generator=g).tolist()
            f.write(json.dumps({"question": " ".join(f"w{w}" for w in words), "answer": "w7"}) + "\n")
    return path


def run_variant(shape: str, variant: str, a, workdir: Path) -> dict[str, float]:
    lora, checkpointing = VARIANTS[variant]
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = word_tokenizer(SHAPES[shape]["vocab_size"])
    task = write_task(workdir / "task.jsonl", SHAPES[shape]["vocab_size"], a.prompt_len, 4 * a.prompts)
    tree = {
        "recipe": f"gpu-{shape}-{variant}",
        "task": {"name": "jsonl", "dataset": str(task), "system_prompt": None, "num_eval": 0,
                 "num_train": 4 * a.prompts, "max_prompt_tokens": a.prompt_len + 8},
        "reward": {"components": [{"name": "token_parity"}], "accuracy_component": "token_parity"},
        "rollout": {"prompts_per_step": a.prompts, "group_size": a.group, "max_new_tokens": a.new_tokens},
        "algo": {"preset": "grpo"},
        "trainer": {"steps": a.steps, "lr": 1e-5, "bf16": True, "device": a.device, "seed": 0,
                    "gradient_checkpointing": checkpointing, "micro_batch_tokens": a.micro_tokens},
        "eval": {"at_start": False, "at_end": False},
        "run": {"output_dir": str(workdir / "runs"), "name": variant, "progress": False, "checkpoint_every": 0},
    }
    if lora:
        tree["model"] = {"lora": {"r": 16, "alpha": 32}}
    if a.sharding != "none":
        tree["trainer"]["sharding"] = a.sharding
    if a.servers:
        tree["dist"] = {"backend": "local", "servers": True, "rollout_workers": a.servers, "broadcast": a.broadcast,
                        "server_devices": a.server_devices.split(",") if a.server_devices else []}
    cfg = build_config(tree)
    model = build_model(shape)
    stages = build_stages(cfg, model=model, tokenizer=tokenizer)
    n = matmul_params(model)
    cuda = stages.learner.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = train(cfg, stages=stages)
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 writes the run's logs; another rank may finish first
        return {}
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "timing/train_s" in r][1:]  # step 1 is warm-up
    batch_tokens = a.prompts * a.group * (a.prompt_len + sum(r["response_length/mean"] for r in timed) / len(timed))
    train_s = sum(r["timing/train_s"] for r in timed) / len(timed)
    generated = sum(r["tokens_per_s"] * r["timing/rollout_s"] for r in timed)
    out = {"rollout_tok_s": generated / sum(r["timing/rollout_s"] for r in timed),
           "train_tok_s": batch_tokens / train_s,
           "mfu": 6 * n * batch_tokens / train_s / (a.peak_tflops * 1e12 * a.ranks),
           "step_s": sum(r["timing/step_s"] for r in timed) / len(timed),
           "sync_s": sum(r.get("timing/weight_sync_s", 0.0) for r in timed) / len(timed),
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")}
    del stages, model
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> None:
    REWARD_FNS.register("token_parity", "benchmark reward: parity of the completion's id sum")(token_parity)
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-tokens", type=int, default=65536)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--shapes", default="0.5B,1.5B")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--ranks", type=int, default=1, help="data-parallel ranks (torchrun; one GPU each)")
    ap.add_argument("--sharding", default="none", choices=["none", "fsdp"], help="trainer.sharding")
    ap.add_argument("--servers", type=int, default=0, help="engine servers generating apart from the learner")
    ap.add_argument("--server-devices", default="", help="comma-separated, one per server (cuda:0,…); none: CPU")
    ap.add_argument("--broadcast", default="auto", choices=["auto", "gloo", "nccl"], help="dist.broadcast")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.ranks > 1 and "WORLD_SIZE" not in os.environ:
        if a.device != "cpu" and torch.cuda.is_available() and torch.cuda.device_count() < a.ranks:
            sys.exit(f"--ranks {a.ranks} needs {a.ranks} GPUs (NCCL: one per rank); {torch.cuda.device_count()} visible")
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.ranks}",
                  __file__, *sys.argv[1:]]
        sys.exit(subprocess.run(launch).returncode)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    name = torch.cuda.get_device_name() if torch.cuda.is_available() and a.device != "cpu" else "cpu"
    lines = [f"device: {name} × {a.ranks} rank(s); the real lmrl loop, GRPO, {a.prompts} prompts × {a.group} samples, prompt "
             f"{a.prompt_len} tokens, {a.new_tokens} new tokens, bf16 autocast over fp32 master weights, "
             f"{f'{a.servers} engine server(s), weights broadcast ({a.broadcast})' if a.servers else 'hf engine'}; "
             f"learner sharding {a.sharding}; mean of steps 2–{a.steps}", "",
             "| model | variant | rollout tok/s | train tok/s | update MFU | step s | weight sync s | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            for variant in a.variants.split(","):
                r = run_variant(shape, variant, a, Path(tmp) / f"{shape}-{variant}")
                if not main_rank:
                    continue
                lines.append(f"| {shape} | {variant} | {r['rollout_tok_s']:.0f} | {r['train_tok_s']:.0f} | "
                             f"{r['mfu']:.1%} | {r['step_s']:.1f} | {r['sync_s']:.2f} | {r['peak_gib']:.1f} |")
                print(lines[-1], flush=True)
    if not main_rank:
        return
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
