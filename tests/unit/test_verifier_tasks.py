"""The shipped tasks of the structured-output, constraint, finance, translation and retrieval rewards: every
row's gold answer (for retrieval, the titles of its relevant passages as the query), written as a reply, scores
1 with its recipe's reward, and a wrong one scores 0."""
import json
import re

import pytest

from lmrl.recipe_files import shipped_or_local
from lmrl.loading import load_recipe
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.retrieval import load_passages
from lmrl.types import Sample

TITLES = {p["id"]: p["title"] for p in load_passages("fictional_atlas")}


def recipe_reward_and_rows(recipe):
    """The recipe's reward component, built with its params, and the rows of its shipped dataset."""
    cfg = load_recipe(recipe, [])
    component = cfg.reward.components[0]
    reward = REWARD_FNS.get(component.name)
    reward = reward(**component.params) if isinstance(reward, type) else reward
    with shipped_or_local(cfg.task.dataset).open() as f:
        return reward, [json.loads(line) for line in f]


def reply(recipe, row, wrong=False):
    """The row's gold answer as a reply; `wrong`: each integer one higher (smt), the amount one higher
    (finance), the source copied back (translation), a doc id (retrieval), another tool name and every argument
    a wrong string (json)."""
    if recipe == "finance":
        sign = "%" if row["answer_format"] == "percent" else ""
        return f"Answer: {float(row['answer']) + wrong:.{row['decimals']}f}{sign}"
    if recipe == "retrieval":
        return "Query: atlas-0000" if wrong else "Query: " + " ".join(TITLES[i] for i in row["support"])
    if recipe == "translation":
        return row["source"] if wrong else row["reference"]
    if recipe == "smt_check":
        return "Answer: " + re.sub(r"-?\d+", lambda m: str(int(m.group(0)) + wrong), row["answer"])
    call = json.loads(row["answer"])
    if wrong:
        call = {"name": call["name"] + "s", "arguments": {k: "?" for k in call["arguments"]}}
    return f"```json\n{json.dumps(call)}\n```"


@pytest.mark.parametrize("recipe", ["json_schema", "smt_check", "finance", "translation", "retrieval"])
def test_every_gold_answer_scores_one_and_a_wrong_one_zero(recipe):
    reward, records = recipe_reward_and_rows(recipe)
    assert 10 <= len(records) <= 30
    for row in records:
        def score(text):
            return reward(Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row))
        assert score(reply(recipe, row)) == 1.0, row
        assert score(reply(recipe, row, wrong=True)) == 0.0, row
