"""The sharded learner on the CPU: one update on 1 rank vs 2 ranks, and the all-reduce vs FSDP2.

Usage: python benchmarks/data_parallel.py [--groups 4] [--group-size 8] [--prompt 24] [--completion 48]
       [--hidden 256] [--layers 4] [--vocab 2048] [--repeats 3] [--updates 2] [--no-fsdp]

Part 1: `Learner.update` on a synthetic GRPO batch (mixed rewards, so no inert rows) of a random
Llama: 1 rank (the plain learner) and 2 ranks (`DataParallel`, gloo), alternating, each repeat in
fresh processes with one torch thread per rank, after one untimed update. An update's time is the
slowest rank's. Prints the medians, the ratio and the time spent in the gradient all-reduce.
Part 2: a bare training step (forward, backward, clip, AdamW) on each rank's half of the rows, in
the same micro-batches, with the learner's all-reduce or with FSDP2 `fully_shard`: time, training
state (weights, gradients, AdamW moments) per rank, and the largest weight difference between them.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from machine import cpu_model, load_average
from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.dist import assign_groups, spawn_local
from lmrl.learners import Learner
from lmrl.models import tiny_llama
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
    return tiny_llama(a.vocab, hidden=a.hidden, layers=a.layers, heads=4, seed=0)


def learner_update(parallel, a) -> dict:
    """Seconds per `Learner.update` on this rank, and of them the gradient all-reduce."""
    batch = synthetic_batch(a)
    algo = Algorithm(AlgoConfig(), max_new_tokens=a.completion)
    algo.prepare(batch)
    cfg = TrainerConfig(lr=1e-5, bf16=False, micro_batch_tokens=a.micro_batch_tokens)
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
    return {"times": times, "allreduce_s": spent[0]}


def bare_step(parallel, a, strategy: str) -> dict:
    """Time of a plain training step on this rank's rows with `strategy` ("allreduce" or "fsdp")."""
    batch = synthetic_batch(a)
    ranks = assign_groups(batch.group_index.tolist(), batch.attention_mask.sum(1).tolist(), parallel.world_size)
    rows = [r for r, k in enumerate(ranks) if k == parallel.rank]
    micro = [rows[i:: a.micro_batches] for i in range(a.micro_batches)]
    tokens = float(batch.completion_mask.sum())  # the global denominator of a token-mean loss
    if strategy == "fsdp":  # FSDP averages over ranks (a sum needs PREMUL_SUM, which gloo lacks): undo it
        tokens /= parallel.world_size
    model = model_of(a)
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (parallel.world_size,))
        for unit in [*model.model.layers, model.model, model.lm_head]:  # the learner calls decoder and head
            fully_shard(unit, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step():
        optimizer.zero_grad(set_to_none=False)
        for m in micro:
            ids, attn = batch.input_ids[m], batch.attention_mask[m]
            hidden = model.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
            logits = model.get_output_embeddings()(hidden[:, :-1]).float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            ((nll * batch.completion_mask[m]).sum() / tokens).backward()
        if strategy == "allreduce":
            parallel.reduce_gradients(model.parameters())
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        optimizer.step()

    step()  # warm-up (and AdamW's state)
    times = []
    for _ in range(a.updates):
        parallel.barrier()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    local = [getattr(x, "_local_tensor", x) for p in model.parameters()
             for x in (p, p.grad, *optimizer.state[p].values()) if x is not None and x.dim() > 0]
    weights = [p.detach().full_tensor() if strategy == "fsdp" else p.detach().clone() for p in model.parameters()]
    return {"times": times, "state_mib": sum(x.numel() * x.element_size() for x in local) / 2**20, "weights": weights}


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
    ap.add_argument("--micro-batches", type=int, default=2, help="per rank, in part 2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=2, help="timed updates per repeat, after one warm-up")
    ap.add_argument("--no-fsdp", action="store_true")
    a = ap.parse_args()
    batch = synthetic_batch(a)
    params = sum(p.numel() for p in model_of(a).parameters())
    print(f"CPU: {cpu_model()}; load average before: {load_average()}")
    print(f"model: random Llama, {params / 1e6:.1f} M parameters; batch: {batch.num_rows} rows in {a.groups} "
          f"groups, {int(batch.attention_mask.sum())} tokens ({int(batch.completion_mask.sum())} generated)")
    one, two, reduce_s = [], [], []
    for _ in range(a.repeats):
        one += slowest(spawn_local(learner_update, 1, a))
        results = spawn_local(learner_update, 2, a)
        two += slowest(results)
        reduce_s.append(max(r["allreduce_s"] for r in results) / a.updates)
        print(f"  1 rank {one[-1]:.2f} s, 2 ranks {two[-1]:.2f} s", flush=True)
    t1, t2 = statistics.median(one), statistics.median(two)
    print(f"\nLearner.update, median: 1 rank {t1:.2f} s, 2 ranks {t2:.2f} s; 2 ranks / 1 rank = {t2 / t1:.2f} "
          f"(speed-up {t1 / t2:.2f}x); gradient all-reduce {statistics.median(reduce_s):.3f} s per update")
    if a.no_fsdp:
        return
    runs: dict[str, list[float]] = {"allreduce": [], "fsdp": []}
    state, weights = {}, {}
    for _ in range(a.repeats):
        for strategy in runs:
            results = spawn_local(bare_step, 2, a, strategy)
            runs[strategy] += slowest(results)
            state[strategy], weights[strategy] = results[0]["state_mib"], results[0]["weights"]
    diff = max(float((x - y).abs().max()) for x, y in zip(weights["allreduce"], weights["fsdp"]))
    print("\nbare step on 2 ranks, median (training state per rank):")
    for strategy, times in runs.items():
        print(f"  {strategy:9s} {statistics.median(times):.2f} s ({state[strategy]:.1f} MiB)")
    ratio = statistics.median(runs["fsdp"]) / statistics.median(runs["allreduce"])
    print(f"  fsdp / allreduce = {ratio:.2f}; largest weight difference {diff:.1e}")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
