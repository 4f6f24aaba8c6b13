"""The generation queue behind `lmrl serve`: first come, first served, concurrent requests batched.

One worker thread owns the engine. Requests wait in arrival order; each engine call takes the
oldest waiting request and every other waiting request that can share its call (same `n` and
sampling settings, no `seed` of its own) up to a row and token budget, so a burst of judge calls
costs one batched generation instead of one each. The queue is bounded twice: a request that finds
`max_queue` others waiting is refused at once (`QueueFull`, HTTP 429), and one that has waited
`queue_timeout_s` without starting is withdrawn (`QueueTimeout`, HTTP 503). A running generation is
never interrupted; the server bounds its length (context check, `max_tokens` limit) before it
enters the queue.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from lmrl.engines import Completion, SamplingParams


class QueueFull(RuntimeError):
    """Too many requests already waiting (HTTP 429): retry later."""


class QueueTimeout(RuntimeError):
    """The request waited too long for its turn (HTTP 503): retry later."""


@dataclass(eq=False)
class Job:
    """One request's generation: its inputs, then its completions (or the error that stopped them)."""

    prompt: list[int]
    n: int
    params: SamplingParams
    generator: torch.Generator | None
    done: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    result: list[Completion] | None = None
    error: BaseException | None = None

    def joins(self, first: "Job") -> bool:
        """Whether this job may share `first`'s engine call (a seeded job keeps its own generator)."""
        return (self.generator is None and first.generator is None and self.n == first.n
                and self.params == first.params)


class GenerationQueue:
    """A FIFO of generation jobs served by one worker thread; `submit` blocks until its job is done."""

    def __init__(self, engine, max_batch_rows: int = 32, max_batch_tokens: int = 32768, max_queue: int = 64,
                 queue_timeout_s: float = 120.0):
        if min(max_batch_rows, max_batch_tokens, max_queue) < 1 or queue_timeout_s <= 0:
            raise ValueError("max_batch_rows, max_batch_tokens and max_queue must be >= 1 and queue_timeout_s > 0")
        self.engine = engine
        self.max_batch_rows, self.max_batch_tokens = max_batch_rows, max_batch_tokens
        self.max_queue, self.queue_timeout_s = max_queue, queue_timeout_s
        self.stats = {"engine_calls": 0, "requests": 0, "largest_batch": 0, "refused_full": 0, "timed_out": 0,
                      "last_call_s": 0.0}
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="lmrl-serve-generation", daemon=True)
        self._worker.start()

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn (not counting those being generated)."""
        with self._cond:
            return len(self._waiting)

    def submit(self, prompt: list[int], n: int, params: SamplingParams,
               generator: torch.Generator | None = None) -> list[Completion]:
        """`n` completions of `prompt`, once the jobs ahead of it are done."""
        job = Job(prompt, n, params, generator)
        with self._cond:
            if self._closed:
                raise RuntimeError("the generation queue is closed")
            if len(self._waiting) >= self.max_queue:
                self.stats["refused_full"] += 1
                raise QueueFull(f"{len(self._waiting)} requests are already waiting (the server's max_queue); "
                                "retry later")
            self._waiting.append(job)
            self._cond.notify_all()
        if not job.done.wait(self.queue_timeout_s):
            with self._cond:
                if not job.started:
                    self._waiting.remove(job)
                    self.stats["timed_out"] += 1
                    raise QueueTimeout(f"the request waited {self.queue_timeout_s:g} s for its turn without "
                                       "starting (the server's queue_timeout_s); retry later")
            job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """Stop the worker after the job it is running; waiting jobs fail."""
        with self._cond:
            self._closed = True
            for job in self._waiting:
                job.error = RuntimeError("the server is shutting down")
                job.done.set()
            self._waiting.clear()
            self._cond.notify_all()

    def _take(self) -> list[Job]:
        """The oldest waiting job and the waiting jobs that can share its call, within the budgets."""
        first = self._waiting.popleft()
        batch, width = [first], len(first.prompt)
        for job in list(self._waiting):
            rows, wider = (len(batch) + 1) * first.n, max(width, len(job.prompt))
            if not job.joins(first) or rows > self.max_batch_rows:
                continue
            if rows * (wider + first.params.max_new_tokens) > self.max_batch_tokens:
                continue
            batch.append(job)
            width = wider
            self._waiting.remove(job)
        for job in batch:
            job.started = True
        return batch

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = self._take()
            started = time.perf_counter()
            try:
                out = self.engine.generate([j.prompt for j in batch], batch[0].n, batch[0].params, batch[0].generator)
                for job, completions in zip(batch, out):
                    job.result = completions
            except Exception as err:  # every job of the call answers with the failure (HTTP 500)
                for job in batch:
                    job.error = err
            finally:
                self.stats["engine_calls"] += 1
                self.stats["requests"] += len(batch)
                self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
                self.stats["last_call_s"] = time.perf_counter() - started
                for job in batch:
                    job.done.set()
