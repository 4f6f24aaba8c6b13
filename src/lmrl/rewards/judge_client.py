"""A small client for OpenAI-compatible `/v1/chat/completions` endpoints, used by the judge rewards.

It adds what a reward computed by a remote model needs: a per-request timeout, retries with
exponential backoff and jitter (on timeouts, connection errors, HTTP 5xx / 408 / 429 and replies
that are not a chat completion), a limit on concurrent requests, and a response cache keyed by
(model, messages, sampling params) — in memory (least recently used entries evicted past
`cache_max_entries`), optionally mirrored to a JSON-lines file so a rerun does not pay for the same
judgement twice. Every failure ends in a `JudgeError` naming the endpoint and
the cause; the reward scorer then retries or excludes the sample (`reward.retries`, `reward.on_error`).
`post` sends another route of the same server with the same timeout and retries (a served
distillation teacher's `/v1/completions`).
The parsers at the end read verdicts, scores, score lines and pairwise winners out of free-form
replies, and raise `JudgeResponseError` when a reply holds none.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import requests

RETRY_STATUS = {408, 429}  # plus every 5xx


class JudgeError(RuntimeError):
    """A judge request that failed for good (after its retries), or a reply the judge reward cannot use."""


class JudgeHTTPError(JudgeError):
    """The endpoint answered with an HTTP error status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class JudgeResponseError(JudgeError):
    """The endpoint answered 200 with something that is not a chat completion, or a judge reply is unparseable."""


@dataclass
class JudgeClient:
    """Chat completions from an OpenAI-compatible endpoint; thread-safe, cached, rate-limited.

    `base_url` ends with the API version, as with the OpenAI SDK (`http://127.0.0.1:8000/v1`); the
    API key is read from the environment variable named by `api_key_env` when it is set there.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key_env: str | None = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 512
    extra_params: dict[str, Any] = field(default_factory=dict)  # more request fields: top_p, seed, stop…
    timeout_s: float = 60.0  # per HTTP request
    retries: int = 3  # extra attempts after the first
    backoff_s: float = 0.5  # first wait; doubles each retry
    backoff_max_s: float = 8.0
    jitter: float = 0.25  # each wait is multiplied by a uniform factor in [1 - jitter, 1 + jitter]
    max_concurrency: int = 4  # requests in flight at once, across all threads using this client
    cache: bool = True
    cache_max_entries: int = 50_000  # in-memory entries kept (least recently used evicted first)
    cache_path: str | None = None  # JSON-lines file mirroring the cache: loaded at start, one line appended per entry

    def __post_init__(self):
        if self.max_concurrency < 1 or self.retries < 0 or self.timeout_s <= 0 or self.cache_max_entries < 1:
            raise ValueError("judge client: need max_concurrency >= 1, retries >= 0, timeout_s > 0 and "
                             f"cache_max_entries >= 1 (got {self.max_concurrency}, {self.retries}, {self.timeout_s}, "
                             f"{self.cache_max_entries})")
        self.url = self.base_url.rstrip("/") + "/chat/completions"
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._local = threading.local()
        self._cache_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._cache: OrderedDict[str, dict] = OrderedDict()
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "failures": 0}
        if self.cache_path:
            Path(self.cache_path).parent.mkdir(parents=True, exist_ok=True)
            if Path(self.cache_path).is_file():
                self._load_cache(Path(self.cache_path))

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> "JudgeClient":
        """Build from a recipe's `judge:` mapping; an unknown knob fails with the valid ones listed."""
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown judge client option(s) {unknown}; valid: {sorted(known)}")
        return cls(**params)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def cache_key(self, body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def request_body(self, messages: list[dict[str, str]], **overrides) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_params, **overrides}
        return {k: v for k, v in body.items() if v is not None}

    def complete(self, messages: list[dict[str, str]], **overrides) -> dict[str, Any]:
        """The full chat-completion JSON for `messages` (cached); `overrides` replace request fields."""
        body = self.request_body(messages, **overrides)
        key = self.cache_key(body)
        if self.cache:
            with self._cache_lock:
                if key in self._cache:
                    self._count("cache_hits")
                    self._cache.move_to_end(key)
                    return self._cache[key]
        reply = self._post_with_retries(body)
        if self.cache:
            with self._cache_lock:
                self._remember(key, reply)
                if self.cache_path:
                    with open(self.cache_path, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"key": key, "reply": reply}, ensure_ascii=False) + "\n")
        return reply

    def chat(self, messages: list[dict[str, str]], **overrides) -> str:
        """The text of the first choice of the reply to `messages`."""
        return self.complete(messages, **overrides)["choices"][0]["message"]["content"]

    def chat_many(self, conversations: list[list[dict[str, str]]], per_call: list[dict] | None = None,
                  **overrides) -> list[str]:
        """Several chats at once (at most `max_concurrency` in flight), answers in input order.

        `per_call[i]` adds request fields to conversation i only (e.g. a different `seed` per vote).
        """
        extras = per_call or [{}] * len(conversations)
        jobs = list(zip(conversations, extras))
        if len(jobs) <= 1:
            return [self.chat(c, **{**overrides, **e}) for c, e in jobs]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            return list(pool.map(lambda job: self.chat(job[0], **{**overrides, **job[1]}), jobs))

    def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/chat/completions", body, chat_reply)

    def post(self, route: str, body: dict[str, Any], read: Callable[[requests.Response], Any],
             what: str = "judge") -> Any:
        """POST `body` to `base_url` + `route` with this client's timeout, retries and backoff; `read` takes the
        response and returns what the caller keeps, raising `JudgeHTTPError` for an error status (`reply_json`) and
        `JudgeResponseError` (retried) for a reply it cannot use. A 4xx other than 408/429 fails at once; `what`
        names the endpoint's role in the errors."""
        url, problem = self.base_url.rstrip("/") + route, ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._count("retries")
                time.sleep(self._backoff(attempt))
            try:
                with self._slots:
                    self._count("requests")
                    response = self._session().post(url, json=body, headers=self._headers(), timeout=self.timeout_s)
                return read(response)
            except requests.Timeout:
                problem = f"timed out after {self.timeout_s}s"
            except requests.ConnectionError as err:
                problem = f"connection failed ({type(err).__name__}); is the server running?"
            except JudgeHTTPError as err:
                if err.status < 500 and err.status not in RETRY_STATUS:
                    self._count("failures")
                    raise JudgeHTTPError(f"{what} {url}: {err}", err.status) from None
                problem = str(err)
            except JudgeResponseError as err:
                problem = str(err)
        self._count("failures")
        raise JudgeError(f"{what} {url} (model {self.model!r}) failed after {self.retries + 1} attempt(s): "
                         f"{problem}")

    def _count(self, what: str) -> None:
        with self._stats_lock:
            self.stats[what] += 1

    def _backoff(self, attempt: int) -> float:
        wait = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        return wait * random.uniform(1 - self.jitter, 1 + self.jitter)

    def _remember(self, key: str, reply: dict) -> None:
        self._cache[key] = reply
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_max_entries:
            self._cache.popitem(last=False)

    def _load_cache(self, path: Path) -> None:
        """Read a JSON-lines cache; a line cut short by a crash is skipped."""
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                self._remember(entry["key"], entry["reply"])
            except (ValueError, KeyError, TypeError):
                continue


def reply_json(response: requests.Response, expected: str) -> Any:
    """The JSON of a 200 reply; `JudgeHTTPError` for another status, `JudgeResponseError` (saying it is not
    `expected`) for a body that is not JSON."""
    if response.status_code != 200:
        raise JudgeHTTPError(f"HTTP {response.status_code}: {response.text[:200]}", response.status_code)
    try:
        return response.json()
    except ValueError:
        raise JudgeResponseError(f"not {expected}: {response.text[:200]!r}") from None


def chat_reply(response: requests.Response) -> dict[str, Any]:
    """The reply if it is a chat completion whose first choice holds text, else `JudgeResponseError`."""
    reply = reply_json(response, "a chat completion")
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeResponseError(f"not a chat completion: {response.text[:200]!r}") from None
    if not isinstance(content, str):
        raise JudgeResponseError(f"choice content is {type(content).__name__}, not text")
    return reply


# ---------------------------------------------------------------- reading judge replies

YES = {"yes", "y", "true", "1", "pass", "passed", "met", "satisfied", "present", "triggered"}
NO = {"no", "n", "false", "0", "fail", "failed", "unmet", "unsatisfied", "absent"}


def strip_reasoning(text: str) -> str:
    """Drop `<think>…</think>` blocks (and an unclosed leading one) and code-fence markers."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    text = re.sub(r"^.*?</think>", "", text, flags=re.DOTALL)
    return re.sub(r"```[a-zA-Z]*", "", text).strip()


def json_in(text: str) -> Any:
    """The first JSON object or array embedded in `text`, or None."""
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            try:
                return json.loads(text[start:end + 1])
            except ValueError:
                continue
    return None


def _word_verdict(word: str) -> int | None:
    word = word.lower().strip(" *.:'\"[]()")
    if word.startswith("not "):
        return 0
    return 1 if word in YES else 0 if word in NO else None


def parse_verdict(text: str) -> int:
    """A yes/no judgement: the value after 'verdict:'/'answer:' if present, else the last yes/no word."""
    clean = strip_reasoning(text)
    marked = re.findall(r"(?:verdict|answer|judg(?:e)?ment|result)\s*[:=]\s*\**\s*(not\s+\w+|[A-Za-z01]+)",
                        clean, re.I)
    for word in reversed(re.findall(r"\b[A-Za-z01]+\b", clean) + marked):
        verdict = _word_verdict(word)
        if verdict is not None:
            return verdict
    raise JudgeResponseError(f"no yes/no verdict in judge reply {text[:200]!r}")


def parse_verdicts(text: str, count: int) -> list[int]:
    """One yes/no per numbered criterion (1..count): a JSON object/list, or lines like '2: no'."""
    clean = strip_reasoning(text)
    found: dict[int, int] = {}
    data = json_in(clean)
    if isinstance(data, list) and len(data) == count:
        data = {str(i + 1): v for i, v in enumerate(data)}
    if isinstance(data, dict):
        for key, value in data.items():
            verdict = _word_verdict(str(value).lower())
            if str(key).strip().isdigit() and verdict is not None:
                found[int(key)] = verdict
    line = r"(?m)^\W*(?:criterion\s*)?(\d+)\s*[:.)\]=-]+.*?\b(yes|no|true|false|pass|fail|met|unmet)\b"
    for index, word in re.findall(line, clean, re.I):
        found.setdefault(int(index), _word_verdict(word))
    missing = [i for i in range(1, count + 1) if i not in found]
    if missing:
        raise JudgeResponseError(f"judge reply has no verdict for criteria {missing}: {text[:200]!r}")
    return [found[i] for i in range(1, count + 1)]


def parse_score(text: str, low: float, high: float) -> float:
    """A number in [low, high]: the last one after 'score'/'rating', else the last in range."""
    clean = strip_reasoning(text)
    number = r"(-?\d+(?:\.\d+)?)"
    marked = re.findall(rf"(?:score|rating)\s*(?:is)?\s*[:=]?\s*\**\s*{number}", clean, re.I)
    for value in reversed(re.findall(number, clean) + marked):
        if low <= float(value) <= high:
            return float(value)
    raise JudgeResponseError(f"no score in [{low}, {high}] in judge reply {text[:200]!r}")


LETTER_SCORE = re.compile(r"\b([A-Z])\s*[:=]\s*(-?\d+(?:\.\d+)?)")
RANKING_LINE = re.compile(r"^\W*ranking\s*[:=]\s*(.*?)\W*$", re.I)


def parse_letter_scores(text: str, letters: str, low: float = 0, high: float = 10,
                        exact: bool = False) -> dict[str, float]:
    """GRRM's score line: the last line holding 'A: 8, B: 3, …' for every letter.

    `exact`: the last line holding any 'X: n' must name each letter once and no other, with whole-number scores
    (a judge being trained cannot hedge with extra, repeated or missing candidates, nor with half points that
    round to either neighbouring margin)."""
    for line in reversed(strip_reasoning(text).splitlines()):
        found = LETTER_SCORE.findall(line)
        if exact and found:
            named = [c for c, _ in found]
            if sorted(named) != sorted(letters):
                raise JudgeResponseError(f"the score line names {named}, not each of {', '.join(letters)} once: "
                                         f"{line[:200]!r}")
        if exact and any(float(v) != int(float(v)) for _, v in found):
            raise JudgeResponseError(f"the score line holds a score that is not a whole number: {line[:200]!r}")
        pairs = dict(found)
        if all(c in pairs for c in letters):
            scores = {c: float(pairs[c]) for c in letters}
            if all(low <= v <= high for v in scores.values()):
                return scores
        if exact and found:
            break
    raise JudgeResponseError(f"no score line for {', '.join(letters)} in judge reply {text[:200]!r}")


def parse_ranking(text: str, letters: str) -> str:
    """GRRM's ranking line: the last 'Ranking: A > C = B', naming each letter once and no other."""
    for line in reversed(strip_reasoning(text).splitlines()):
        marked = RANKING_LINE.match(line)
        if marked is None:
            continue
        order = re.sub(r"\s+", " ", marked.group(1)).strip()
        named = re.findall(r"[A-Za-z]+", order)
        if not re.fullmatch(r"[A-Z](?: ?[>=] ?[A-Z])*", order) or sorted(named) != sorted(letters):
            raise JudgeResponseError(f"the ranking line must order each of {', '.join(letters)} once with > and =: "
                                     f"{line[:200]!r}")
        return order
    raise JudgeResponseError(f"no 'Ranking:' line in judge reply {text[:200]!r}")


def parse_winner(text: str) -> str:
    """'A' or 'B' from a pairwise judgement ('Winner: A', '[[B]]', or a last line naming one)."""
    clean = strip_reasoning(text)
    marked = re.findall(r"(?:winner|better|answer|verdict)\s*(?:is)?\s*[:=]?\s*\**\s*(?:response\s*)?\[*([AB])\b",
                        clean, re.I) + re.findall(r"\[\[([AB])\]\]", clean)
    if marked:
        return marked[-1].upper()
    last = clean.splitlines()[-1] if clean else ""
    letters = re.findall(r"\b([AB])\b", last)
    if len(set(letters)) == 1:
        return letters[0]
    raise JudgeResponseError(f"no winner (A or B) in judge reply {text[:200]!r}")
