"""The candidate as `code_tests`' trusted test sees it: a stub whose every call runs in the sandbox.

`RemoteCandidate` loads the program (prompt plus model code) in a `SandboxSession` running the
harness below, then sends each call as "call #k (nonce n) with these arguments" and turns the
answer back into a value, the builtin exception the candidate raised, or `CandidateFailed`. Both
ends share one codec (`encode_value`/`decode_value`): plain data of exact builtin types only.
Why a module of its own: this is the trust boundary. Everything that crosses between the trusted
parent (`lmrl.rewards.code`, which runs the test and forms the verdict) and the untrusted process
lives here (wire format, sandbox-side harness, checks on an answer, time budgets, restarts), and
nothing here knows the test, its expected values or the verdict.
"""
from __future__ import annotations

import builtins
import json
import secrets
import time

from lmrl.rewards.sandbox_session import SandboxSession

STARTUP_S = 2.0  # allowance for the sandboxed interpreter to start, before the candidate's load limit
GRACE_S = 0.5  # how long past a call's limit the parent waits for the sandbox to report the timeout itself
MAX_VALUE_BYTES = 8_000_000  # the longest answer line the parent reads

# Plain data across the boundary: [tag, payload] with exact builtin types only. The same source is
# run in the parent (to send arguments and read answers) and in the sandbox (the other way round).
_CODEC = r'''
MAX_DEPTH = 100
CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}

def encode(x, depth=0):
    t = type(x)
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if x is None:
        return ["none"]
    if t is bool:
        return ["bool", x]
    if t is int:
        return ["int", int.__format__(x, "x")]
    if t is float:
        return ["float", float.__repr__(x)]
    if t is str:
        return ["str", x]
    if t is bytes:
        return ["bytes", bytes.hex(x)]
    if t is list or t is tuple or t is set or t is frozenset:
        return [t.__name__, [encode(v, depth + 1) for v in x]]
    if t is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(x)]]
    raise TypeError(f"{t.__name__} is not plain data")

def decode(node, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError("not a tagged value")
    tag = node[0]
    if tag == "none" and len(node) == 1:
        return None
    if len(node) != 2:
        raise ValueError("not a tagged value")
    v = node[1]
    if tag == "bool" and type(v) is bool:
        return v
    if tag == "int" and type(v) is str and len(v) < 100_000:
        return int(v, 16)
    if tag == "float" and type(v) is str and len(v) < 100:
        return float(v)
    if tag == "str" and type(v) is str:
        return v
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if tag in CONTAINERS and type(v) is list:
        return CONTAINERS[tag]([decode(item, depth + 1) for item in v])
    if tag == "dict" and type(v) is list:
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("not a key-value pair")
            out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return out
    raise ValueError(f"unknown tag {tag!r}")
'''
_codec: dict = {"__builtins__": builtins}
exec(compile(_CODEC, "<codec>", "exec"), _codec)
encode_value, decode_value = _codec["encode"], _codec["decode"]

# The sandboxed side: load the candidate, then answer calls until the parent closes the channel.
# It holds no test, no expected value and no verdict; it is untrusted like the code it runs.
_HARNESS = r'''
import builtins, json, os, signal
PROGRAM, ENTRY, LOAD_LIMIT = __PAYLOAD__
CHANNEL_IN, CHANNEL_OUT = __sandbox_channel__
__CODEC__
# pin what the harness uses before the candidate can patch builtins (a nicety, not a defence)
type, int, float, bytes, list, tuple, set, frozenset, dict, len, callable, getattr, BaseException = (
    builtins.type, builtins.int, builtins.float, builtins.bytes, builtins.list, builtins.tuple, builtins.set,
    builtins.frozenset, builtins.dict, builtins.len, builtins.callable, builtins.getattr, builtins.BaseException)
dumps, loads = json.dumps, json.loads

class Timeout(BaseException):
    pass

def on_alarm(*_):
    raise Timeout()

def within(limit, fn, *args):
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(limit, 0.001))
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

def reply(record):
    data = (dumps(record) + "\n").encode()
    while data:
        data = data[os.write(CHANNEL_OUT, data):]

namespace = {"__name__": "candidate", "__builtins__": builtins}
try:
    within(LOAD_LIMIT, exec, compile(PROGRAM, "<candidate>", "exec"), namespace)
    function = namespace.get(ENTRY)
    ready = callable(function)
except BaseException:
    ready = False
reply({"ready": ready})
if not ready:
    os._exit(0)

pending = bytearray()

def next_request():
    while True:
        end = pending.find(b"\n")
        if end >= 0:
            line = bytes(pending[:end])
            del pending[:end + 1]
            return line
        chunk = os.read(CHANNEL_IN, 1 << 16)
        if not chunk:
            return None
        pending.extend(chunk)

def call(request):
    args = [decode(a) for a in request["args"]]
    kwargs = {k: decode(v) for k, v in request["kwargs"]}
    try:
        value = function(*args, **kwargs)
    except Timeout:
        raise
    except BaseException as exc:
        cls = type(exc)
        return {"raised": cls.__name__ if getattr(builtins, cls.__name__, None) is cls else "exception"}
    try:
        return {"value": encode(value)}
    except Timeout:
        raise
    except BaseException:
        return {"failed": "not plain data"}

while True:
    line = next_request()
    if line is None:
        break
    request = {}
    try:
        request = loads(line)
        answer = within(request["limit"], call, request)
    except Timeout:
        answer = {"failed": "timeout"}
    except BaseException:
        answer = {"failed": "harness"}
    answer["id"], answer["nonce"] = request.get("id"), request.get("nonce")
    reply(answer)
os._exit(0)
'''

# What a candidate's exception becomes in the parent: the builtin of that name, for Exception
# subclasses but the two that steer iteration (a StopIteration out of `map(...)` would end an
# `all(...)` early, as a pass).
_EXCEPTIONS = {name: cls for name, cls in vars(builtins).items()
               if isinstance(cls, type) and issubclass(cls, Exception) and name not in ("StopIteration",
                                                                                          "StopAsyncIteration")}
MAX_SAME_HASH = 16  # distinct values of one hash an answer may hold (more: a hash-flooding attempt)


def _hash_flooding(value) -> bool:
    """True when `value` holds many distinct values with one hash (ints, floats and tuples hash
    predictably): put in a set or dict by the test, they would take quadratic time in the parent."""
    groups: dict[int, list] = {}
    stack = [value]
    while stack:
        node = stack.pop()
        t = type(node)
        if t is list or t is tuple or t is set or t is frozenset:
            stack.extend(node)
        elif t is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        try:
            key = tuple(node) if t is list else node
            group = groups.setdefault(hash(key), [])
        except TypeError:
            continue
        if key not in group:
            group.append(key)
            if len(group) > MAX_SAME_HASH:
                return True
    return False


class CandidateFailed(BaseException):
    """A call the candidate did not answer with plain data in time (timeout, crash, early exit,
    unreadable or non-builtin value). A BaseException: a test's `except Exception` cannot pass it."""


class BadTest(BaseException):
    """The row's test cannot be graded this way (a configuration problem, raised as ValueError)."""


class RemoteCandidate:
    """The candidate as the trusted test sees it: each call goes to a sandboxed process and comes
    back as plain data. Owns the sandbox sessions, the time budgets and the restarts."""

    def __init__(self, program: str, entry_point: str, timeout_s: float, test_timeout_s: float,
                 max_restarts: int, sandbox_limits: dict):
        self.harness = (_HARNESS.replace("__PAYLOAD__", repr((program, entry_point, test_timeout_s)))
                        .replace("__CODEC__", _CODEC))
        self.test_timeout_s, self.limits = test_timeout_s, sandbox_limits
        self.deadline = time.monotonic() + timeout_s
        self.restarts_left = max_restarts
        self.session: SandboxSession | None = None
        self.started = self.dead = False
        self.status = "ok"
        self.calls = 0
        self.case_left = test_timeout_s

    def _note(self, status: str) -> None:
        if self.status == "ok":
            self.status = status

    def _lost(self, session: SandboxSession, hung: bool) -> None:
        result = session.close(timed_out=hung)
        self.session = None
        self._note("timeout" if hung else (result.status if result.status != "ok" else "error"))

    def start(self) -> bool:
        """Start a sandboxed process on the candidate and wait until it has loaded; False if it did not."""
        self.started = True
        budget = self.deadline - time.monotonic()
        if budget <= 0.05:
            self.dead = True
            self._note("timeout")
            return False
        session = SandboxSession(self.harness, timeout_s=budget, max_line_bytes=MAX_VALUE_BYTES, **self.limits)
        until = min(time.monotonic() + STARTUP_S + self.test_timeout_s, self.deadline)
        try:
            while True:
                line = session.receive(until)
                if line is None:
                    self._lost(session, hung=session.alive)
                    self.dead = True
                    return False
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if type(record) is dict and "ready" in record:
                    if record["ready"] is True:
                        self.session = session
                        return True
                    session.close()
                    self._note("error")
                    self.dead = True  # loading is deterministic: no restart
                    return False
        except BaseException:
            session.close()
            raise

    def begin_case(self) -> None:
        self.case_left = self.test_timeout_s

    def __call__(self, *args, **kwargs):
        try:
            message = {"args": [encode_value(a) for a in args],
                       "kwargs": [[k, encode_value(v)] for k, v in kwargs.items()]}
        except (TypeError, ValueError) as err:
            raise BadTest(f"the test passes the candidate something that is not plain data ({err})") from None
        if self.session is None:
            if self.dead or not self.started or self.restarts_left <= 0 or not self._restart():
                raise CandidateFailed("the candidate's process is gone")
        limit = min(self.case_left, self.deadline - time.monotonic())
        if limit <= 0:
            self._note("timeout")
            raise CandidateFailed("no time left for this case")
        self.calls += 1
        nonce = secrets.token_hex(16)
        message.update(id=self.calls, nonce=nonce, limit=limit)
        started = time.monotonic()
        try:
            return self._exchange(self.session, message, started + limit + GRACE_S)
        finally:
            self.case_left -= time.monotonic() - started

    def _restart(self) -> bool:
        self.restarts_left -= 1
        return self.start()

    def _exchange(self, session: SandboxSession, message: dict, deadline: float):
        session.discard()  # nothing written before this request can answer it
        if not session.send(json.dumps(message).encode() + b"\n", deadline):
            self._lost(session, hung=session.alive)
            raise CandidateFailed("the candidate's process does not take requests")
        while True:
            line = session.receive(deadline)
            if line is None:
                self._lost(session, hung=session.alive)
                raise CandidateFailed("no answer")
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(record) is not dict or record.get("nonce") != message["nonce"] or record.get("id") != message["id"]:
                continue  # not an answer to this call
            if "value" in record:
                try:
                    value = decode_value(record["value"])
                except (ValueError, TypeError, RecursionError, OverflowError):
                    raise CandidateFailed("the answer is not plain data") from None
                if _hash_flooding(value):
                    raise CandidateFailed("the answer holds many distinct values with the same hash")
                return value
            raised = record.get("raised")
            if type(raised) is str and raised in _EXCEPTIONS:
                try:
                    error = _EXCEPTIONS[raised]("raised by the candidate")
                except Exception:
                    raise CandidateFailed(f"the candidate raised {raised}") from None
                raise error
            if record.get("failed") == "timeout":
                self._note("timeout")
            raise CandidateFailed(f"the call failed: {str(record.get('failed') or record.get('raised'))[:100]}")

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
