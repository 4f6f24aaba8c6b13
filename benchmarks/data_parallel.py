"""The data-parallel and sharded learners on the CPU: one update on 1 rank vs 2 ranks, replicas vs FSDP2.

Usage: python benchmarks/data_parallel.py [--groups 4] [--group-size 8] [--prompt 24] [--completion 48]
       [--hidden 256] [--layers 4] [--vocab 2048] [--repeats 3] [--updates 2] [--no-fsdp] [--lora R]

Part 1: `Learner.update` on a synthetic GRPO batch (mixed rewards, so no inert rows) of a random
Llama: 1 rank (the plain learner), 2 ranks of replicas (`DataParallel`, gloo) and 2 sharded ranks
(`Sharded`: FSDP2, `trainer.sharding: fsdp`), in turn, each repeat in fresh processes with one torch
thread per rank, after one untimed update. An update's time is the slowest rank's. Prints the
medians, the ratios, the time spent in the gradient all-reduce, and each rank's training state:
the bytes of its parameters, gradients and AdamW moments (a sharded rank's local shards), and the
weights a sharded rank gathers at once (the root unit and one decoder layer). `--lora R`: the model
carries LoRA adapters of rank R (alpha 2R, every linear layer), so only they have gradients and AdamW
state; the frozen base is sharded with them.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from machine import cpu_model, load_average
from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, LoraConfig, TrainerConfig
from torch.distributed.tensor import DTensor

from lmrl.dist import Sharded, spawn_local
from lmrl.learners import Learner
from lmrl.models import tiny_llama
from lmrl.models.lora import apply_lora
from lmrl.types import Sample, collate


def synthetic_batch(a):
    """Groups of random completions of one random prompt each; rewards alternate within a group."""
    g = torch.Generator().manual_seed(0)
    samples, groups = [], []
    for grp in range(a.groups):
        prompt = torch.randint(4, a.vocab, (a.prompt,), generator=g).tolist()
        for j in range(a.group_size):
            n = int(torch.randint(a.completion // 2, a.completion + 1, (1,), generator=g))
            completion = torch.randint(4, a.vocab, (n,), generator=g).tolist()
            samples.append(Sample(prompt, completion, (-1 - torch.rand(n, generator=g)).tolist(), reward=float(j % 2)))
            groups.append(grp)
    return collate(samples, groups, pad_id=0)


def model_of(a):
    model = tiny_llama(a.vocab, hidden=a.hidden, layers=a.layers, heads=4, seed=0)
    if not a.lora:
        return model
    torch.manual_seed(0)  # the same adapters on every rank
    return apply_lora(model, LoraConfig(r=a.lora, alpha=2 * a.lora))


def learner_update(parallel, a, strategy: str = "replicas") -> dict:
    """Seconds per `Learner.update` on this rank, of them the gradient all-reduce, and the training state."""
    batch = synthetic_batch(a)
    algo = Algorithm(AlgoConfig(), max_new_tokens=a.completion)
    algo.prepare(batch)
    cfg = TrainerConfig(lr=1e-5, bf16=False, micro_batch_tokens=a.micro_batch_tokens)
    if strategy == "sharded":
        parallel = Sharded()
    learner = Learner(model_of(a), cfg, parallel=parallel if parallel.world_size > 1 else None)
    spent = [0.0]
    reduce = parallel.reduce_gradients

    def timed_reduce(params):
        t = time.perf_counter()
        reduce(params)
        spent[0] += time.perf_counter() - t

    parallel.reduce_gradients = timed_reduce
    learner.update(batch, algo)  # warm-up
    times = []
    for _ in range(a.updates):
        parallel.barrier()
        spent[0] = 0.0
        t = time.perf_counter()
        learner.update(batch, algo)
        times.append(time.perf_counter() - t)
    return {"times": times, "allreduce_s": spent[0], **training_state(learner)}


def training_state(learner) -> dict:
    """MiB of this rank's parameters, gradients and AdamW moments (local shards), and of the whole weights a
    sharded rank holds at once during a pass (the root unit's and the largest decoder layer's)."""
    def local(x):
        return x.to_local() if isinstance(x, DTensor) else x

    def mib(tensors):
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    params = list(learner.model.parameters())
    state = {"params_mib": mib(local(p) for p in params),
             "grads_mib": mib(local(p.grad) for p in params if p.grad is not None),
             "adam_mib": mib(local(v) for p in params for v in learner.optimizer.state.get(p, {}).values() if v.dim())}
    parallel = learner.parallel
    if parallel.sharded:
        layers = [mib(p.full_tensor() for p in layer.parameters()) for layer in parallel.layers]
        in_layers = {id(p) for layer in parallel.layers for p in layer.parameters()}
        root = mib(p.full_tensor() for p in parallel.root.parameters() if id(p) not in in_layers)
        state["gathered_mib"] = root + max(layers)
    return state


def slowest(results: list[dict]) -> list[float]:
    """Per timed update, the slowest rank's time."""
    return [max(ts) for ts in zip(*(r["times"] for r in results))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=24)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=2, help="timed updates per repeat, after one warm-up")
    ap.add_argument("--no-fsdp", action="store_true", help="leave out the sharded learner")
    ap.add_argument("--lora", type=int, default=0, help="LoRA adapters of this rank (0: full fine-tuning)")
    a = ap.parse_args()
    batch = synthetic_batch(a)
    params = sum(p.numel() for p in model_of(a).parameters())
    print(f"CPU: {cpu_model()}; load average before: {load_average()}")
    trained = sum(p.numel() for p in model_of(a).parameters() if p.requires_grad)
    print(f"model: random Llama, {params / 1e6:.1f} M parameters ({trained / 1e6:.2f} M trained); batch: {batch.num_rows} rows in {a.groups} "
          f"groups, {int(batch.attention_mask.sum())} tokens ({int(batch.completion_mask.sum())} generated)")
    layouts = {"1 rank": (1, "replicas"), "2 replicas": (2, "replicas")}
    if not a.no_fsdp:
        layouts["2 sharded"] = (2, "sharded")
    times: dict[str, list[float]] = {name: [] for name in layouts}
    state, reduce_s = {}, []
    for _ in range(a.repeats):
        for name, (ranks, strategy) in layouts.items():
            results = spawn_local(learner_update, ranks, a, strategy)
            times[name] += slowest(results)
            state[name] = results[0]
            if name == "2 replicas":
                reduce_s.append(max(r["allreduce_s"] for r in results) / a.updates)
        print("  " + ", ".join(f"{name} {ts[-1]:.2f} s" for name, ts in times.items()), flush=True)
    base = statistics.median(times["1 rank"])
    print(f"\nLearner.update, median (gradient all-reduce of the replicas: {statistics.median(reduce_s):.3f} s "
          "per update); per rank, MiB:")
    print(f"  {'':12s} {'update s':>9s} {'/ 1 rank':>9s} {'params':>8s} {'grads':>8s} {'AdamW':>8s} {'state':>8s} "
          f"{'/ 1 rank':>9s} {'gathered':>9s}")
    whole = sum(state["1 rank"][k] for k in ("params_mib", "grads_mib", "adam_mib"))
    for name, ts in times.items():
        r = state[name]
        total = r["params_mib"] + r["grads_mib"] + r["adam_mib"]
        gathered = f"{r['gathered_mib']:9.2f}" if "gathered_mib" in r else f"{'':9s}"
        print(f"  {name:12s} {statistics.median(ts):9.2f} {statistics.median(ts) / base:9.2f} {r['params_mib']:8.2f} "
              f"{r['grads_mib']:8.2f} {r['adam_mib']:8.2f} {total:8.2f} {total / whole:9.2f} {gathered}")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
