"""Preference terms on a tiny model through an offline batch source: pairs reach the terms whole (micro-batches
of one pair give the whole batch's gradients), the first step's DPO loss is log 2 and KTO's 1/2 (policy =
reference), and training raises the chosen completions' preference."""
import json

import pytest

from conftest import make_tokenizer, toy_run_config
from lmrl.data.sources import BATCH_SOURCES, OfflineData
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.types import Group, Origin, Sample


def pairs_of(cfg, tokenizer, task_rows, task_eval_rows) -> OfflineData:
    """Token-id pairs of `batches.dataset`: one group per pair, its chosen row first."""
    groups = []
    for i, line in enumerate(open(cfg.batches.dataset)):
        r = json.loads(line)
        groups.append(Group(f"pair-{i}", r, [
            Sample(r["prompt"], c, [0.0] * len(c), origin=Origin.DEMONSTRATION, info={"preference": which})
            for c, which in ((r["chosen"], "chosen"), (r["rejected"], "rejected"))]))
    return OfflineData(groups, [], {}, "token pairs")


def unpaired_of(cfg, tokenizer, task_rows, task_eval_rows) -> OfflineData:
    """The same file's completions as unpaired rows: chosen ones desirable, rejected ones not."""
    rows = [json.loads(line) for line in open(cfg.batches.dataset)]
    return OfflineData([Group(f"{which}-{i}", r, [Sample(r["prompt"], r[which], [0.0] * len(r[which]),
                                                          origin=Origin.DEMONSTRATION,
                                                          info={"desirable": which == "chosen"})])
                        for i, r in enumerate(rows) for which in ("chosen", "rejected")], [], {}, "token rows")


@pytest.fixture(autouse=True)
def token_sources(monkeypatch):
    """This file's sources, registered for its tests only."""
    for table in ("_items", "_specs", "_docs"):
        monkeypatch.setattr(BATCH_SOURCES, table, dict(getattr(BATCH_SOURCES, table)))
    BATCH_SOURCES.register("token_id_pairs", "token-id preference pairs", pairs=True)(pairs_of)
    BATCH_SOURCES.register("token_unpaired", "token-id rows labelled desirable or not",
                           labels={"desirable"})(unpaired_of)


def pair_source(tmp_path, rows=8):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": [1, 5 + i % 4], "chosen": [7, 9, 2][: 2 + i % 2],
                                        "rejected": [8, 10 + i % 3, 11, 2]}) + "\n" for i in range(rows)))
    return {"source": "token_id_pairs", "dataset": str(data), "size": 4, "num_eval": 0}


def train_terms(tmp_path, terms, steps=8, source="token_id_pairs", **trainer):
    cfg = toy_run_config(tmp_path, steps, batches={**pair_source(tmp_path), "source": source}, algo={"terms": terms},
                         trainer={"lr": 1e-2, **trainer})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "pref/loss" in r]


def test_dpo_starts_at_log_two_and_learns_the_preference(tmp_path):
    steps = train_terms(tmp_path, [{"name": "dpo", "params": {"beta": 0.5}}])
    assert len(steps) == 8
    assert steps[0]["pref/loss"] == pytest.approx(0.693147, abs=1e-5)  # z = 0 before the first update
    assert steps[0]["pref/margin"] == pytest.approx(0.0, abs=1e-6)
    assert steps[-1]["pref/loss"] < steps[0]["pref/loss"] and steps[-1]["pref/margin"] > 0
    assert steps[-1]["pref/reward_accuracy"] == 1.0


def test_micro_batches_of_one_pair_give_the_whole_batch_update(tmp_path):
    # a micro-batch token budget below two rows' padded length: each micro-batch holds one pair (kept whole)
    whole = train_terms(tmp_path / "whole", [{"name": "dpo", "params": {"beta": 0.5}}], steps=3)
    split = train_terms(tmp_path / "split", [{"name": "dpo", "params": {"beta": 0.5}}], steps=3,
                        micro_batch_tokens=1)
    # the same gradients, so the same weights: equal gradient norms at every step (the logged pair metrics are
    # token-weighted means over micro-batches, so they are compared at the first step only)
    assert [r["grad_norm"] for r in split] == pytest.approx([r["grad_norm"] for r in whole], rel=1e-4)
    assert split[0]["pref/loss"] == pytest.approx(whole[0]["pref/loss"], abs=1e-6)


@pytest.mark.parametrize("term", ["dpo_reference_free", "simpo", "orpo"])
def test_reference_free_terms_train(tmp_path, term):
    steps = train_terms(tmp_path, [{"name": term}], steps=6)
    assert steps[-1]["pref/loss"] < steps[0]["pref/loss"]
    assert steps[-1]["pref/margin"] > steps[0]["pref/margin"]


def test_kto_starts_at_one_half_and_learns_the_labels(tmp_path):
    # policy = reference at the first step: h = 0 and z₀ = 0, so every row's loss is 1 − σ(0)
    steps = train_terms(tmp_path, [{"name": "kto", "params": {"beta": 0.5}}], source="token_unpaired")
    assert steps[0]["pref/loss"] == pytest.approx(0.5, abs=1e-6) and steps[0]["pref/kl_reference"] == 0.0
    assert steps[-1]["pref/loss"] < 0.5
    assert steps[-1]["pref/chosen_reward"] > 0 > steps[-1]["pref/rejected_reward"]


def test_bradley_terry_trains_a_score_head_that_ranks_the_chosen_replies_first(tmp_path):
    cfg = toy_run_config(tmp_path, 8, batches=pair_source(tmp_path), algo={"terms": [{"name": "bradley_terry"}]},
                         trainer={"lr": 1e-2, "share_prompt": True})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    steps = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "rm/loss" in r]
    assert stages.learner.score_head is not None and len(steps) == 8
    assert steps[0]["rm/loss"] == pytest.approx(0.693147, abs=0.05)  # a fresh head scores every row near 0
    assert steps[-1]["rm/loss"] < steps[0]["rm/loss"] and steps[-1]["rm/margin"] > 0
    assert steps[-1]["rm/accuracy"] == 1.0
