"""The sandbox's filesystem: the bubblewrap (`bwrap`) command line that builds its mount namespace.

The code's root holds only what running Python needs, read-only: the shared libraries (`/usr/lib`,
`/lib`…), the interpreter's executable and its library directory (the standard library), with every
`site-packages`/`dist-packages` directory in them (any interpreter's) hidden under an empty tmpfs, and the packages a
task declares, under `/packages`. The working directory (`/sandbox`), `/tmp` and `/dev/shm` are
private tmpfs; `/proc` is the pid namespace's own; `/dev` holds only null, zero, full, random,
urandom and tty. The host's home, project, virtualenvs, datasets and caches do not exist there, so
no path, symlink, `..`, directory descriptor or `/proc` link can name them; and the namespace,
tmpfs included, ends with the sample, so nothing it writes reaches a later one.

A program other than Python (a compiler, a compiled binary, node: `lmrl.rewards.sandbox_program`) gets
`tool_layout`: the same shared libraries and masks, plus the host paths it declares (executables,
header directories), each read-only at its own path with the symlinks leading to it recreated; and
`root_command` binds the caller's files (a source, a binary) read-only into the working directory.

When the parent is root, bwrap builds the namespaces with root's rights (it can bind an interpreter
installed under `/root`), keeps only CAP_SETUID/CAP_SETGID for the command, which starts with
`setpriv` (drop to the sandbox user, no capabilities left) and `unshare --user` (a user namespace of
the code's own, so that RLIMIT_NPROC counts only the sandbox's tasks). Otherwise bwrap runs
unprivileged in a new user namespace and the code keeps the caller's uid.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
from dataclasses import dataclass

WORKDIR = "/sandbox"  # the code's cwd and HOME, a private tmpfs
PACKAGES_DIR = "/packages"  # where declared packages are bound (appended to sys.path)
SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/usr/share/zoneinfo")
TOP_LEVEL_LIBS = ("/lib", "/lib64", "/lib32", "/libx32")  # symlinks into /usr on merged-/usr systems
SITE_DIRS = ("site-packages", "dist-packages")  # hidden wherever they are in the bound trees
NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")

_PROBE = r'''
import json, os, sys, sysconfig
paths = sysconfig.get_paths()
print(json.dumps({"executable": os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable),
                  "libdir": sysconfig.get_config_var("LIBDIR") or "", "stdlib": paths["stdlib"],
                  "platstdlib": paths["platstdlib"], "in_venv": sys.prefix != sys.base_prefix}))
'''


@dataclass(frozen=True)
class Layout:
    """What of an interpreter's installation the sandbox binds (read-only, same paths) and hides."""

    executable: str
    binds: tuple[str, ...]
    masks: tuple[str, ...]  # site directories inside the binds, each covered by an empty tmpfs
    stdlib: tuple[str, ...]  # the standard library's directories (importable without declaring)
    links: tuple[tuple[str, str], ...] = ()  # (target, path): symlinks recreated on the way to a declared tool


def _probe(python: str) -> dict:
    out = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def _inside(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.lru_cache(maxsize=None)
def _site_dirs(root: str) -> tuple[str, ...]:
    """Every site-packages/dist-packages directory under `root` (any interpreter's: a bundled
    Python in /usr/lib has its own), not descending into them nor following symlinks."""
    found = []
    for path, dirs, _ in os.walk(root):
        found += [os.path.join(path, d) for d in dirs if d in SITE_DIRS]
        dirs[:] = [d for d in dirs if d not in SITE_DIRS]
    return tuple(found)


@functools.lru_cache(maxsize=None)
def layout(python: str) -> Layout:
    """The base interpreter behind `python` (a virtualenv's is its base: the venv itself is never
    bound), the directories it runs from, and the site directories in them to hide."""
    info = _probe(python)
    if info["in_venv"] or os.path.realpath(python) != info["executable"]:
        info = _probe(info["executable"])
    if info["in_venv"]:
        raise RuntimeError(f"sandbox: cannot find the base interpreter of {python}")
    binds = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    binds += [d for d in TOP_LEVEL_LIBS if os.path.isdir(d) and not os.path.islink(d)]
    for path in (info["executable"], info["libdir"], info["stdlib"], info["platstdlib"]):
        real = os.path.realpath(path) if path else ""
        if real and os.path.exists(real) and real != "/" and not _inside(real, binds):
            binds = [b for b in binds if not _inside(b, [real])] + [real]
    masks = sorted(site for root in binds if os.path.isdir(root) for site in _site_dirs(root))
    stdlib = tuple(sorted({os.path.realpath(info[k]) for k in ("stdlib", "platstdlib")}))
    return Layout(info["executable"], tuple(binds), tuple(masks), stdlib)


def _link_chain(path: str) -> tuple[list[tuple[str, str]], str]:
    """The symlinks met resolving `path` hop by hop ((target, link path) each) and the real path of the
    file it ends at (directories on the way that are symlinks resolved too)."""
    links: list[tuple[str, str]] = []
    for _ in range(40):
        if not os.path.islink(path):
            return links, os.path.realpath(path)
        target = os.readlink(path)
        links.append((target, path))
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    raise RuntimeError(f"sandbox: too many symlinks resolving {path}")


@functools.lru_cache(maxsize=None)
def tool_layout(tools: tuple[str, ...]) -> Layout:
    """A root for programs other than Python: the shared libraries (`SYSTEM_DIRS`, `TOP_LEVEL_LIBS`) plus
    each declared tool path (an executable, a header or library directory), read-only at its own path, with
    the symlinks leading to it recreated; site directories hidden as in `layout`. The first tool is the
    executable. A tool path that does not exist is an error (the caller names its package)."""
    binds = [d for d in (*SYSTEM_DIRS, *TOP_LEVEL_LIBS) if os.path.isdir(d) and not os.path.islink(d)]
    links: list[tuple[str, str]] = []
    for tool in tools:
        if not os.path.isabs(tool) or not os.path.exists(tool):
            raise RuntimeError(f"sandbox: declared tool path {tool!r} does not exist")
        chain, real = _link_chain(tool)
        links += [link for link in chain if link not in links and not _inside(link[1], binds)]
        if not _inside(real, binds):
            binds = [b for b in binds if not _inside(b, [real])] + [real]
    masks = sorted(site for root in binds if os.path.isdir(root) for site in _site_dirs(root))
    return Layout(tools[0] if tools else "", tuple(binds), tuple(masks), (), tuple(links))


def package_binds(packages: tuple[str, ...], view: Layout) -> list[tuple[str, str]]:
    """(host path, path in the sandbox) for each declared top-level package, found in the trainer's
    environment: its directory (or module file) and a `<name>.libs` directory beside it (where
    wheels keep their bundled shared libraries). Standard-library modules need no binding."""
    pairs = []
    for name in packages:
        if not name.isidentifier():
            raise ValueError(f"sandbox: a declared package is a top-level module name, not {name!r}")
        spec = importlib.util.find_spec(name)
        if spec is None or (spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations):
            if spec is not None:
                continue  # built into the interpreter
            raise ValueError(f"sandbox: declared package {name!r} is not installed in the trainer's environment")
        source = list(spec.submodule_search_locations)[0] if spec.submodule_search_locations else spec.origin
        source = os.path.realpath(source)
        if _inside(source, view.stdlib) and not _inside(source, view.masks):
            continue
        pairs.append((source, os.path.join(PACKAGES_DIR, os.path.basename(source))))
        libs = os.path.join(os.path.dirname(source), f"{name}.libs")
        if os.path.isdir(libs):
            pairs.append((libs, os.path.join(PACKAGES_DIR, os.path.basename(libs))))
    return pairs


def _parents(paths) -> list[str]:
    """Every ancestor directory of `paths`, outermost first (bwrap would create them 0700)."""
    seen: list[str] = []
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:i])
            if parent not in seen:
                seen.append(parent)
    return seen


def _tool(name: str) -> str:
    path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise RuntimeError(f"sandbox: {name} (util-linux) is not installed")
    return os.path.realpath(path)


def command(python: str, identity: tuple[int, int] | None, size_mb: int, packages: tuple[str, ...],
            user_namespace: bool) -> list[str]:
    """The bwrap command line up to and including the interpreter, for code run as `identity`
    ((uid, gid) when the parent is root, else None); `size_mb` bounds each private tmpfs;
    `user_namespace`: when root, give the code a user namespace of its own (`unshare --user`)."""
    view = layout(python)
    return [*root_command(view, identity, size_mb, package_binds(packages, view), user_namespace), view.executable]


def root_command(view: Layout, identity: tuple[int, int] | None, size_mb: int, extra: list[tuple[str, str]],
                 user_namespace: bool, tools: tuple[str, ...] = (), writable: tuple[tuple[str, str], ...] = ()
                 ) -> list[str]:
    """The bwrap command line for `view`, ending with the programs that drop to `identity` (the caller
    appends what runs): `extra` (host path, path inside) are bound read-only after the private tmpfs (so
    a file may be placed in the working directory), `writable` read-write; `tools`: more programs of the
    host (util-linux) bound at their paths for the caller's command line."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("bubblewrap (bwrap) is not installed")
    root = os.geteuid() == 0
    drop: list[str] = []  # the programs between bwrap and the interpreter (bound into the sandbox too)
    helpers = list(tools)
    if root and identity is not None:
        uid, gid = identity
        setpriv = _tool("setpriv")
        helpers.append(setpriv)
        drop = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        if user_namespace:
            helpers.append(_tool("unshare"))
            drop += [helpers[-1], "--user", f"--map-user={uid}", f"--map-group={gid}"]
    binds = [(b, b) for b in (*view.binds, *helpers)]
    args = [bwrap, *NAMESPACES, "--die-with-parent", "--new-session"]
    if root:
        args += ["--cap-drop", "ALL"] + (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if drop else [])
    else:
        args += ["--unshare-user", "--disable-userns"]
    size = str(max(size_mb, 1) << 20)
    late = [*extra, *writable]
    dests = [dest for _, dest in (*binds, *late)] + [path for _, path in view.links]
    for parent in _parents([*dests, WORKDIR]):
        if not _inside(parent, dests) and not _inside(parent, [WORKDIR, "/tmp"]):
            args += ["--perms", "0755", "--dir", parent]
    for top in TOP_LEVEL_LIBS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
    for source, dest in binds:
        args += ["--ro-bind", source, dest]
        args += [arg for mask in view.masks if _inside(mask, [dest]) and source == dest
                 for arg in ("--perms", "0755", "--size", "4096", "--tmpfs", mask, "--remount-ro", mask)]
    for target, path in view.links:
        args += ["--symlink", target, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    for private in ("/tmp", "/dev/shm", WORKDIR):
        args += ["--perms", "1777", "--size", size, "--tmpfs", private]
    for source, dest in extra:
        args += ["--ro-bind", source, dest]
    for source, dest in writable:
        args += ["--bind", source, dest]
    return [*args, "--chdir", WORKDIR, "--", *drop]
