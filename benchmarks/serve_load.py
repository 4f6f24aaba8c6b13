"""`lmrl serve` under concurrent load: the batched queue against one request per generate call.

    python benchmarks/serve_load.py --model default --clients 8 --max-tokens 32 --threads 1

Starts two servers in this process on loopback ports: one with `max_batch_rows=1` (one request per
engine call, what a single generation lock gives) and one with the default batching. In alternating
bursts, `--clients` threads send one greedy chat request each at the same moment (different
prompts); the wall time of each burst and each request's latency are recorded. Then one prompt
longer than the model's context is sent and the time to its HTTP 400 is recorded. Prints a
markdown table of the medians.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import requests
import torch

from machine import cpu_model

PROMPTS = ["What is {a} + {b}? Answer with the number.", "Name a colour that has {a} letters.",
           "Write a one-line poem about the number {b}.", "Is {a} larger than {b}? Answer yes or no."]


def burst(port: int, clients: int, max_tokens: int) -> tuple[float, list[float]]:
    """Wall time of `clients` simultaneous requests, and each one's latency."""
    latencies: list[float] = [0.0] * clients
    start = threading.Barrier(clients + 1)

    def one(i: int) -> None:
        text = PROMPTS[i % len(PROMPTS)].format(a=i + 3, b=2 * i + 1)
        start.wait()
        began = time.perf_counter()
        reply = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600,
                              json={"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                                    "temperature": 0})
        reply.raise_for_status()
        latencies[i] = time.perf_counter() - began

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - began, latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="bursts per mode, alternating; the table shows medians")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from lmrl.serve import build_server, load_served_model

    model, tokenizer, _ = load_served_model(args.model)
    modes = {"one request per call": 1, "batched queue": 32}
    servers = {mode: build_server(model, tokenizer, port=0, max_batch_rows=rows) for mode, rows in modes.items()}
    for srv in servers.values():
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        burst(srv.server_address[1], 2, 4)  # warm-up
    runs: dict[str, list] = {mode: [] for mode in modes}
    for _ in range(args.repeats):  # alternating, so that other load on the machine falls on both modes
        for mode, srv in servers.items():
            calls = srv.service.queue.stats["engine_calls"]
            wall, latencies = burst(srv.server_address[1], args.clients, args.max_tokens)
            runs[mode].append((wall, statistics.median(latencies), max(latencies),
                               srv.service.queue.stats["engine_calls"] - calls))
    srv = servers["batched queue"]
    context = srv.service.context_length
    began = time.perf_counter()
    refused = requests.post(f"http://127.0.0.1:{srv.server_address[1]}/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": "word " * (context + 1000)}], "max_tokens": 16})
    refusal = (refused.status_code, time.perf_counter() - began)
    for srv in servers.values():
        srv.shutdown()
        srv.server_close()
    print(f"{args.model}, {args.clients} simultaneous greedy requests of up to {args.max_tokens} tokens, "
          f"{args.threads} thread(s), {cpu_model()}, medians of {args.repeats} alternating bursts\n")
    print("| mode | burst wall time | median latency | slowest request | engine calls per burst |")
    print("|---|---:|---:|---:|---:|")
    for mode, rows in runs.items():
        wall, median, slowest, calls = (statistics.median(r[i] for r in rows) for i in range(4))
        print(f"| {mode} | {wall:.2f} s | {median:.2f} s | {slowest:.2f} s | {calls:g} |")
    print(f"\nA prompt of {context + 1000} words (context {context} tokens): HTTP {refusal[0]} in "
          f"{refusal[1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
