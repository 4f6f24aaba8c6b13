"""The program the sandboxed interpreter runs first (passed with `-c`, its settings as JSON in argv).

It reads the code from a pipe, sets the rlimits and forks: the supervisor waits and exits 128+N
when signal N ended the worker; the worker installs the audit hook (refused events, writes only in
the working directory `root`, no reads of other processes' /proc entries nor of the `deny_read`
paths, which the parent lists only when the sandbox has no private filesystem), appends `path` to
`sys.path` (declared packages) and runs the code. `owner` (the parent's pid) only labels the
command line. Trusted code, but run where the model's code runs: it holds nothing secret.
"""

BOOTSTRAP = r'''
import os, sys, json, resource, signal, traceback
cfg = json.loads(sys.argv[1])
with os.fdopen(cfg["code_fd"], "rb") as f:
    source = f.read().decode("utf-8", "replace")
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
try:
    pid = os.fork()
except OSError as err:
    sys.stderr.write(f"sandbox: cannot start the worker: {err}\n")
    os._exit(125)
if pid:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(125)
        except InterruptedError:
            continue
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))

ROOT = os.path.realpath(cfg["root"])
WRITABLE = (ROOT, "/dev/null")
DENY_READ = tuple(os.path.realpath(p) for p in cfg["deny_read"] if not p.startswith("*"))
DENY_PARTS = tuple(p[1:] for p in cfg["deny_read"] if p.startswith("*"))  # "*/x/y/": any path containing /x/y/
ME = str(os.getpid())
AF_UNIX = 1
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
               "os.truncate": (0,), "os.utime": (0,), "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,),
               "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,)}
DENIED = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
          "os.killpg", "resource.setrlimit", "resource.prlimit", "socket.connect", "socket.bind",
          "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
          "socket.gethostbyname_ex", "socket.gethostbyaddr", "ctypes.dlopen", "ctypes.dlsym",
          "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.call_function", "os.startfile", "pty.spawn"}
DENIED_IMPORTS = {"_posixsubprocess", "_ctypes"}

def _path(p):
    if isinstance(p, int):
        return None
    p = os.fsdecode(os.fspath(p))
    return os.path.normpath(os.path.join(os.getcwd(), p))

def _inside(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

def _check_write(p, event):
    path = _path(p)
    if path is not None and not _inside(os.path.realpath(path), WRITABLE):
        raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed: {path}")

def _proc_denied(path):
    parts = path.split("/")
    if len(parts) < 3 or parts[1] != "proc":
        return False
    return (parts[2].isdigit() and parts[2] != ME) or parts[-1] == "mem"

def _check_read(p):
    path = _path(p)
    if path is None:
        return
    real = os.path.realpath(path)
    own_proc = path.startswith(("/proc/self/", "/proc/thread-self/"))
    denied = _inside(path, DENY_READ) or _inside(real, DENY_READ) or any(f in path or f in real for f in DENY_PARTS)
    if _proc_denied(path) or (not own_proc and _proc_denied(real)) or denied:
        raise PermissionError(f"sandbox: reading {path} is not allowed")

def _hook(event, args):
    if event in DENIED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(flags, int) and flags & WRITE_FLAGS) or (isinstance(mode, str) and set(mode) & set("wax+"))
        _check_write(path, "writing") if writing else _check_read(path)
    elif event in PATH_EVENTS:
        for i in PATH_EVENTS[event]:
            _check_write(args[i], event)
    elif event == "os.kill" and args[0] != os.getpid():
        raise PermissionError("sandbox: signalling other processes is not allowed")
    elif event == "socket.__new__" and args[1] != AF_UNIX:
        raise PermissionError("sandbox: network sockets are not allowed")
    elif event == "import" and args[0] in DENIED_IMPORTS:
        raise ImportError(f"sandbox: importing {args[0]} is not allowed")

if cfg["audit"]:
    for name in ("pidfd_open",):
        for module in (os, sys.modules.get("posix")):
            if module is not None and hasattr(module, name):
                delattr(module, name)
    if hasattr(signal, "pidfd_send_signal"):
        del signal.pidfd_send_signal
    sys.addaudithook(_hook)
sys.path.extend(cfg["path"])
main = {"__name__": "__main__", "__builtins__": __builtins__}
if cfg.get("channel"):
    main["__sandbox_channel__"] = tuple(cfg["channel"])
del cfg
code = 0
try:
    exec(compile(source, "<sandbox>", "exec"), main)
except SystemExit as exit_:
    if exit_.code is None or isinstance(exit_.code, int):
        code = exit_.code or 0
    else:
        sys.stderr.write(f"{exit_.code}\n")
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
finally:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code if 0 <= code < 256 else 1)
'''
