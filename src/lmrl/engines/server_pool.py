"""Rollouts on engine servers in their own processes (or Ray actors), weights broadcast to them (`dist.servers`).

`ServerPool` is an engine like the others, so the loop, the asynchronous loop and multi-turn
environments use it unchanged. `generate` splits the prompts into one contiguous chunk per server
and samples each chunk from a seed drawn from the run's generator, as the rollout worker pool does
(`engines.workers`): with `hf` servers a run gives the worker pool's tokens. `update_weights`
broadcasts the version through the learner's weight group (`engines.broadcast`); each server loads
it and tags its completions with the version it generated with, its own, so the staleness bound and
the off-policy corrections read what the server really used.

A server that dies (its process killed, its actor lost) is started again from its spec; once the
other servers have finished their chunks the group is formed again, the current version broadcast,
and the dead server's chunk re-run with the same seed: the same tokens, and the run goes on (up to
`max_restarts` restarts). docs/scaling.md, "Engine servers and weight broadcast".
"""
from __future__ import annotations

import time

import torch

from lmrl.engines.broadcast import Broadcaster, ChangeTracker, plan_weights
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
                 bucket_mb: float = 1.0, timeout_s: float = 300.0):
        if backend not in ("local", "ray"):
            raise ValueError(f"dist.backend must be local or ray for engine servers, got {backend!r}")
        self.model, self.spec, self.backend, self.max_restarts = model, spec, backend, max_restarts
        self.pad_token_id = spec.pad_token_id
        self.devices = list(devices or [])
        if self.devices and len(self.devices) != servers:
            raise ValueError(f"dist.server_devices names {len(self.devices)} devices for {servers} servers")
        self.version, self.restarts, self.weights = 0, 0, None
        self.bucket_mb, self.only_changed = bucket_mb, only_changed
        self.tracker = ChangeTracker()
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
        died = self._collect(range(servers))  # their "ready"
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

    def _recover(self, died: list[int]) -> None:
        """Restart the servers in `died`, form the weight group again and broadcast the current version,
        until every server holds it."""
        while True:
            if died:
                if self.restarts + len(died) > self.max_restarts:
                    raise ServerDied(f"engine servers {died} died after {self.restarts} restarts "
                                     f"(dist.max_restarts={self.max_restarts})")
                self.restarts += len(died)
                for i in died:
                    say_restart("engine server", i, f"exit code {self.servers[i].process.exitcode}"
                                if hasattr(self.servers[i], "process") else "its actor is gone",
                                self.restarts, self.max_restarts)
                    self.servers[i].kill()
                    self.servers[i] = self._start(i)
                died = self._collect(died)  # their "ready"
                if died:
                    continue
            died = self._form()
            if not died:
                died, *self.last_sync = self._sync()
            if not died:
                return

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
        self.tracker.forget()  # a new group: every server gets the whole version
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
        died = sorted(set(died) | set(self._collect([i for i in range(len(self.servers)) if i not in died])))
        if not died:
            self.tracker.record(weights)
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


def resolve_broadcast(name: str, learner_device: torch.device, devices: list[str]) -> str:
    """`dist.broadcast`: gloo or nccl; auto is nccl when the learner and every server are on GPUs."""
    if name != "auto":
        return name
    on_gpus = learner_device.type == "cuda" and devices and all(d.startswith("cuda") for d in devices)
    return "nccl" if on_gpus else "gloo"

