"""Weight transports side by side: seconds per MB to send one version and open it on the other side.

    python benchmarks/weight_transport.py [--model default|mid|tiny] [--repeats 5] [--servers 1,2] [--transports …]
                                        [--recovery 2]

For each registered transport (`lmrl.engines.weight_sync`: in_process, shared_file, ray when Ray is
installed) it sends the policy's inference weights (SmolLM2-135M: 513 MB in fp32) and receives them,
`--repeats` times, and prints the median send, receive and total time, and the total per MB. The
`ray` receive is timed in this process (Ray's object store, same node); an actor on another machine
pays the network on top. A worker's own load into its model (`load_state_dict`) is not included.

Then the broadcast to engine servers (`engines.server_pool`, gloo), once per count in `--servers`:
`hf` servers in their own processes, and `update_weights` timed at the learner. "send" is the
collectives alone (the learner blocked in them while the servers receive); "receive" is the rest,
until every server has unpacked the buckets and loaded them into its model, which is included here.
`--model mid` is a random Llama of 128 MB (no download).

Then a server's recovery, side by side (`--recovery N` servers, `--repeats` kills each): the last
server is SIGKILLed, the next `generate` restarts it, and the restarted server gets the current
version either from another server (`peer`: a group of the holder and the new server, the learner
sends nothing; `engines.holders`) or from the learner's broadcast to every server (`re-broadcast`,
`peer_serving=False`). "learner blocked s" is the learner's time from the restarted server's
start-up until every server holds the version (`Recovery.transfer_s`: the transfer, the servers'
loads and the weight group formed again; the process start-up, the same in both, left out).
"""
from __future__ import annotations

import argparse
import statistics
import time

from machine import cpu_model, load_average

MODELS = {"tiny": (1000, dict(hidden=64, layers=2, heads=4)), "mid": (8192, dict(hidden=512, layers=6, heads=8))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default",
                    help="`default` (SmolLM2), `mid` (a random Llama of ~100 MB) or `tiny` (a 2-layer random Llama)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--servers", default="1,2", help="engine-server counts to broadcast to (empty: none)")
    ap.add_argument("--transports", help="the transports to time, comma-separated (default: every one; empty: none)")
    ap.add_argument("--recovery", type=int, default=2, help="servers in the recovery comparison (0: none)")
    args = ap.parse_args()

    from lmrl.engines.weight_sync import WEIGHT_TRANSPORTS
    from lmrl.models import load_model, resolve_model_path, tiny_llama
    from lmrl.models.weights import inference_weights

    if args.model in MODELS:
        model = tiny_llama(MODELS[args.model][0], **MODELS[args.model][1], seed=0)
    else:
        model = load_model(resolve_model_path(args.model))
    names = [n for n in WEIGHT_TRANSPORTS.names() if n != "ray" or _has_ray()]
    if args.transports is not None:
        names = [n for n in args.transports.split(",") if n]
    print(f"CPU: {cpu_model()}; load average {load_average()}")
    print(f"{'transport':<12} {'MB':>7} {'send s':>8} {'receive s':>10} {'total s':>8} {'ms/MB':>7}")
    for name in names:
        transport = WEIGHT_TRANSPORTS.get(name)()
        sends, receives, size = [], [], 0
        for version in range(args.repeats):
            t0 = time.perf_counter()
            parcel = transport.send(inference_weights(model), version)
            t1 = time.perf_counter()
            received = transport.receive(parcel)
            t2 = time.perf_counter()
            assert len(received) > 0
            size = parcel.nbytes / 2**20
            sends.append(t1 - t0)
            receives.append(t2 - t1)
            transport.release(parcel)
        send, receive = statistics.median(sends), statistics.median(receives)
        print(f"{name:<12} {size:7.1f} {send:8.3f} {receive:10.3f} {send + receive:8.3f} "
              f"{1000 * (send + receive) / size:7.2f}")
    for servers in [int(n) for n in args.servers.split(",") if n]:
        send, total, size = broadcast(model, servers, args.repeats)
        print(f"{f'broadcast×{servers}':<12} {size:7.1f} {send:8.3f} {total - send:10.3f} {total:8.3f} "
              f"{1000 * total / size:7.2f}")
    if args.recovery:
        rows = {mode: recovery(model, args.recovery, args.repeats, peer=mode == "peer")
                for mode in ("peer", "re-broadcast")}
        base = rows["re-broadcast"][0]
        print(f"\nrecovery of 1 of {args.recovery} servers, median of {args.repeats}")
        print("| version from | learner blocked s | learner sent MB | server to server MB | blocked vs re-broadcast |")
        print("|---|---:|---:|---:|---:|")
        for mode, (blocked, learner_mb, peer_mb) in rows.items():
            print(f"| {mode} | {blocked:.3f} | {learner_mb:.1f} | {peer_mb:.1f} | {blocked / base:.2f}× |")


def broadcast(model, servers: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds of the collectives and of the whole `update_weights` to `servers` hf servers; MB sent."""
    from lmrl.engines.server_pool import ServerPool, spec_for

    pool = ServerPool(model, spec_for(model, "hf", [0], 0, False), servers=servers)
    sends, totals, size = [], [], 0.0
    try:
        for version in range(1, repeats + 1):
            metrics = pool.update_weights(None, version)
            sends.append(pool.last_send_s)
            totals.append(metrics["timing/weight_sync_s"])
            size = metrics["weight_sync/mb"]
    finally:
        pool.close()
    return statistics.median(sends), statistics.median(totals), size


def recovery(model, servers: int, repeats: int, peer: bool) -> tuple[float, float, float]:
    """Median learner-blocked seconds of a restarted server's recovery; MB the learner and the servers sent."""
    import os
    import signal

    from lmrl.engines import SamplingParams
    from lmrl.engines.server_pool import ServerPool, spec_for

    pool = ServerPool(model, spec_for(model, "hf", [0], 0, False), servers=servers, max_restarts=repeats,
                      peer_serving=peer)
    prompts, params = [[1, 2, 3]] * servers, SamplingParams(max_new_tokens=1, greedy=True)
    blocked, learner, peers = [], 0.0, 0.0
    try:
        pool.update_weights(None, 1)
        for _ in range(repeats):
            os.kill(pool.servers[-1].pid, signal.SIGKILL)
            pool.servers[-1].process.join()
            pool.generate(prompts, 1, params)  # finds it dead: restarts it and gives it the version
            blocked.append(pool.last_recovery.transfer_s)
            learner, peers = pool.last_recovery.learner_bytes / 2**20, pool.last_recovery.peer_bytes / 2**20
    finally:
        pool.close()
    return statistics.median(blocked), learner, peers


def _has_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
