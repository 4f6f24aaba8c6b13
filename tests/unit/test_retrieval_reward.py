"""retrieval: recall@k and nDCG@k (by hand) of the row's relevant passages for the reply's query under the
shared BM25 index; doc ids, title lists over the cap and empty queries do not pay; the question as its own
query is the baseline."""
import math

import pytest

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.retrieval import ndcg_at_k, query_text, recall_at_k
from lmrl.types import Sample

ROW = {"question": "What is the capital of the country in which the city of Bokriam lies?", "answer": "Komas",
       "support": ["atlas-0116", "atlas-0010"]}  # Bokriam's passage and Thind's
Retrieval = REWARD_FNS.get("retrieval")


@pytest.fixture(scope="module")
def recall():
    return Retrieval()


def score(component, text, row=ROW):
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)
    return component(s), s.info.get("retrieval")


def test_ndcg_and_recall_by_hand():
    # ranked a, x, b with a and b relevant: DCG = 1/log2(2) + 1/log2(4) = 1.5; ideal = 1 + 1/log2(3)
    assert ndcg_at_k(["a", "x", "b"], {"a", "b"}, 3) == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert ndcg_at_k(["a", "x", "b"], {"a", "b"}, 3) == pytest.approx(0.9197, abs=1e-4)
    assert ndcg_at_k(["x", "a"], {"a"}, 3) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(["a", "b", "c"], {"a", "b", "c", "d"}, 2) == 1.0  # the ideal has only k places
    assert recall_at_k(["a", "x", "b"], {"a", "b", "c", "d"}, 3) == 0.5
    assert recall_at_k(["a", "x", "b"], {"b"}, 2) == 0.0


def test_a_good_rewrite_finds_both_hops_and_the_question_only_one(recall):
    assert score(recall, "Query: Bokriam city country Thind capital") == (1.0, None)
    assert recall.rank(ROW["question"])[0] == "atlas-0116"
    assert score(recall, ROW["question"])[0] == 0.5  # the baseline: the question finds Bokriam, not Thind
    ndcg = Retrieval(metric="ndcg")
    assert score(ndcg, ROW["question"])[0] == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_doc_ids_titles_over_the_cap_and_empty_queries_do_not_pay(recall):
    assert score(recall, "Query: atlas-0116 atlas-0010")[0] == 0.0  # ids are not indexed
    assert recall.rank("atlas-0116 atlas-0010") == []
    titles = list(dict.fromkeys(p["title"] for p in recall.passages))
    many = " ".join(titles[:40] + ["Bokriam", "Thind"])
    assert score(recall, "Query: " + many) == (0.0, "query over 16 words")
    # sixteen titles fit the cap, but only k = 3 passages come back: listing titles is no way to cover the corpus
    listed = " ".join(t for t in titles if t not in ("Bokriam", "Thind"))
    assert score(recall, "Query: " + " ".join(listed.split()[:16]))[0] == 0.0
    assert score(recall, "") == (0.0, "empty query")
    assert score(recall, "Query: ``") == (0.0, "empty query")


def test_the_query_is_the_last_marker_or_the_last_line():
    assert query_text("thinking...\nQuery: Bokriam Thind\nQuery: \"capital of Thind\"") == "capital of Thind"
    assert query_text("I would search for\nBokriam river") == "Bokriam river"
    assert query_text("**Query**: Bokriam") == "Bokriam"


def test_bad_settings_and_rows_are_clear_errors(recall):
    with pytest.raises(ValueError, match="need metric recall|ndcg"):
        Retrieval(metric="map")
    with pytest.raises(ValueError, match="no corpus file"):
        Retrieval(corpus="no_such_corpus")
    with pytest.raises(ValueError, match="needs the row's 'support' field"):
        score(recall, "Query: Bokriam", row={"question": "q"})
    with pytest.raises(ValueError, match=r"relevant ids \['atlas-9999'\] are not in the corpus"):
        score(recall, "Query: Bokriam", row={"support": ["atlas-9999"]})
