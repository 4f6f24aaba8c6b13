"""An engine server: an `hf` or `vllm` engine in a process of its own (or a Ray actor), apart from the learner.

`EngineHost` is the server's side. It builds the model from its config alone (no weights travel at
start-up) and the engine over it, joins the learner's weight group (`engines.broadcast`), loads each
version broadcast to it and generates from token ids: prompts in, `Completion`s out (token ids,
behaviour log-probs, finish reason, the version it generated with, its own). A server that holds a
version sends it, server to server, to those started again after a death (`engines.holders`). `serve` runs a host
in a process started by `ProcessServer`, taking commands over a multiprocessing pipe; `RayServer`
runs it as a Ray actor. Both handles give the pool (`engines.server_pool`) one interface: `submit` a
command, then take its `result`, in order; a server that died raises `ServerDied`.
"""
from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.engines.base import ENGINES
from lmrl.engines.broadcast import Plan, join, plan_weights, receive, send


class ServerDied(RuntimeError):
    """The server's process or actor is gone (killed, crashed, its node lost)."""


class ServerFailed(RuntimeError):
    """A command raised inside a live server; the message holds the server's traceback."""


@dataclass
class ServerSpec:
    """What a server builds: the engine `engine` over a `model_class` model made from `model_config`."""

    engine: str
    model_class: type
    model_config: Any
    dtype: torch.dtype
    eos_token_ids: list[int]
    pad_token_id: int
    bf16: bool = False
    device: str = "cpu"
    threads: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # the engine's own keyword settings


class EngineHost:
    """The server's side: an engine over a model of its own, loading the versions broadcast to it."""

    def __init__(self, spec: ServerSpec):
        torch.set_num_threads(spec.threads)
        self.spec, self.device, self.group = spec, torch.device(spec.device), None
        self.receive_on = torch.device("cpu")  # gloo's; NCCL receives on the server's GPU
        with torch.no_grad():
            self.model = spec.model_class(spec.model_config).to(device=self.device, dtype=spec.dtype)
        self.model.requires_grad_(False).eval()
        self.engine = ENGINES.get(spec.engine)(self.model, spec.eos_token_ids, spec.pad_token_id, bf16=spec.bf16,
                                               **spec.options)

    def ready(self) -> str:
        """The node this server runs on (`node_name`), for the choice of a holder to read a version from."""
        return node_name()

    def join(self, address: tuple[str, int], rank: int, world: int, generation: int, backend: str,
             timeout_s: float) -> int:
        self.group = None
        self.group = join(address, rank, world, generation, backend, timeout_s)
        self.receive_on = self.device if backend == "nccl" else torch.device("cpu")
        return rank

    def load(self, plan: Plan) -> int:
        """Receive `plan`'s tensors into the model (the others keep their values) and set the version."""
        tensors = receive(self.group, plan, self.receive_on)
        with torch.no_grad():
            self.model.load_state_dict(tensors, strict=False)
        self.engine.update_weights(None, plan.version)  # vllm pushes the model; hf generates with it
        return plan.version

    def holding(self, bucket_mb: float) -> Plan:
        """The plan of the version this server holds: its whole model, to send to a server that lacks it."""
        return plan_weights(self.model.state_dict().items(), self.engine.version, bucket_mb)[0]

    def serve_version(self, address: tuple[str, int], world: int, generation: int, backend: str, timeout_s: float,
                      bucket_mb: float) -> int:
        """Be rank 0 of a group of `world` ranks (this server and the ones that lack its version) and send
        them the version it holds; the bytes sent."""
        group = join(address, 0, world, generation, backend, timeout_s)
        plan, tensors = plan_weights(self.model.state_dict().items(), self.engine.version, bucket_mb)
        send(group, plan, tensors, self.device if backend == "nccl" else torch.device("cpu"))
        return plan.nbytes

    def generate(self, prompts, n, params, seed: int):
        torch.set_num_threads(self.spec.threads)
        return self.engine.generate(prompts, n, params, torch.Generator().manual_seed(seed))

    def version(self) -> int:
        return self.engine.version

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()


def node_name() -> str:
    """The node this process runs on: its Ray node's address inside a Ray worker, else the host name."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostname()


def serve(conn, spec: ServerSpec) -> None:
    """A server process: build the host, answer "ready", then run commands until "close" or the pipe closes."""
    try:
        host = EngineHost(spec)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", host.ready()))
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):  # the learner is gone
            host.close()
            return
        try:
            conn.send(("ok", getattr(host, method)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
        if method == "close":
            return


class ProcessServer:
    """A server in a process started here (spawned: a fresh interpreter), commanded over a pipe."""

    def __init__(self, spec: ServerSpec, index: int, environment: dict[str, str] | None = None):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, spec), name=f"lmrl-engine-server-{index}",
                                       daemon=True)
        saved = {k: os.environ.get(k) for k in environment or {}}
        os.environ.update(environment or {})  # the child's environment (e.g. its CUDA_VISIBLE_DEVICES)
        try:
            self.process.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        child.close()
        self.pid, self.closing = self.process.pid, False

    def submit(self, method: str, *args) -> None:
        try:
            self.conn.send((method, args))
        except (BrokenPipeError, ConnectionError, OSError) as err:
            raise ServerDied(f"engine server {self.process.name} is gone") from err

    def result(self):
        try:
            status, value = self.conn.recv()
        except (EOFError, ConnectionError, OSError) as err:
            raise ServerDied(f"engine server {self.process.name} is gone (exit code "
                             f"{self.process.exitcode})") from err
        if status == "error":
            raise ServerFailed(f"engine server {self.process.name} failed:\n{value}")
        return value

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()

    def ask_to_close(self) -> None:
        try:
            self.submit("close")
            self.closing = True
        except ServerDied:
            pass

    def close(self) -> None:
        try:
            if not self.closing:
                self.submit("close")
            self.result()  # its engine is closed: nothing is left to wait for
        except (ServerDied, ServerFailed):
            pass
        self.kill()


class RayServer:
    """A server as a Ray actor (anywhere on the cluster); Ray runs its calls one at a time, in order."""

    def __init__(self, ray, actor_class, spec: ServerSpec, strategy=None):
        self.ray = ray
        options = {"scheduling_strategy": strategy} if strategy is not None else {}
        self.actor = actor_class.options(**options).remote(spec)
        self.refs: deque = deque([self.actor.ready.remote()])

    def submit(self, method: str, *args) -> None:
        self.refs.append(getattr(self.actor, method).remote(*args))

    def result(self):
        ref = self.refs.popleft()
        try:
            return self.ray.get(ref)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.WorkerCrashedError) as err:
            raise ServerDied(f"engine server actor {self.actor} is gone") from err
        except self.ray.exceptions.RayTaskError as err:
            raise ServerFailed(f"engine server actor failed:\n{err}") from err

    @property
    def pid(self) -> int | None:
        return None

    def kill(self) -> None:
        self.ray.kill(self.actor)
        self.refs.clear()

    def ask_to_close(self) -> None:
        pass

    def close(self) -> None:
        self.kill()
