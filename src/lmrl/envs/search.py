"""Search: the policy queries a BM25 index over a local corpus with a search tool, then answers.

The tool call follows the `tool_use` convention (lmrl/envs/tools.py, whose parser it reuses):

    <tool_call>{"name": "search", "arguments": {"query": "capital of Niard"}}</tool_call>

Each call is answered by one `tool` message with the `top_k` best passages (`BM25Index`, shared with
the `retrieval` reward, built once per environment). A reply without a `<tool_call>` tag is the final answer and ends the
episode; its text after the last 'Answer:' is graded against the row's gold answer after SQuAD-style
normalisation (lowercase, no punctuation or articles): exact match pays 1 (or the token F1 with
`answer_reward="f1"`). Search turns earn the `tool_use` format reward (`tools.format_credit`):
−`format_reward` at once for a turn with a malformed call (which gets an error observation),
+`format_reward` once for an episode with a well-formed turn, paid with the final answer, so an episode cut off before it
answers keeps only the penalties.

The shipped corpus, `fictional_atlas`, describes invented countries, cities, rivers, people and
inventions (scripts/make_search_corpus.py), so the answers cannot come from the model's memory; task
`search_qa` serves its questions. Every Step's info carries `search_turns` (per policy turn so far:
was it a search turn), so the last one describes the whole episode.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmrl.config import TaskConfig
from lmrl.envs.environment import ENVIRONMENTS, Step
from lmrl.envs.single_turn import prompt_messages
from lmrl.envs.tasks import TASKS, TaskData, TaskError, split_rows
from lmrl.envs.tools import CALL, ToolError, format_credit, parse_call
from lmrl.rewards.functions import extract_answer
from lmrl.rewards.judge_scoring import normalise_answer, token_f1
from lmrl.rewards.retrieval import CORPUS_DIR, BM25Index

SYSTEM_PROMPT = ("Answer the question about an atlas of places and people you do not know: search it first. "
                 "To search, write <tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"...\"}}"
                 "</tool_call> and wait for the passages. When you know the answer, reply without a tool call "
                 "and end with 'Answer: <short answer>'.")
SCHEMAS = {"search": {"type": "function", "function": {
    "name": "search", "description": "Search the atlas; returns the best-matching passages.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}}


def read_jsonl(name: str, suffix: str = "", needs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of a shipped corpus file (`CORPUS_DIR/<name><suffix>.jsonl`) or of a `.jsonl` path; each
    must have the fields `needs`."""
    path = Path(name) if name.endswith(".jsonl") else CORPUS_DIR / f"{name}{suffix}.jsonl"
    if not path.is_file():
        shipped = sorted(p.stem for p in CORPUS_DIR.glob("*.jsonl") if not p.stem.endswith("_qa"))
        raise TaskError(f"search: no corpus file {path} (shipped corpora: {', '.join(shipped)}; or a .jsonl path)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, record in enumerate(records):
        if not isinstance(record, dict) or any(record.get(f) is None for f in needs):
            raise TaskError(f"search: record {i} of {path} needs the fields {list(needs)}")
    return records


def as_words(text: str) -> str:
    """The normalised text as ' w1 w2 … ', so that containment is a whole-word match."""
    return " " + " ".join(normalise_answer(text)) + " "


@TASKS.register("search_qa", "questions over a search corpus (env.name: search); task.params.qa: a shipped "
                              "corpus name (fictional_atlas) or a .jsonl of {question, answer, support}",
                splits_rows=True)
def search_qa_task(cfg: TaskConfig) -> TaskData:
    """The corpus's questions with their gold answers and supporting passage ids, split after a seeded shuffle."""
    name = cfg.params.get("qa", "fictional_atlas")
    rows = [{**r, "uid": str(r.get("uid", i)), "answer": str(r["answer"])}
            for i, r in enumerate(read_jsonl(name, "_qa", needs=("question", "answer")))]
    return split_rows(rows, cfg, f"search_qa:{name}")


@ENVIRONMENTS.register("search", "search a local corpus (BM25) with a tool in <tool_call> JSON tags, then answer; "
                                 "paid for an exact answer, plus a per-turn format reward")
class SearchEnv:
    """Searches until a reply without a tool call, graded against the row's answer. The state keeps the
    episode's queries, retrieved passage ids and which turns searched."""

    def __init__(self, corpus: str = "fictional_atlas", top_k: int = 3, system_prompt: str = SYSTEM_PROMPT,
                 format_reward: float = 0.1, answer_reward: str = "exact", max_calls_per_turn: int = 2,
                 observation_role: str = "tool"):
        if answer_reward not in ("exact", "f1") or top_k < 1 or max_calls_per_turn < 1:
            raise ValueError(f"search: need answer_reward exact|f1, top_k ≥ 1, max_calls_per_turn ≥ 1 (got "
                             f"{answer_reward!r}, {top_k}, {max_calls_per_turn})")
        self.passages = read_jsonl(corpus, needs=("id", "text"))
        self.index = BM25Index(self.passages)
        self.words = [as_words(f"{p.get('title', '')} {p['text']}") for p in self.passages]
        self.tools = [SCHEMAS["search"]]
        self.top_k, self.system_prompt, self.format_reward = top_k, system_prompt, format_reward
        self.answer_reward, self.max_calls, self.role = answer_reward, max_calls_per_turn, observation_role

    def reset(self, row: dict[str, Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        state = {"gold": str(row["answer"]), "support": list(row.get("support") or ()), "searches": 0,
                 "bad_calls": 0, "queries": [], "retrieved": [], "gold_retrieved": False, "search_turns": [], "credit": 0.0}
        return prompt_messages(row, self.system_prompt), state

    def step(self, reply: str, state: dict[str, Any]) -> Step:
        blocks = CALL.findall(reply)
        if not blocks and "<tool_call>" not in reply:
            state["search_turns"].append(False)
            predicted = extract_answer(reply)
            exact = predicted is not None and normalise_answer(predicted) == normalise_answer(state["gold"])
            f1 = token_f1(predicted, state["gold"]) if predicted is not None else 0.0
            reward = (float(exact) if self.answer_reward == "exact" else f1) + state["credit"]
            return Step(None, reward, True, self._info(state, predicted is not None, exact, f1))
        state["search_turns"].append(True)
        results, well_formed = [], len(blocks) <= self.max_calls
        for text in blocks[: self.max_calls] or [reply.split("<tool_call>", 1)[1]]:
            try:
                _, args = parse_call(text.strip(), list(SCHEMAS), SCHEMAS)
                results.append(self.search(args["query"], state))
            except ToolError as err:
                state["bad_calls"] += 1
                well_formed = False
                results.append(f"error: {err}")
        observation = [{"role": self.role, "content": r} for r in results]
        return Step(observation, format_credit(state, well_formed and bool(blocks), self.format_reward), False,
                    self._info(state, False, False, 0.0))

    def search(self, query: str, state: dict[str, Any]) -> str:
        """The passages for `query`, numbered; records the query and what it retrieved in the state."""
        hits = self.index.search(query, self.top_k)
        state["searches"] += 1
        state["queries"].append(query)
        ids = [self.passages[i]["id"] for i in hits]
        state["retrieved"] += [pid for pid in ids if pid not in state["retrieved"]]
        answer = as_words(state["gold"])
        state["gold_retrieved"] = state["gold_retrieved"] or bool(answer.strip()) and any(
            answer in self.words[i] and (not state["support"] or pid in state["support"]) for i, pid in zip(hits, ids))
        if not hits:
            return "no passage matches the query"
        return "\n".join(f"[{n}] {self._label(i)}{self.passages[i]['text']}" for n, i in enumerate(hits, 1))

    def _label(self, i: int) -> str:
        title = self.passages[i].get("title")
        return f"{title}: " if title else ""

    @staticmethod
    def _info(state: dict[str, Any], answered: bool, exact: bool, f1: float) -> dict[str, Any]:
        metrics = {"env/searches": float(state["searches"]), "env/search_errors": float(state["bad_calls"]),
                   "env/answered": float(answered), "env/exact_match": float(exact), "env/f1": float(f1),
                   "env/gold_retrieved": float(state["gold_retrieved"])}
        if state["support"]:
            found = sum(pid in state["retrieved"] for pid in state["support"])
            metrics["env/support_recall"] = found / len(state["support"])
        return {"metrics": metrics, "search_turns": list(state["search_turns"])}
