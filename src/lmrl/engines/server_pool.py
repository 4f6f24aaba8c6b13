"""Rollouts on engine servers in their own processes (or Ray actors), weights broadcast to them (`dist.servers`).

`ServerPool` is an engine like the others, so the loop, the asynchronous loop and multi-turn
environments use it unchanged. `generate` splits the prompts into one contiguous chunk per server
and samples each chunk from a seed drawn from the run's generator, as the rollout worker pool does
(`engines.workers`): with `hf` servers a run gives the worker pool's tokens. `update_weights`
broadcasts the version through the learner's weight group (`engines.broadcast`); each server loads
it and tags its completions with the version it generated with, its own, so the staleness bound and
the off-policy corrections read what the server really used.

A server that dies (its process killed, its actor lost) is started again from its spec; once the
other servers have finished their chunks it is given the current version by a server that holds it
(`engines.holders`: the same node first; a group of the holder and the servers it serves, the holder
the source rank; the learner sends nothing), by the learner's broadcast to every server only when no
live server holds it; the weight group is formed again and the dead server's chunk re-run with the
same seed: the same tokens, and the run goes on (up to `max_restarts` restarts). docs/scaling.md,
"Engine servers and weight broadcast".
"""
from __future__ import annotations

import sys
import time

import torch

from lmrl.engines.broadcast import Broadcaster, ChangeTracker, plan_weights
from lmrl.engines.holders import Holders, Recovery, choose_holder
from lmrl.engines.server import EngineHost, ProcessServer, RayServer, ServerDied, ServerFailed, ServerSpec
from lmrl.engines.workers import _placement, chunk_jobs, ray_session, say_restart
from lmrl.models.weights import inference_weights, is_peft


def spec_for(model, engine: str, eos_token_ids: list[int], pad_token_id: int, bf16: bool, *, device: str = "cpu",
             threads: int = 1, options: dict | None = None) -> ServerSpec:
    """The spec of a server hosting `engine` over a model shaped like the policy `model` (its base, for LoRA)."""
    base = model.get_base_model() if is_peft(model) else model
    return ServerSpec(engine, type(base), base.config, next(base.parameters()).dtype, list(eos_token_ids),
                      pad_token_id, bf16, device, threads, dict(options or {}))


class ServerPool:
    """The `Engine` protocol over engine servers: processes started here (`local`) or Ray actors (`ray`)."""

    shares_module = False  # each server holds its own weights, loaded from the broadcast

    def __init__(self, model, spec: ServerSpec, *, servers: int = 2, backend: str = "local", max_restarts: int = 3,
                 broadcast: str = "auto", devices: list[str] | None = None, only_changed: bool = False,
                 bucket_mb: float = 1.0, timeout_s: float = 300.0, peer_serving: bool = True,
                 peer_timeout_s: float = 60.0):
        if backend not in ("local", "ray"):
            raise ValueError(f"dist.backend must be local or ray for engine servers, got {backend!r}")
        self.model, self.spec, self.backend, self.max_restarts = model, spec, backend, max_restarts
        self.pad_token_id = spec.pad_token_id
        self.devices = list(devices or [])
        if self.devices and len(self.devices) != servers:
            raise ValueError(f"dist.server_devices names {len(self.devices)} devices for {servers} servers")
        self.version, self.restarts, self.weights = 0, 0, None
        self.bucket_mb, self.only_changed = bucket_mb, only_changed
        self.tracker, self.tracked_version = ChangeTracker(), None  # the version the tracker last recorded
        self.holders, self.last_recovery = Holders(), Recovery()
        self.peer_serving, self.peer_timeout_s = peer_serving, peer_timeout_s  # False: the learner re-sends to all
        learner_device = next(model.parameters()).device
        backend_name = resolve_broadcast(broadcast, learner_device, self.devices)
        host = "127.0.0.1"
        if backend == "ray":
            self.ray = ray_session()
            host = self.ray.util.get_node_ip_address()
            gpus = 1 if any(d.startswith("cuda") for d in self.devices) else 0
            self.actor_class = self.ray.remote(num_cpus=spec.threads, num_gpus=gpus, max_restarts=0)(EngineHost)
            self.placement = None if gpus else _placement(self.ray, servers, spec.threads)
        self.broadcaster = Broadcaster(backend_name, learner_device if backend_name == "nccl" else torch.device("cpu"),
                                       host, timeout_s)
        self.timeout_s = timeout_s
        self.last_sync, self.last_send_s = [0.0, 0], 0.0  # seconds and bytes of the last broadcast
        self.servers = [self._start(i) for i in range(servers)]
        died = self._ready(range(servers))
        if died:
            self.close()
            raise ServerDied(f"engine servers {died} did not start")
        self._recover([])  # the group, and the learner's weights as version 0

    def _start(self, index: int):
        spec = self.spec
        if self.devices:
            spec = ServerSpec(**{**spec.__dict__, "device": self.devices[index]})
        if self.backend == "ray":  # Ray gives an actor its GPU, seen as the only one
            if spec.device.startswith("cuda"):
                spec = ServerSpec(**{**spec.__dict__, "device": "cuda"})
            strategy = None
            if self.placement is not None:
                group, first, _ = self.placement
                strategy = self.ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=first + index)
            return RayServer(self.ray, self.actor_class, spec, strategy)
        environment = {}
        if spec.device.startswith("cuda"):  # the server sees its own GPU only, as cuda:0
            environment["CUDA_VISIBLE_DEVICES"] = spec.device.partition(":")[2] or "0"
            spec = ServerSpec(**{**spec.__dict__, "device": "cuda:0"})
        return ProcessServer(spec, index, environment)

    @property
    def server_pids(self) -> list[int | None]:
        return [s.pid for s in self.servers]

    def update_weights(self, named_tensors: dict[str, torch.Tensor] | None, version: int) -> dict[str, float]:
        """Broadcast `named_tensors` (None: the learner's module now; a dict: every weight) as `version`."""
        self.weights, self.version = named_tensors, version
        died, *self.last_sync = self._sync()
        if died:
            self._recover(died)
        seconds, nbytes = self.last_sync
        return {"timing/weight_sync_s": seconds, "weight_sync/mb": nbytes / 2**20}

    def generate(self, prompts, n, params, generator: torch.Generator | None = None):
        if not prompts:
            return []
        jobs = chunk_jobs(prompts, n, params, generator, len(self.servers))
        results = {}
        while jobs:
            died = self._collect(jobs, "generate", lambda i: jobs[i], results)
            jobs = {i: jobs[i] for i in died}
            if died:
                self._recover(died)
        return [group for i in sorted(results) for group in results[i]]

    def server_versions(self) -> list[int]:
        """The version each server holds, as it reports it."""
        out = {}
        died = self._collect(range(len(self.servers)), "version", lambda i: (), out)
        if died:
            raise ServerDied(f"engine servers {died} are gone")
        return [out[i] for i in sorted(out)]

    def _collect(self, indices, method: str | None = None, args=lambda i: (), results: dict | None = None) -> list[int]:
        """Run `method` on the servers `indices` (None: take a pending reply); the indices of those that died."""
        died, failure = [], None
        for i in indices:
            if method is not None:
                try:
                    self.servers[i].submit(method, *args(i))
                except ServerDied:
                    died.append(i)
        for i in indices:
            if i in died:
                continue
            try:
                value = self.servers[i].result()
                if results is not None:
                    results[i] = value
            except ServerDied:
                died.append(i)
            except ServerFailed as err:
                failure = failure or err
        if failure is not None and not died:  # a command failing beside a death is the death's doing
            raise failure
        return sorted(died)

    def _ready(self, indices) -> list[int]:
        """Take the "ready" of started servers (each placed on its node, holding nothing); those that died."""
        nodes = {}
        died = self._collect(indices, results=nodes)
        for i, node in nodes.items():
            self.holders.place(i, node)
        return died

    def _restart(self, died: list[int]) -> None:
        if self.restarts + len(died) > self.max_restarts:
            raise ServerDied(f"engine servers {died} died after {self.restarts} restarts "
                             f"(dist.max_restarts={self.max_restarts})")
        self.restarts += len(died)
        for i in died:
            say_restart("engine server", i, f"exit code {self.servers[i].process.exitcode}"
                        if hasattr(self.servers[i], "process") else "its actor is gone",
                        self.restarts, self.max_restarts)
            self.holders.drop(i)
            self.servers[i].kill()
            self.servers[i] = self._start(i)

    def _recover(self, died: list[int]) -> None:
        """Restart the servers in `died`, give every server that lacks the current version the version (from
        a server holding it; from the learner, to every server, when none can) and form the weight group
        again, until every server holds it. `last_recovery` says who served whom."""
        recovery, failed, restarted = Recovery(self.version), set(), set(died)
        while True:
            if died:
                self._restart(died)
                died = self._ready(died)
                if died:
                    continue
            start = time.perf_counter()
            died = self._serve_from_holders(recovery, failed) if self.peer_serving else []
            if not died:
                died = self._form()
            lacking = self.holders.lacking(self.version)
            if not died and lacking:
                self.tracker.forget()  # a server holds nothing of it: the whole version, to every server
                died, *self.last_sync = self._sync()
                recovery.learner_bytes += self.last_sync[1]
                if not died:
                    recovery.served_by.update({i: None for i in lacking})
            recovery.transfer_s += time.perf_counter() - start
            restarted.update(died)
            if not died:
                self.last_recovery = recovery
                if restarted:
                    say_served(recovery, sorted(restarted))
                return

    def _serve_from_holders(self, recovery: Recovery, failed: set[int]) -> list[int]:
        """Servers lacking the current version get it from servers holding it (`choose_holder`), no byte from
        the learner; a holder that fails to serve is left out and the next one chosen. Those still lacking
        when no holder is left wait for the learner's broadcast. The indices of the servers that died."""
        while True:
            readers: dict[int, list[int]] = {}
            for reader in self.holders.lacking(self.version):
                holder = choose_holder(self.holders.of(self.version), self.holders.node_of(reader), failed)
                if holder is None:
                    return []
                readers.setdefault(holder, []).append(reader)
            if not readers:
                return []
            died = self._peer_send(readers, recovery, failed)
            if died:
                return died

    def _peer_send(self, readers: dict[int, list[int]], recovery: Recovery, failed: set[int]) -> list[int]:
        """One group per holder (rank 0) and its readers (ranks 1…), on the learner's store, the holder's
        version sent in one broadcast; the groups run at the same time. The indices of those that died."""
        held = self._ask({holder: [("holding", self.bucket_mb)] for holder in readers})
        died = {i for i, (outcome, _) in held.items() if outcome == "died"}
        failed.update(i for i, (outcome, _) in held.items() if outcome == "failed")
        if died:
            return sorted(died)
        address, backend, timeout = self.broadcaster.address, self.broadcaster.backend, self.peer_timeout_s
        groups, commands = {h: g for h, g in readers.items() if h not in failed}, {}
        for holder, group in groups.items():
            generation, world, plan = self.broadcaster.next_generation(), len(group) + 1, held[holder][1][0]
            for rank, reader in enumerate(group, 1):
                commands[reader] = [("join", address, rank, world, generation, backend, timeout), ("load", plan)]
            commands[holder] = [("serve_version", address, world, generation, backend, timeout, self.bucket_mb)]
        outcomes = self._ask(commands)
        for holder, group in groups.items():
            members = {i: outcomes[i][0] for i in [holder, *group]}
            died.update(i for i, outcome in members.items() if outcome == "died")
            if "failed" in members.values() and "died" not in members.values():
                failed.add(holder)  # it failed to serve with every member alive: the next holder serves
            for reader in group:
                if members[reader] == "ok":
                    self.holders.publish(reader, self.version)
                    recovery.served_by[reader] = holder
                    recovery.peer_bytes += held[holder][1][0].nbytes
        return sorted(died)

    def _ask(self, commands: dict[int, list[tuple]]) -> dict[int, tuple[str, list]]:
        """Send each server its commands ((method, *args) each), all before taking any reply, so the servers
        run them at the same time; then per server ("ok" | "failed" | "died", the values replied)."""
        alive = {}
        for i, queue in commands.items():
            try:
                for method, *args in queue:
                    self.servers[i].submit(method, *args)
                alive[i] = True
            except ServerDied:
                alive[i] = False
        out = {}
        for i, queue in commands.items():
            outcome, values = "ok" if alive[i] else "died", []
            for _ in queue if alive[i] else ():
                try:
                    values.append(self.servers[i].result())
                except ServerDied:
                    outcome = "died"
                    break
                except ServerFailed:
                    outcome = "failed"
            out[i] = (outcome, values)
        return out

    def _form(self) -> list[int]:
        """A new generation of the weight group with every server; the indices of those that died."""
        generation = self.broadcaster.next_generation()
        world, address = len(self.servers) + 1, self.broadcaster.address
        backend = self.broadcaster.backend
        died = []
        for i, server in enumerate(self.servers):
            try:
                server.submit("join", address, i + 1, world, generation, backend, self.timeout_s)
            except ServerDied:
                died.append(i)
        if not died:
            try:
                self.broadcaster.form(world)
            except RuntimeError:
                pass  # a server gone during the rendezvous: its reply says which
        return sorted(set(died) | set(self._collect([i for i in range(len(self.servers)) if i not in died])))

    def _sync(self) -> tuple[list[int], float, int]:
        """Broadcast the current version to every server: (the servers that died, seconds, bytes sent)."""
        start = time.perf_counter()
        weights = list(self.weights.items()) if self.weights is not None else list(inference_weights(self.model))
        skip = self.tracker.unchanged(weights) if self.only_changed else set()
        plan, tensors = plan_weights(weights, self.version, self.bucket_mb, skip)
        died = []
        for i, server in enumerate(self.servers):
            try:
                server.submit("load", plan)
            except ServerDied:
                died.append(i)
        if not died:
            sending = time.perf_counter()
            try:
                self.broadcaster.send(plan, tensors)
            except RuntimeError:
                pass  # a server gone mid-broadcast: its reply says which
            self.last_send_s = time.perf_counter() - sending  # the collectives alone, without the servers' loads
        loaded = {}
        died = sorted(set(died) | set(self._collect([i for i in range(len(self.servers)) if i not in died],
                                                    results=loaded)))
        for i in loaded:  # a partial version on top of a whole one since the tracker's record is whole
            held = self.holders.version_of(i)
            if not skip or (held is not None and held >= self.tracked_version):
                self.holders.publish(i, self.version)
        if not died:
            self.tracker.record(weights)
            self.tracked_version = self.version
        return died, time.perf_counter() - start, plan.nbytes

    def close(self) -> None:
        """Stop every server (they stop together: each is asked first, then waited for)."""
        for server in self.servers:
            server.ask_to_close()
        for server in self.servers:
            server.close()
        self.servers = []
        if self.backend == "ray" and self.placement is not None and self.placement[2]:
            self.ray.util.remove_placement_group(self.placement[0])
            self.placement = None


def say_served(recovery: Recovery, restarted: list[int]) -> None:
    """Show, when it happens, how the servers started again got the current version, and from whom."""
    sources = ", ".join(f"{i} from engine server {h}" if h is not None else f"{i} from the learner"
                        for i, h in sorted(recovery.served_by.items()))
    print(f"engine servers {restarted} started again hold version {recovery.version} ({sources}; the learner "
          f"sent {recovery.learner_bytes / 2**20:.1f} MB)", file=sys.stderr, flush=True)


def resolve_broadcast(name: str, learner_device: torch.device, devices: list[str]) -> str:
    """`dist.broadcast`: gloo or nccl; auto is nccl when the learner and every server are on GPUs."""
    if name != "auto":
        return name
    on_gpus = learner_device.type == "cuda" and devices and all(d.startswith("cuda") for d in devices)
    return "nccl" if on_gpus else "gloo"

