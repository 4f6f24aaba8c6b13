"""`lmrl compare` pairs records by uid; repeated uids are paired by (uid, occurrence) and said so,
arms graded on different prompts are compared unpaired and said so."""
import pytest

from lmrl.eval.compare import Arm, Run, Unit, compare
from lmrl.eval.significance import pair_by_uid


def accuracy(records):
    return {"accuracy": sum(r["ok"] for r in records) / len(records)}


def test_repeated_uids_pair_by_occurrence():
    ref = [{"uid": "a", "ok": 0}, {"uid": "b", "ok": 0}, {"uid": "a", "ok": 1}]
    other = [{"uid": "a", "ok": 10}, {"uid": "a", "ok": 11}, {"uid": "b", "ok": 12}]
    pairing = pair_by_uid(ref, other)
    assert [other[i]["ok"] for i in pairing.order] == [10, 12, 11]  # k-th 'a' with k-th 'a'
    assert "1 uid repeats" in pairing.note and "'a' (2 times)" in pairing.note


def test_different_prompts_are_not_paired_and_say_why():
    pairing = pair_by_uid([{"uid": "a"}, {"uid": "b"}], [{"uid": "a"}, {"uid": "c"}])
    assert pairing.order is None and "different prompts" in pairing.note
    assert pair_by_uid([{"uid": "a"}], [{"uid": "a"}]).note == ""


def run_of(name, oks, uids):
    records = [{"uid": u, "ok": float(o)} for u, o in zip(uids, oks)]
    return Run(name, accuracy(records), {"prompts": Unit(records, accuracy)})


def test_compare_warns_about_repeated_ids_in_its_statement():
    uids = [f"p{i % 10}" for i in range(20)]  # every id twice
    a, b = run_of("a", [0] * 20, uids), run_of("b", [1] * 20, uids)
    result = compare([Arm("a", [a]), Arm("b", [b])], n_boot=99)
    (test,) = result["tests"]
    assert test["method"].startswith("paired bootstrap over prompts")
    assert any("10 uids repeat" in w for w in result["warnings"])
    assert "10 uids repeat" in result["statement"]
    assert test["diff"] == pytest.approx(1.0) and test["p"] == pytest.approx(1 / 100)
