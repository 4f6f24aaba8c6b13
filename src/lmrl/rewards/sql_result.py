"""`sql_result`: 1 when the model's SQL query returns the gold query's result set, over a SQLite database.

A row carries `gold_query` and the database: `schema` (a SQL script that creates and fills it) or
`database`, the path of such a script (`.sql`) or of a SQLite file (read-only, dumped to a script);
a relative path that is not here is looked up among the shipped recipe data. The
model's query is the reply's last fenced code block (else the whole reply), one statement.

Where the verdict is formed. The model's SQL is hostile (ATTACH, load_extension, PRAGMA, writes,
endless recursive CTEs):
- it runs in the sandbox (`run_python`: a private root without the host's files, no network, rlimits,
  the audit hook), against a fresh in-memory database built there from the row's script. There an authorizer allows reading
  only: SELECT, reads of columns, functions and recursive CTEs; anything else (ATTACH, PRAGMA, any
  write, DDL, transactions) stops the query. Extensions are never enabled. The sandbox prints the
  result set as JSON (at most `max_rows` rows) and nothing else the query can reach prints there.
- the gold query is never sent there: the parent runs it itself on its own in-memory copy of the
  database and compares. Rows compare as multisets (duplicates count) unless the gold query has an
  ORDER BY, then as sequences; the column count must match, names do not matter; values by
  type-normalised equality: booleans and integral floats as integers, other floats rounded to 9
  significant digits, text and blobs exactly, NULL as NULL.
Score 0 (a verdict in info["sql_result"], not an error): more than one statement, a refused action,
a query error, a timeout, too many rows, a different result. A row without `gold_query` or a
database, or a gold query that fails, raises (the sample is excluded: a configuration problem).
Threat model: docs/rewards/sql_result.md.
"""
from __future__ import annotations

import json
import math
import re
import sqlite3
from collections import Counter

from lmrl.recipe_files import shipped_or_local
from lmrl.rewards.functions import REWARD_FNS
from lmrl.rewards.program_tests import extract_program
from lmrl.rewards.sandbox import run_python
from lmrl.types import Sample

ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)

RUNNER = r'''
import json, sqlite3
SCHEMA, QUERY, MAX_ROWS = json.loads(__PAYLOAD__)
ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
refused = []
def authorize(action, arg1, arg2, db, trigger):
    if action in ALLOWED:
        return sqlite3.SQLITE_OK
    refused.append(action)
    return sqlite3.SQLITE_DENY
def plain(value):
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    if isinstance(value, float) and value != value:
        return {"float": "nan"}
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return {"float": str(value)}
    return value
connection = sqlite3.connect(":memory:", isolation_level=None)
connection.executescript(SCHEMA)
changes = connection.total_changes
connection.set_authorizer(authorize)
answer = {}
try:
    cursor = connection.execute(QUERY)
    rows = cursor.fetchmany(MAX_ROWS + 1)
    answer = {"status": "ok", "width": len(cursor.description or ()), "truncated": len(rows) > MAX_ROWS,
              "rows": [[plain(v) for v in row] for row in rows[:MAX_ROWS]], "changes": connection.total_changes - changes}
except sqlite3.Error as err:
    answer = {"status": "refused" if refused else "query_error", "error": str(err)}
if refused:
    answer = {"status": "refused", "error": f"actions {sorted(set(refused))} are not allowed"}
print("\n" + json.dumps(answer))
'''


def _script(row: dict) -> str:
    if row.get("schema"):
        return str(row["schema"])
    path = shipped_or_local(str(row["database"]))
    if not path.is_file():
        raise ValueError(f"sql_result: the row's database {row['database']!r} is not a file")
    if path.suffix == ".sql":
        return path.read_text(encoding="utf-8")
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "\n".join(source.iterdump())
    finally:
        source.close()


def normalise(value):
    """A value as compared: booleans and integral floats as int, other floats to 9 significant digits,
    blobs and non-finite floats tagged (so that no text equals them)."""
    if isinstance(value, dict):  # the sandbox's encoding of blobs and non-finite floats
        value = bytes.fromhex(value["blob"]) if "blob" in value else float(value["float"])
    if isinstance(value, bytes):
        return ("blob", value.hex())
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ("float", str(value))
        return int(value) if value.is_integer() else float(f"{value:.9g}")
    return value


def gold_result(script: str, gold_query: str) -> tuple[int, list[tuple]]:
    """(column count, rows) of the trusted gold query on a fresh in-memory copy."""
    connection = sqlite3.connect(":memory:")
    try:
        connection.executescript(script)
        cursor = connection.execute(gold_query)
        return len(cursor.description or ()), [tuple(normalise(v) for v in row) for row in cursor.fetchall()]
    except sqlite3.Error as err:
        raise ValueError(f"sql_result: the row's gold query or database fails ({err})") from None
    finally:
        connection.close()


def single_statement(query: str) -> str | None:
    """The query without its trailing semicolons, or None when it holds more than one statement."""
    text = query.strip().rstrip(";").strip()
    for end in range(len(text)):
        if text[end] == ";" and sqlite3.complete_statement(text[: end + 1]) and text[end + 1:].strip(" \t\n;"):
            return None
    return text


def results_match(width: int, rows: list[tuple], gold_width: int, gold_rows: list[tuple], ordered: bool) -> bool:
    if width != gold_width:
        return False
    return rows == gold_rows if ordered else Counter(rows) == Counter(gold_rows)


def grade(query: str, script: str, gold_query: str, timeout_s: float = 5.0, memory_mb: int = 256,
          max_rows: int = 10_000, max_output_bytes: int = 8_000_000) -> dict:
    """{"status", "correct", ...}: run `query` in the sandbox and compare with the gold query run here."""
    gold_width, gold_rows = gold_result(script, gold_query)
    statement = single_statement(query)
    if not statement:
        return {"status": "multiple_statements" if statement is None else "empty", "correct": False}
    payload = json.dumps([script, statement, max_rows])
    result = run_python(RUNNER.replace("__PAYLOAD__", repr(payload)), timeout_s=timeout_s, memory_mb=memory_mb,
                        max_output_bytes=max_output_bytes)
    if result.status != "ok":
        return {"status": result.status, "reason": result.reason, "correct": False}
    try:
        answer = json.loads(result.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    except (json.JSONDecodeError, IndexError):
        return {"status": "no_result", "correct": False}
    if answer.get("status") != "ok":
        return {"status": answer.get("status", "no_result"), "error": str(answer.get("error", ""))[:300],
                "correct": False}
    if answer["truncated"] or answer["changes"]:
        return {"status": "too_many_rows" if answer["truncated"] else "modified", "correct": False}
    rows = [tuple(normalise(v) for v in row) for row in answer["rows"]]
    ordered = ORDER_BY.search(gold_query) is not None
    correct = results_match(answer["width"], rows, gold_width, gold_rows, ordered)
    return {"status": "ok", "correct": correct, "rows": len(rows), "gold_rows": len(gold_rows), "ordered": ordered}


@REWARD_FNS.register("sql_result", "1 if the reply's SQL query returns the gold query's result set (run in the sandbox)")
def sql_result_reward(sample: Sample, timeout_s: float = 5.0, memory_mb: int = 256, max_rows: int = 10_000,
                      max_output_bytes: int = 8_000_000, **_) -> float:
    row = sample.row
    if not row.get("gold_query") or not (row.get("schema") or row.get("database")):
        raise ValueError("sql_result needs rows with `gold_query` and `schema` (a SQL script) or `database` "
                         "(a .sqlite path), e.g. recipe sql")
    report = grade(extract_program(sample.text), _script(row), str(row["gold_query"]), timeout_s, memory_mb, max_rows,
                   max_output_bytes)
    sample.info["sql_result"] = report
    return float(report["correct"])
