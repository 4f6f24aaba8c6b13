"""Retrieval for query rewriting: the reply's search query is run through a BM25 ranker over a local corpus,
and the reward is recall@k or nDCG@k of the row's relevant passage ids.

`BM25Index` is the one BM25 ranker of lmrl: the search environment (lmrl/envs/search.py) queries the same
index over the same shipped corpus (`fictional_atlas`, in lmrl/envs/corpus/). The rules and the measured
baselines: docs/rewards/retrieval.md.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from lmrl.rewards.answers import clean_reply
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

CORPUS_DIR = Path(__file__).resolve().parents[1] / "envs" / "corpus"  # the shipped corpora
METRICS = ("recall", "ndcg")
_QUERY_MARKER = re.compile(r"[*_]{0,3}query[*_]{0,3}\s*:(.*)", re.IGNORECASE)


def _bm25s():
    """bm25s, imported with numba hidden: it would import numba whenever it is installed (vLLM depends on
    it), and numba's llvmlite objects break vLLM's kernel scan of `sys.modules` at engine start. Without
    numba bm25s uses its numpy backend."""
    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s

        return bm25s
    sys.modules["numba"] = None  # `import numba` now raises ImportError
    try:
        import bm25s
    finally:
        del sys.modules["numba"]
    return bm25s


class BM25Index:
    """BM25 over the passages' title and text (English stopwords removed). A query only reads the index,
    so episodes stepped in parallel threads may search at once."""

    def __init__(self, passages: list[dict[str, Any]], k1: float = 1.5, b: float = 0.75):
        bm25s = _bm25s()
        self.passages = passages
        texts = [f"{p.get('title', '')}. {p['text']}" for p in passages]
        self.retriever = bm25s.BM25(k1=k1, b=b)
        self.retriever.index(self.words(texts), show_progress=False)

    @staticmethod
    def words(texts: list[str]) -> list[list[str]]:
        return _bm25s().tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the (at most) `k` best passages with a positive score, best first; ties keep corpus order."""
        import numpy as np

        ids = self.retriever.get_tokens_ids(self.words([query])[0])
        if not ids:
            return []
        scores = self.retriever.get_scores_from_ids(ids)
        return [int(i) for i in np.argsort(-scores, kind="stable")[:k] if scores[i] > 0]


def load_passages(corpus: str) -> list[dict[str, Any]]:
    """The passages ({id, title, text}) of a shipped corpus (`CORPUS_DIR/<name>.jsonl`) or of a `.jsonl` path."""
    path = Path(corpus) if corpus.endswith(".jsonl") else CORPUS_DIR / f"{corpus}.jsonl"
    if not path.is_file():
        shipped = sorted(p.stem for p in CORPUS_DIR.glob("*.jsonl") if not p.stem.endswith("_qa"))
        raise ValueError(f"retrieval: no corpus file {path} (shipped corpora: {', '.join(shipped)}; or a .jsonl path)")
    passages = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for i, p in enumerate(passages):
        if not isinstance(p, dict) or p.get("id") is None or p.get("text") is None:
            raise ValueError(f"retrieval: record {i} of {path} needs the fields ['id', 'text']")
    return passages


def recall_at_k(ranked: list[str], relevant: set[str], k: int) -> float:
    """|top k ∩ relevant| / |relevant|."""
    return len(set(ranked[:k]) & relevant) / len(relevant)


def ndcg_at_k(ranked: list[str], relevant: set[str], k: int) -> float:
    """Binary-gain nDCG: Σ_{i ≤ k, doc i relevant} 1/log2(i + 1) over the same sum for the best ranking
    (the min(k, |relevant|) relevant documents first)."""
    dcg = sum(1 / math.log2(i + 2) for i, doc in enumerate(ranked[:k]) if doc in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal


def query_text(reply: str) -> str:
    """The reply's query: the text after its last 'Query:' marker (bold too; to the end of its line), else its last
    non-empty line, stripped of quotes and backticks."""
    lines = [line.strip() for line in clean_reply(reply).splitlines() if line.strip()]
    marked = [m.group(1) for m in map(_QUERY_MARKER.match, lines) if m]
    text = marked[-1] if marked else (lines[-1] if lines else "")
    return text.strip().strip("\"'`").strip()


@REWARD_FNS.register("retrieval", "recall@k or nDCG@k of the row's relevant passages for the reply's query, "
                                  "ranked by BM25 over a local corpus")
class RetrievalScore:
    """The corpus is indexed once per run. A query over `max_query_tokens` whitespace-separated words, or an
    empty one, scores 0 (kept in `sample.info["retrieval"]`); the row's `relevant_field` lists the ids of
    its relevant passages, each in the corpus."""

    def __init__(self, corpus: str = "fictional_atlas", k: int = 3, metric: str = "recall",
                 relevant_field: str = "support", max_query_tokens: int = 16):
        if metric not in METRICS or k < 1 or max_query_tokens < 1:
            raise ValueError(f"retrieval: need metric recall|ndcg, k >= 1 and max_query_tokens >= 1 (got "
                             f"{metric!r}, {k}, {max_query_tokens})")
        self.passages = load_passages(corpus)
        self.ids = [str(p["id"]) for p in self.passages]
        self.index = BM25Index(self.passages)
        self.k, self.metric, self.relevant_field, self.max_query_tokens = k, metric, relevant_field, max_query_tokens

    def relevant(self, row: dict[str, Any]) -> set[str]:
        ids = row.get(self.relevant_field)
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"retrieval needs the row's {self.relevant_field!r} field: a non-empty list of "
                             "relevant passage ids (set params.relevant_field)")
        unknown = sorted(set(map(str, ids)) - set(self.ids))
        if unknown:
            raise ValueError(f"retrieval: the row's relevant ids {unknown} are not in the corpus")
        return set(map(str, ids))

    def rank(self, query: str) -> list[str]:
        return [self.ids[i] for i in self.index.search(query, self.k)]

    def score(self, query: str, relevant: set[str]) -> float:
        ranked = self.rank(query)
        return (recall_at_k if self.metric == "recall" else ndcg_at_k)(ranked, relevant, self.k)

    def __call__(self, sample: Sample) -> float:
        relevant = self.relevant(sample.row)
        query = query_text(sample.text)
        if not query:
            sample.info["retrieval"] = "empty query"
            return 0.0
        if len(query.split()) > self.max_query_tokens:
            sample.info["retrieval"] = f"query over {self.max_query_tokens} words"
            return 0.0
        return self.score(query, relevant)
