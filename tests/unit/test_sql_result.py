"""`sql_result`: right queries score 1; hostile or wrong ones score 0 with their verdict.

The database: three people, one of them twice in `visits`. The gold query lists who visited Paris.
"""
import sqlite3

import pytest

from lmrl.rewards import REWARD_FNS, sql_result
from lmrl.rewards.sql_result import grade, normalise, single_statement
from lmrl.types import Sample

SCHEMA = """
CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, height REAL);
CREATE TABLE visits (person INTEGER, city TEXT);
INSERT INTO people VALUES (1, 'ann', 30, 1.70), (2, 'bob', 25, 1.80), (3, 'cyd', 41, 1.65);
INSERT INTO visits VALUES (1, 'Paris'), (2, 'Rome'), (3, 'Paris'), (1, 'Paris');
"""
GOLD = "SELECT DISTINCT p.name FROM people p JOIN visits v ON v.person = p.id WHERE v.city = 'Paris'"


def score(query: str, gold: str = GOLD, **row) -> tuple[float, dict]:
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=f"```sql\n{query}\n```",
               row={"gold_query": gold, "schema": SCHEMA, **row})
    return REWARD_FNS.get("sql_result")(s, timeout_s=3.0), s.info["sql_result"]


@pytest.mark.parametrize("query", [
    GOLD,
    "select name from people where id in (select person from visits where city = 'Paris');",  # another form, ;
    "SELECT name FROM people WHERE id IN (3, 1) ORDER BY name DESC",  # order is free: the gold has no ORDER BY
])
def test_a_right_query_scores_one(query):
    assert score(query)[0] == 1.0


@pytest.mark.parametrize("query,status", [
    ("SELECT p.name FROM people p JOIN visits v ON v.person = p.id WHERE v.city = 'Paris'", "ok"),  # + a duplicate
    ("SELECT name FROM people WHERE id IN (1, 2)", "ok"),  # the right row count, a wrong value
    ("SELECT name, age FROM people WHERE id IN (1, 3)", "ok"),  # an extra column
    ("SELECT upper(name) FROM people WHERE id IN (1, 3)", "ok"),  # values must be equal, not alike
    ("SELECT name FROM people; DROP TABLE visits", "multiple_statements"),
    ("SELECT 1; SELECT name FROM people WHERE id IN (1, 3)", "multiple_statements"),
    ("DROP TABLE visits", "refused"),
    ("DELETE FROM people WHERE id = 2 RETURNING name", "refused"),  # a write that returns rows
    ("UPDATE people SET name = name RETURNING name", "refused"),
    ("ATTACH DATABASE '/tmp/other.db' AS other", "refused"),
    ("PRAGMA table_info(people)", "refused"),
    ("SELECT load_extension('/usr/lib/x86_64-linux-gnu/libsqlite3.so.0')", "query_error"),
    ("SELECT name FROM no_such_table", "query_error"),
    ("", "empty"),
])
def test_a_wrong_or_hostile_query_scores_zero_with_its_verdict(query, status):
    reward, info = score(query)
    assert reward == 0.0 and info["status"] == status


def test_an_endless_recursive_query_is_stopped():
    reward, info = score("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT name FROM people, n")
    assert reward == 0.0 and info["status"] in ("timeout", "query_error", "memory", "killed")


def test_order_counts_when_the_gold_query_orders():
    gold = "SELECT name FROM people ORDER BY age"
    assert score("SELECT name FROM people ORDER BY age", gold)[0] == 1.0
    assert score("SELECT name FROM people ORDER BY name", gold)[0] == 0.0  # ann, bob, cyd vs bob, ann, cyd


def test_values_compare_by_type_normalised_equality():
    assert normalise(2.0) == 2 and normalise(True) == 1
    assert normalise(1.0000000001) == normalise(1.0) == 1  # 9 significant digits
    assert normalise(0.1 + 0.2) == normalise(0.3)
    assert normalise(b"\x01") == ("blob", "01") != normalise("01")
    assert score("SELECT 3.0 * 10", "SELECT 30")[0] == 1.0
    assert score("SELECT '30'", "SELECT 30")[0] == 0.0  # text is not a number


def test_the_gold_query_never_enters_the_sandbox(monkeypatch):
    sent = []
    real = sql_result.run_python

    def spy(code, **kw):
        sent.append(code)
        return real(code, **kw)

    monkeypatch.setattr(sql_result, "run_python", spy)
    assert grade("SELECT 1", SCHEMA, GOLD)["correct"] is False
    assert sent and GOLD not in sent[0] and "DISTINCT p.name" not in sent[0]


def test_a_query_runs_on_a_fresh_copy_each_time():
    # the database is built anew for every query: a query sees the data as shipped, whatever ran before
    assert score("DELETE FROM visits")[1]["status"] == "refused"
    assert score("SELECT count(*) FROM visits", "SELECT 4")[0] == 1.0


def test_single_statement_splits_on_complete_statements_only():
    assert single_statement("SELECT ';' ;; ") == "SELECT ';'"
    assert single_statement("SELECT 1; SELECT 2") is None
    assert single_statement("SELECT 1 -- ; no\n") == "SELECT 1 -- ; no"


def test_a_database_file_is_read_and_a_bad_gold_or_row_raises(tmp_path):
    path = tmp_path / "shop.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.commit()
    db.close()
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=GOLD,
               row={"gold_query": GOLD, "database": str(path)})
    assert REWARD_FNS.get("sql_result")(s) == 1.0
    with pytest.raises(ValueError, match="gold query or database fails"):
        score(GOLD, gold="SELECT nope FROM people")
    s.row = {"gold_query": GOLD}
    with pytest.raises(ValueError, match="needs rows with `gold_query`"):
        REWARD_FNS.get("sql_result")(s)


def test_more_rows_than_fetched_or_more_output_than_allowed_scores_zero():
    everyone = "SELECT name FROM people"
    assert grade(everyone, SCHEMA, everyone, max_rows=3)["correct"] is True
    assert grade(everyone, SCHEMA, everyone, max_rows=2)["status"] == "too_many_rows"
    big = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) SELECT i FROM n"
    report = grade(big, SCHEMA, big, max_output_bytes=10_000)
    assert report["status"] == "killed" and report["correct"] is False
