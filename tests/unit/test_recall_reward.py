"""recall_exact (closed-book recall): SQuAD-normalised match against any alias behind a no-reasoning format gate,
and the closed_book task's fact-level deduplication of held-out facts."""
import pytest

from lmrl.config import TaskConfig
from lmrl.envs.tasks import load_task
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.recall import hit_split, normalise, overlapping_facts
from lmrl.types import Sample

recall_exact = REWARD_FNS.get("recall_exact")
EIFFEL = {"answer": "Eiffel Tower", "aliases": ["eiffel tower", "La tour Eiffel"]}
PARIS = {"answer": "Paris", "aliases": []}


def score(text, row=EIFFEL, tokens=None, **params):
    ids = list(range(tokens if tokens is not None else max(len(text.split()), 1)))
    return recall_exact(Sample(prompt_ids=[1], completion_ids=ids, behaviour_logprobs=[0.0] * len(ids), text=text,
                               row=row), **params)


def test_the_specs_cases():
    assert score("The Eiffel Tower.") == 1.0  # "eiffel tower" after normalisation
    assert score("Tower of Eiffel") == 0.0
    reasoned = ("The answer is the Eiffel Tower because it was built for the 1889 World's Fair in Paris and it is "
                "the most famous iron lattice tower in the whole of France, visited by millions every year.")
    assert len(reasoned.split()) > 30 and score(reasoned) == 0.0


def test_squad_normalisation_and_aliases():
    assert normalise("  The  EIFFEL-tower!! ") == "eiffeltower"  # punctuation removed, not spaced
    assert normalise("An apple, a pear") == "apple pear"
    assert score("la Tour Eiffel") == 1.0 and score("Answer: Eiffel Tower") == 1.0
    assert score("Washington", row={"answer": "Washington, D.C.", "aliases": ["Washington"]}) == 1.0
    assert score("Washington DC", row={"answer": "Washington, D.C.", "aliases": "Washington"}) == 1.0


@pytest.mark.parametrize("text", [
    "Paris, London or Rome",  # several candidates
    "Paris or London",
    "Paris London",
    "Paris? Maybe Lyon.",
    "Not Paris",
])
def test_several_candidates_or_hedges_do_not_score(text):
    assert score(text, row=PARIS) == 0.0


def test_the_format_gate():
    assert score("Paris", row=PARIS, tokens=16) == 1.0
    assert score("Paris", row=PARIS, tokens=17) == 0.0  # 17 generated tokens: over the gate
    assert score("Paris", row=PARIS, tokens=3, max_tokens=2) == 0.0
    for text in ["Paris because it is the capital", "<think>capital of France</think> Paris", "Let's see: Paris",
                 "I think Paris", "France's capital\nParis", "Step 1: Paris"]:
        assert score(text, row=PARIS) == 0.0, text
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text="Paris since", row=PARIS)
    assert recall_exact(s) == 0.0 and s.info["recall_gate"] == "reasoning"
    long = "I recall many facts about Europe and its cities and rivers and mountains and the answer is Paris"
    assert score(long, row=PARIS, tokens=3) == 0.0  # the answer hidden after long text: words count too
    with pytest.raises(ValueError, match="no gold answer"):
        score("Paris", row={"answer": "  ", "aliases": []})


def test_fact_level_deduplication():
    train = [{"subject": "France", "relation": "capital", "answer": "Paris"},
             {"subject": "gold", "relation": "symbol", "answer": "Au"}]
    held = [{"subject": "France", "relation": "Capital", "answer": "Paris, France"},  # same (subject, relation)
            {"subject": "Paris", "relation": "capital of", "answer": "France"},  # the reverse question
            {"subject": "Au", "relation": "element", "answer": "Gold"},  # subject and answer of a trained fact
            {"subject": "Japan", "relation": "capital", "answer": "Tokyo"},
            {"subject": "France", "relation": "currency", "answer": "euro"}]  # same subject, new fact: kept
    kept, removed = overlapping_facts(train, held)
    assert [r["subject"] for r in kept] == ["Japan", "France"] and len(removed) == 3


def test_the_shipped_task_holds_out_no_fact_seen_in_training():
    data = load_task(TaskConfig(name="closed_book", dataset="recall_facts.jsonl", num_eval=40))
    # 171 facts: 40 drawn, 3 of them a paraphrase or reverse of a training fact (the summary says so)
    assert (len(data.train), len(data.eval)) == (131, 37)
    assert "removed 3 of the 40 drawn" in data.held_out_from
    assert overlapping_facts(data.train, data.eval)[1] == []
    for row in data.train + data.eval:  # every gold answer, written as the reply, scores 1; a wrong one 0
        assert score(row["answer"], row=row) == 1.0, row
        assert score("Atlantis", row=row) == 0.0


def test_hit_count_split():
    assert [hit_split(h) for h in (0, 1, 16, 17, 128)] == ["h=0", "1-16", "1-16", ">16", ">16"]
    with pytest.raises(ValueError):
        hit_split(129)


def test_a_facts_hit_count_row():
    from lmrl.data.hit_counts import hit_row
    from lmrl.types import Group

    row = {"uid": "f1", "question": "What is the capital of France?", "answer": "Paris", "aliases": [],
           "prompt_ids": [1, 2, 3]}
    replies = ["Paris", "Lyon", "paris.", "Paris because it is", "Marseille"]
    samples = [Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=t, row=row) for t in replies]
    for s in samples:
        s.rewards["recall_exact"] = recall_exact(s)
    written = hit_row(Group(uid="f1", row=row, samples=samples), "recall_exact")
    # 2 of the 5 are correct ("Paris", "paris."): h = 2, the tail split; the encoded prompt is left out
    assert (written["hits"], written["samples"], written["hit_split"]) == (2, 5, "1-16")
    assert "prompt_ids" not in written and written["answer"] == "Paris"
