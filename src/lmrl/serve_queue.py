"""The generation queue behind `lmrl serve`: first come, first served, concurrent requests batched.

One worker thread owns the engine. Requests wait in arrival order; each engine call takes the
oldest waiting request and every other waiting request that can share its call (same `n` and
sampling settings, no `seed` of its own) up to a row and token budget, so a burst of judge calls
costs one batched generation instead of one each. A scoring request (the log-probs of its prompts'
own tokens, `/v1/completions` with `echo`) shares one forward pass with the scoring requests
waiting beside it in the same way. The queue is bounded twice: a request that finds
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
    """One request's engine work: its prompts, then one result per prompt (or the error that stopped them).

    `params` None makes it a scoring job: each prompt's token log-probs with the `top` likeliest tokens at each
    position (`HFEngine.score`); otherwise `n` completions of each prompt."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams | None
    generator: torch.Generator | None
    top: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    result: list | None = None
    error: BaseException | None = None

    @property
    def new_tokens(self) -> int:
        return 0 if self.params is None else self.params.max_new_tokens

    def joins(self, first: "Job") -> bool:
        """Whether this job may share `first`'s engine call (a seeded job keeps its own generator)."""
        return (self.generator is None and first.generator is None and self.n == first.n
                and self.params == first.params and self.top == first.top)

    def run(self, engine, prompts: list[list[int]]) -> list:
        """The engine call of a batch led by this job, over every prompt of the batch."""
        if self.params is None:
            return engine.score(prompts, self.top)
        return engine.generate(prompts, self.n, self.params, self.generator)


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
        return self.run(Job([prompt], n, params, generator))[0]

    def submit_many(self, prompts: list[list[int]], n: int, params: SamplingParams | None, top: int = 0) -> list:
        """For each of `prompts`: `n` completions, or (`params` None) its scores (`HFEngine.score`), in one job."""
        return self.run(Job(prompts, n, params, None, top))

    def run(self, job: Job) -> list:
        """`job`'s results, once the jobs ahead of it are done."""
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
        batch, rows, width = [first], len(first.prompts) * first.n, max(map(len, first.prompts))
        for job in list(self._waiting):
            more, wider = rows + len(job.prompts) * first.n, max(width, *map(len, job.prompts))
            if not job.joins(first) or more > self.max_batch_rows:
                continue
            if more * (wider + first.new_tokens) > self.max_batch_tokens:
                continue
            batch.append(job)
            rows, width = more, wider
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
                out = batch[0].run(self.engine, [p for job in batch for p in job.prompts])
                for job in batch:
                    job.result, out = out[: len(job.prompts)], out[len(job.prompts):]
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
