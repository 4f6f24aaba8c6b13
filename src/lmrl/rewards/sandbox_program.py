"""Run a program other than Python (a compiler, a compiled binary, node) in the sandbox, once.

`run_program(argv, tools=..., stdin=..., files=..., output_dir=...) -> SandboxResult` is `run_python`
(`lmrl.rewards.sandbox`) for native programs, under the same containment and never raising for what
the program does:
- a fresh bubblewrap root per call (`sandbox_root.tool_layout`): the shared libraries, the declared
  tool paths read-only, site-packages hidden, private tmpfs for the working directory, /tmp and
  /dev/shm, a private /proc and minimal /dev; the host's home, project, virtualenvs and data are not
  there. `files` (host path -> name) are bound read-only into the working directory; `output_dir`,
  a host directory, is bound read-write at `/sandbox/out` (a compiler's output, nothing else);
- new pid, network (loopback only), IPC, UTS and cgroup namespaces, no capabilities, the user
  `nobody` in a user namespace of its own when the parent is root;
- rlimits set by `prlimit` before the program starts (hard = soft): CPU time, address space (or the
  data segment), file size, open files, processes/threads, no core dumps; the process group killed at the wall-clock
  timeout, past the output cap and when the program exits; a minimal environment; `stdin` fed
  through a pipe.
There is no audit hook (the program is not Python): the kernel and the private root are the
boundary. Only bubblewrap gives a private root, so there is no fallback without it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

from lmrl.rewards import sandbox, sandbox_root

OUTPUT_DIR = f"{sandbox_root.WORKDIR}/out"


def _feed(fd: int, data: bytes) -> None:
    """Write the program's stdin and close it (in a thread: a program that never reads must not block us)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the program closed its stdin or is gone
    finally:
        os.close(fd)


def _containment(user: str | None) -> sandbox.Containment:
    box = sandbox._containment("bwrap", sandbox._identity(user), None)
    if not box.private_filesystem:
        raise RuntimeError("sandbox: programs run only under bubblewrap (apt-get install bubblewrap)")
    return box


def _rlimits(box: sandbox.Containment, timeout_s: float, memory_mb: int, file_size_mb: int, max_processes: int,
             max_open_files: int, memory_limit: str = "as") -> list[str]:
    nproc = max_processes + box.helpers if box.helpers is not None else \
        sandbox._count_tasks(box.uid) + max_processes + 1
    limits = {"cpu": int(-(-timeout_s // 1)), memory_limit: memory_mb << 20, "fsize": file_size_mb << 20,
              "nofile": max_open_files, "core": 0, "nproc": nproc}
    return [f"--{name}={value}:{value}" for name, value in limits.items()]


def run_program(argv: list[str], tools: tuple[str, ...], stdin: str = "", files: dict[str, str] | None = None,
                output_dir: str | None = None, timeout_s: float = 5.0, memory_mb: int = 512, file_size_mb: int = 16,
                max_processes: int = 4, max_open_files: int = 64, max_output_bytes: int = 1_000_000,
                user: str | None = "nobody", memory_limit: str = "as"
                ) -> sandbox.SandboxResult:
    """Run `argv` (its program among `tools`, or a file of `files`) in a fresh sandbox: `tools` are the host
    paths the root holds besides the shared libraries; `files` {host path: name in the working directory},
    read-only; `output_dir` a host directory bound read-write at `OUTPUT_DIR`; `max_processes` counts
    processes and threads; `memory_limit`: the rlimit `memory_mb` sets, "as" (address space) or "data" (a
    program that reserves more address space than it uses: Chromium's allocator reserves tens of GB)."""
    if memory_limit not in ("as", "data"):
        raise ValueError(f"sandbox: memory_limit is 'as' or 'data', not {memory_limit!r}")
    if timeout_s <= 0 or memory_mb <= 0 or file_size_mb < 0 or max_processes < 1 or max_output_bytes < 1:
        raise ValueError("sandbox limits must be positive (timeout_s, memory_mb, max_processes, max_output_bytes)")
    box = _containment(user)
    view = sandbox_root.tool_layout(tuple(tools))
    extra = [(os.path.realpath(host), f"{sandbox_root.WORKDIR}/{name}") for host, name in (files or {}).items()]
    writable = ((os.path.realpath(output_dir), OUTPUT_DIR),) if output_dir else ()
    if output_dir and box.identity:
        os.chown(output_dir, *box.identity)
    prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
    if prlimit is None:
        raise RuntimeError("sandbox: prlimit (util-linux) is not installed")
    prefix = sandbox_root.root_command(view, box.identity, file_size_mb, extra, box.user_namespace_inside,
                                       tools=(os.path.realpath(prlimit),), writable=writable)
    limits = _rlimits(box, timeout_s, memory_mb, file_size_mb, max_processes, max_open_files, memory_limit)
    environment = {"PATH": "/usr/bin:/bin", "HOME": sandbox_root.WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    start = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen([*prefix, os.path.realpath(prlimit), *limits, "--", *argv], cwd="/",
                                env=environment, stdin=read_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    feeder = threading.Thread(target=_feed, args=(write_fd, stdin.encode("utf-8")), daemon=True)
    feeder.start()
    try:
        out, err, stop = sandbox._collect(proc, start + timeout_s, max_output_bytes)
        sandbox.kill_group(proc)
        returncode = proc.wait()
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        status, reason, code_rc = sandbox.classify(returncode, stderr, stop)
        truncated = len(out) >= max_output_bytes or len(err) >= max_output_bytes
        return sandbox.SandboxResult(status, stdout, stderr, code_rc, time.monotonic() - start, reason, truncated)
    finally:
        sandbox.kill_group(proc)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        feeder.join(timeout=1.0)
