"""`SandboxSession`: the sandbox's process kept open, answering requests over private pipes.

`run_python` (`lmrl.rewards.sandbox`) runs code once and reports; a session starts the same
contained process (same `launch`, filesystem view, rlimits, namespaces, audit hook, cleanup: a
fresh mount namespace per session, so nothing one session writes reaches another) but gives the code
two private pipes (`__sandbox_channel__`) and lets the parent send requests and read lines back
with deadlines, while the code's output is drained. Its own module because it is the interactive
I/O on top of the isolation, not part of it. What the code writes is an untrusted claim
(`code_tests` uses a session so the verdict forms outside, in the parent).
"""
from __future__ import annotations

import os
import selectors
import shutil
import time

from lmrl.rewards.sandbox import SandboxResult, classify, kill_group, launch


class SandboxSession:
    """`code` running in the sandbox and talking with the parent over two pipes of its own.

    The code finds `__sandbox_channel__ = (read_fd, write_fd)` in its globals: it reads what the
    parent `send`s from the first and writes lines for `receive` to the second. Its stdout and
    stderr are drained while the parent waits (the last `max_output_bytes` of each kept; output
    never stops it). Nothing stops the code between calls but the kernel limits (`timeout_s` sets
    the CPU-time limit): the parent bounds each wait with a deadline and `close`s the session (the
    whole process group is killed) when it is done or the code stops answering. Everything the code
    writes is untrusted: a caller must treat a line as a claim, never as a verdict.
    """

    def __init__(self, code: str, timeout_s: float = 5.0, memory_mb: int = 512, cpu_s: int | None = None,
                 file_size_mb: int = 16, max_processes: int = 16, max_open_files: int = 64,
                 max_output_bytes: int = 1_000_000, audit: bool = True, user: str | None = "nobody",
                 python: str | None = None, isolation: str = "auto", packages: tuple[str, ...] = (),
                 max_line_bytes: int = 8_000_000):
        self.start = time.monotonic()
        self.max_output_bytes, self.max_line_bytes = max_output_bytes, max_line_bytes
        self._stop: str | None = None
        self._result: SandboxResult | None = None
        to_child, from_parent = os.pipe()[::-1]  # (write end kept here, read end for the code)
        from_child, to_parent = os.pipe()
        try:
            self.proc, self.root = launch(code, timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s,
                                          file_size_mb=file_size_mb, max_processes=max_processes,
                                          max_open_files=max_open_files, max_output_bytes=max_output_bytes,
                                          audit=audit, user=user, python=python, isolation=isolation,
                                          packages=packages, channel=(from_parent, to_parent))
        except BaseException:
            for fd in (to_child, from_parent, from_child, to_parent):
                os.close(fd)
            raise
        os.close(from_parent)
        os.close(to_parent)
        self._to, self._from = to_child, from_child
        for fd in (self._to, self._from, self.proc.stdout.fileno(), self.proc.stderr.fileno()):
            os.set_blocking(fd, False)
        self._lines = bytearray()
        self._eof = False
        self._output = {self.proc.stdout.fileno(): bytearray(), self.proc.stderr.fileno(): bytearray()}
        self._sel = selectors.DefaultSelector()
        for fd in (self._from, *self._output):
            self._sel.register(fd, selectors.EVENT_READ)

    def __enter__(self) -> "SandboxSession":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._result is None and not self._eof and self.proc.poll() is None

    def _pump(self, timeout: float) -> None:
        """Read whatever is ready (waiting at most `timeout`) into the line buffer and output tails."""
        for key, _ in self._sel.select(timeout=max(0.0, timeout)):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self._sel.unregister(key.fd)
                if key.fd == self._from:
                    self._eof = True
                continue
            if key.fd == self._from:
                self._lines += chunk
            else:
                buf = self._output[key.fd]
                buf += chunk
                del buf[: max(0, len(buf) - self.max_output_bytes)]

    def discard(self) -> None:
        """Drop everything the code has written to the channel so far."""
        if self._result is None:
            self._pump(0)
        self._lines.clear()

    def send(self, data: bytes, deadline: float) -> bool:
        """Write `data` to the code's channel by `deadline`; False if it could not (gone, not reading)."""
        view = memoryview(data)
        while view and self.alive:
            try:
                view = view[os.write(self._to, view):]
                continue
            except BlockingIOError:
                pass
            except OSError:  # BrokenPipeError: the code closed its end or is gone
                return False
            now = time.monotonic()
            if now >= deadline:
                return False
            self._pump(0)  # keep its output flowing while we wait
            selectors_ = selectors.DefaultSelector()
            selectors_.register(self._to, selectors.EVENT_WRITE)
            selectors_.select(timeout=min(0.05, deadline - now))
            selectors_.close()
        return not view

    def receive(self, deadline: float) -> bytes | None:
        """The next line the code writes to the channel, or None: deadline passed, the code is gone,
        or the line is longer than `max_line_bytes`."""
        while True:
            end = self._lines.find(b"\n")
            if end >= 0:
                line = bytes(self._lines[:end])
                del self._lines[: end + 1]
                return line
            if len(self._lines) > self.max_line_bytes or self._result is not None or self._eof:
                return None
            now = time.monotonic()
            if now >= deadline:
                return None
            exited = self.proc.poll() is not None
            self._pump(min(0.05, deadline - now))
            if exited and not self._sel.select(timeout=0):
                self._pump(0)
                if self._lines.find(b"\n") < 0:
                    return None

    def close(self, timed_out: bool = False) -> SandboxResult:
        """Kill the process group and clean up (idempotent); `timed_out`: we gave up waiting on it."""
        if self._result is not None:
            return self._result
        if timed_out and self.proc.poll() is None:
            self._stop = "timeout"
        kill_group(self.proc)
        returncode = self.proc.wait()
        try:
            self._pump(0)
        except OSError:
            pass
        self._sel.close()
        for fd in (self._to, self._from):
            os.close(fd)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
        out, err = (bytes(self._output[fd]).decode("utf-8", "replace") for fd in self._output)
        status, reason, code_rc = classify(returncode, err, self._stop)
        self._result = SandboxResult(status, out, err, code_rc, time.monotonic() - self.start, reason)
        return self._result
