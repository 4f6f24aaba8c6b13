"""The shipped tasks of `program_tests` and `sql_result` are gradable: each row's reference solution scores 1
(in C and in JavaScript), an empty reply 0, and each SQL question's gold query is right and not trivial."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from lmrl.envs.tasks import load_task
from lmrl.recipe_files import SHIPPED_DATA
from lmrl.loading import load_recipe
from lmrl.rewards import REWARD_FNS
from lmrl.types import Sample

PROGRAM_ROWS = [json.loads(line) for line in (SHIPPED_DATA / "stdio_problems.jsonl").read_text().splitlines()]
SQL_ROWS = [json.loads(line) for line in (SHIPPED_DATA / "sql_shop.jsonl").read_text().splitlines()]


def sample(text: str, row: dict) -> Sample:
    return Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text=text, row=row)


def scores(reward: str, replies: list[tuple[str, dict]], **params) -> list[float]:
    """The reward of each (reply, row), four sandboxes at a time (each mostly waits on its own start)."""
    fn = REWARD_FNS.get(reward)
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda pair: fn(sample(*pair), **params), replies))


def test_the_shipped_tasks_have_twenty_rows_each():
    assert len(PROGRAM_ROWS) == 20 and len(SQL_ROWS) == 20
    assert all(len(row["tests"]) == 3 for row in PROGRAM_ROWS)


@pytest.mark.parametrize("language", ["c", "javascript"])
def test_every_reference_solution_passes_its_tests(language):
    replies = [(f"```\n{row[f'solution_{language}']}```", row) for row in PROGRAM_ROWS]
    assert scores("program_tests", replies, language=language) == [1.0] * len(PROGRAM_ROWS)


def test_every_gold_query_scores_one_and_a_select_of_everything_zero():
    assert scores("sql_result", [(f"```sql\n{row['gold_query']};\n```", row) for row in SQL_ROWS]) == [1.0] * 20
    assert scores("sql_result", [("```sql\nSELECT * FROM orders\n```", row) for row in SQL_ROWS]) == [0.0] * 20


@pytest.mark.parametrize("recipe,reward,fields", [("code_c", "program_tests", ("language", "tests")),
                                                  ("sql", "sql_result", ("gold_query", "database"))])
def test_each_recipe_loads_its_shipped_task_by_name(recipe, reward, fields):
    cfg = load_recipe(recipe)
    data = load_task(cfg.task)
    assert (len(data.train), len(data.eval)) == (16, 4)
    assert all(all(row.get(f) for f in fields) for row in data.train + data.eval)
    assert [c.name for c in cfg.reward.components] == [reward] and cfg.reward.accuracy_component == reward
