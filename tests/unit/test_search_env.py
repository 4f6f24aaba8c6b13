"""The search environment: BM25 over the shipped fictional atlas, the tool loop, the reward, the QA task,
and the corpus generator."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lmrl.envs.search  # noqa: F401  (registers the search environment and the search_qa task)
from lmrl.config import TaskConfig
from lmrl.envs import ENVIRONMENTS, TASKS
from lmrl.envs.search import CORPUS_DIR, SearchEnv, as_words, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
QA = read_jsonl("fictional_atlas", "_qa")


def call(query: str) -> str:
    return f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'


@pytest.fixture(scope="module")
def env():
    return SearchEnv()


def test_search_and_search_qa_are_registered():
    assert "search" in ENVIRONMENTS.names() and "search_qa" in TASKS.names()


def test_bm25_finds_the_passage_each_question_names(env):
    ids = [p["id"] for p in env.passages]

    def recall(rows, k, which=0):
        found = [r["support"][which] in [ids[i] for i in env.index.search(r["question"], k)] for r in rows]
        return sum(found) / len(rows)

    two_hop = [r for r in QA if r["hops"] == 2]
    # measured: 1.00 (recall@1, single-hop), 1.00 (recall@3, all), 0.02 (second hop from the question alone)
    assert recall([r for r in QA if r["hops"] == 1], 1) >= 0.95
    assert recall(QA, 3) >= 0.95
    assert recall(two_hop, 3, which=1) <= 0.2  # a two-hop question needs a second search
    assert env.index.search("the of and", 3) == [] and env.index.search("zzzqqq", 3) == []


def test_a_search_call_is_answered_with_passages_and_the_format_reward(env):
    row = next(r for r in QA if r["hops"] == 1)
    messages, state = env.reset(row, seed=0)
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == row["question"]
    assert "<tool_call>" in messages[0]["content"] and env.tools[0]["function"]["name"] == "search"
    step = env.step(f"Let me look it up. {call(row['question'])}", state)
    assert not step.done and step.reward == 0.0 and state["credit"] == 0.1  # paid with the final answer
    assert [m["role"] for m in step.observation] == ["tool"]
    supporting = next(p for p in env.passages if p["id"] == row["support"][0])
    found = step.observation[0]["content"]
    assert found.startswith("[1] ") and supporting["text"] in found and found.count("\n") == 2  # top 3
    assert step.info["search_turns"] == [True] and state["queries"] == [row["question"]]
    assert step.info["metrics"] == {"env/searches": 1.0, "env/search_errors": 0.0, "env/answered": 0.0,
                                    "env/exact_match": 0.0, "env/f1": 0.0, "env/gold_retrieved": 1.0,
                                    "env/support_recall": 1.0}


@pytest.mark.parametrize("mode, wrong_reward", [("exact", 0.0), ("f1", 0.5)])
def test_the_final_answer_is_paid_by_normalised_match(mode, wrong_reward):
    env = SearchEnv(answer_reward=mode)
    row = {"question": "Who invented the Vemar loom?", "answer": "Tika Sorrow"}
    _, state = env.reset(row, seed=0)
    done = env.step("I found it.\nAnswer: the tika SORROW.", state)
    assert done.done and done.observation is None and done.reward == 1.0
    assert done.info["metrics"]["env/exact_match"] == 1.0 and done.info["metrics"]["env/answered"] == 1.0
    assert done.info["search_turns"] == [False] and "env/support_recall" not in done.info["metrics"]
    _, state = env.reset(row, seed=0)
    wrong = env.step("Answer: Tika Marrow", state)
    assert wrong.done and wrong.reward == pytest.approx(wrong_reward) and wrong.info["metrics"]["env/exact_match"] == 0
    _, state = env.reset(row, seed=0)
    silent = env.step("It was Tika Sorrow.", state)  # no 'Answer:' marker: not an answer
    assert silent.done and silent.reward == 0.0 and silent.info["metrics"]["env/answered"] == 0.0


def test_malformed_calls_get_an_error_observation_and_the_format_penalty(env):
    _, state = env.reset(QA[0], seed=0)
    cases = [("<tool_call>{oops}</tool_call>", "error: the call is not valid JSON"),
             ('<tool_call>{"name": "browse", "arguments": {"query": "x"}}</tool_call>', "error: unknown tool"),
             ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "error: search takes"),
             ("<tool_call>never closed", "error: ")]
    for reply, error in cases:
        step = env.step(reply, state)
        assert not step.done and step.reward == -0.1 and step.observation[0]["content"].startswith(error)
    step = env.step(call(QA[0]["question"]) * 3, state)  # over max_calls_per_turn: the first two are answered
    assert step.reward == -0.1 and len(step.observation) == 2 and step.observation[0]["content"].startswith("[1]")
    assert step.info["metrics"]["env/search_errors"] == 4.0 and step.info["metrics"]["env/searches"] == 2.0
    assert step.info["search_turns"] == [True] * 5


def test_a_two_hop_episode_records_its_searches_and_retrievals(env):
    row = next(r for r in QA if r["hops"] == 2)
    bridge = next(p for p in env.passages if p["id"] == row["support"][1])["title"]
    _, state = env.reset(row, seed=0)
    first = env.step(call(row["question"]), state)
    assert first.info["metrics"]["env/support_recall"] == 0.5 and first.info["metrics"]["env/gold_retrieved"] == 0.0
    second = env.step(call(bridge), state)
    assert bridge in second.observation[0]["content"]
    assert second.info["metrics"]["env/support_recall"] == 1.0 and second.info["metrics"]["env/gold_retrieved"] == 1.0
    last = env.step(f"Answer: {row['answer']}", state)
    assert last.done and last.reward == pytest.approx(1.1)  # the answer, and the format credit once (two searches)
    assert last.info["search_turns"] == [True, True, False]
    assert last.info["metrics"]["env/searches"] == 2.0 and set(row["support"]) <= set(state["retrieved"])


def test_search_qa_splits_the_questions_deterministically():
    cfg = TaskConfig(name="search_qa", num_train=100, num_eval=20)
    data, again = TASKS.get("search_qa")(cfg), TASKS.get("search_qa")(cfg)
    assert len(data.train) == 100 and len(data.eval) == 20 and data.train == again.train
    assert not {r["uid"] for r in data.train} & {r["uid"] for r in data.eval}
    assert all(r["question"] and r["answer"] and r["support"] for r in data.train + data.eval)
    with pytest.raises(ValueError, match="no corpus file"):
        TASKS.get("search_qa")(TaskConfig(name="search_qa", params={"qa": "missing"}))


def test_a_custom_corpus_is_a_jsonl_path_and_is_checked(tmp_path):
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text('{"id": "n1", "text": "The kettle is in the attic."}\n{"id": "n2", "text": "Tea is green."}\n')
    env = SearchEnv(corpus=str(corpus), top_k=5)
    _, state = env.reset({"question": "Where is the kettle?", "answer": "attic"}, seed=0)
    step = env.step(call("kettle"), state)
    assert step.observation[0]["content"] == "[1] The kettle is in the attic."
    assert step.info["metrics"]["env/gold_retrieved"] == 1.0
    corpus.write_text('{"text": "no id"}\n')
    with pytest.raises(ValueError, match=r"record 0 .* needs the fields \['id', 'text'\]"):
        SearchEnv(corpus=str(corpus))


def test_the_shipped_corpus_is_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_search_corpus.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for name in ("fictional_atlas.jsonl", "fictional_atlas_qa.jsonl"):
        assert (tmp_path / name).read_bytes() == (CORPUS_DIR / name).read_bytes(), name
    assert sum((CORPUS_DIR / n).stat().st_size for n in ("fictional_atlas.jsonl", "fictional_atlas_qa.jsonl")) < 300_000


def test_every_answer_is_stated_in_its_supporting_passage_and_questions_are_unique(env):
    text = {p["id"]: as_words(p["text"]) for p in env.passages}
    assert 300 <= len(env.passages) <= 600 and len({p["id"] for p in env.passages}) == len(env.passages)
    assert len({r["question"] for r in QA}) == len(QA)
    assert all(as_words(r["answer"]) in text[r["support"][-1]] for r in QA)
    assert {r["hops"] for r in QA} == {1, 2}
