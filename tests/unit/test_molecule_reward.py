"""molecule (C-MORAL): the sigmoid scores and geometric mean on the spec's hand case, RDKit oracles on known drugs,
and forgeries: several fragments, a non-canonical copy of the source, junk around the SMILES, several answers."""
import math

import pytest

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.molecule import (geometric_mean, parse_molecule, penalised_logp, property_score, requested,
                                   similarity_score, tanimoto)
from lmrl.types import Sample

ASPIRIN = "CC(=O)Oc1ccccc1C(=O)O"
molecule, molecule_status = REWARD_FNS.get("molecule"), REWARD_FNS.get("molecule_status")


def sample(text, source=ASPIRIN, **row):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row={"source": source, **row})


def test_the_specs_hand_case():
    # QED 0.5 < 0.9: improve to 0.6, k = 4/0.1 = 40; new 0.65 -> σ(2) = 0.8808
    qed, target, mode = property_score("qed", 0.65, 0.5)
    assert (round(qed, 4), round(target, 4), mode) == (0.8808, 0.6, "improve")
    # pLogP 2.0 >= 1.5: maintain 2.0, k = 4; new 2.5 -> σ(2) = 0.8808
    plogp, target, mode = property_score("plogp", 2.5, 2.0)
    assert (round(plogp, 4), target, mode) == (0.8808, 2.0, "maintain")
    sim = similarity_score(0.7)  # σ(60 · 0.1) = σ(6) = 0.9975
    assert round(sim, 4) == 0.9975
    assert round(geometric_mean([qed, plogp, sim]), 4) == 0.9181  # (0.8808² · 0.9975)^(1/3)
    # the source returned unchanged: QED σ(−4) = 0.0180, pLogP σ(0) = 0.5, sim σ(24) ≈ 1 -> (0.009)^(1/3) = 0.2080
    same = [property_score("qed", 0.5, 0.5)[0], property_score("plogp", 2.0, 2.0)[0], similarity_score(1.0)]
    assert [round(s, 4) for s in same] == [0.018, 0.5, 1.0]
    assert round(geometric_mean(same), 4) == 0.2080


def test_minimised_properties_and_per_sample_targets():
    # hERG ≤ 0.3, Δ 0.2, k 20: source 0.5 must fall to 0.3; 0.3 -> σ(0) = 0.5, 0.2 -> σ(2)
    assert property_score("herg", 0.3, 0.5)[1:] == (pytest.approx(0.3), "improve")
    assert property_score("herg", 0.2, 0.5)[0] == pytest.approx(1 / (1 + math.exp(-2)))
    assert property_score("herg", 0.3, 0.25)[1:] == (0.25, "maintain")
    assert property_score("qed", 0.8, 0.95, target=0.8) == (0.5, 0.8, "target")


def test_rdkit_oracles_on_known_drugs():
    aspirin, canonical = parse_molecule(ASPIRIN)
    assert canonical == ASPIRIN
    from rdkit.Chem import QED, Crippen

    # RDKit's own QED and Crippen logP of aspirin (0.550, 1.310); SA score 1.580 -> raw pLogP 1.310 − 1.580 − 0
    assert round(QED.qed(aspirin), 3) == 0.550 and round(Crippen.MolLogP(aspirin), 3) == 1.310
    assert round(penalised_logp(aspirin, normalised=False), 3) == -0.270
    # normalised: (1.3101 − 2.4571)/1.4343 + (−1.5800 + 3.0526)/0.8335 + (0 + 0.0486)/0.2860 = 1.137
    assert round(penalised_logp(aspirin), 3) == 1.137
    ring9, _ = parse_molecule("C1CCCCCCCC1")  # a 9-ring: penalty 3; logP 3.511, SA 1.000
    assert round(penalised_logp(ring9, normalised=False), 3) == round(3.5109 - 1.0 - 3, 3)
    caffeine, _ = parse_molecule("Cn1cnc2c1c(=O)n(C)c(=O)n2C")
    assert round(QED.qed(caffeine), 3) == 0.538
    assert tanimoto(aspirin, aspirin) == 1.0 and 0.0 < tanimoto(aspirin, caffeine) < 0.2


def test_a_real_edit_is_scored_and_recorded():
    # 2-methoxybenzoic acid for aspirin: QED 0.696 ≥ 0.650 (improve target), pLogP 1.558 < 2.137, sim 0.643
    s = sample("I replace the ester by a methyl ether.\nAnswer: COc1ccccc1C(=O)O")
    r = molecule(s)
    info = s.info["molecule"]
    assert info["valid"] and info["smiles"] == "COc1ccccc1C(=O)O" and info["missing"] == []
    assert round(info["values"]["qed"], 3) == 0.696 and round(info["values"]["sim"], 3) == 0.643
    assert r == pytest.approx(geometric_mean(list(info["scores"].values())))
    assert round(r, 3) == 0.416
    assert molecule_status(s) == {"valid": 1.0, "success": 0.0, "missing": 0.0}  # pLogP below its target
    # QED alone: 0.696 reaches 0.650 and the similarity 0.643 is over 0.6, a success
    assert molecule_status(sample("Answer: COc1ccccc1C(=O)O"), task="qed") == {"valid": 1.0, "success": 1.0,
                                                                               "missing": 0.0}


def test_returning_the_source_scores_low_even_written_differently():
    for text in [f"Answer: {ASPIRIN}", "Answer: OC(=O)c1ccccc1OC(C)=O", "Answer: O=C(O)c1ccccc1OC(=O)C"]:
        s = sample(text)
        r = molecule(s)
        assert s.info["molecule"]["same_as_source"] and s.info["molecule"]["values"]["sim"] == 1.0
        # aspirin improves on both: σ(−4)·σ(−4)·σ(24) -> (0.0180² · 1)^(1/3) = 0.0687
        assert round(r, 4) == 0.0687
        assert molecule_status(s)["success"] == 0.0


@pytest.mark.parametrize("text,why", [
    ("Answer: CCO.CCCCCCCCCC", "several fragments"),  # a decane fragment to inflate logP
    ("Answer: CCCCCCCCCC.OC(=O)c1ccccc1OC(C)=O", "several fragments"),
    ("Answer: the molecule COc1ccccc1C(=O)O is better", "not a SMILES string"),
    ("Answer: COc1ccccc1C(=O)O (2-methoxybenzoic acid)", "not a SMILES string"),
    ("Answer: C1CC", "not a valid molecule"),
    ("Answer: c1cccc1", "not a valid molecule"),  # a five-membered aromatic carbon ring does not kekulize
    ("Answer: C(C)(C)(C)(C)C", "not a valid molecule"),  # pentavalent carbon
    ("Answer: " + "C" * 401, "longer than 400 characters"),  # refused before RDKit parses it
    ("COc1ccccc1C(=O)O", "no answer"),  # no marker
    ("Answer: COc1ccccc1C(=O)O\nAnswer: CCO", "no answer"),  # two different answers are a hedge
])
def test_invalid_or_forged_replies_score_zero_and_say_why(text, why):
    s = sample(text)
    assert molecule(s) == 0.0
    assert not s.info["molecule"]["valid"] and why in s.info["molecule"]["status"]
    assert molecule_status(s) == {"valid": 0.0, "success": 0.0, "missing": 0.0}


def test_only_the_answer_after_the_last_marker_is_graded():
    # SMILES in the reasoning are ignored; the graded one is the last marker's (earlier markers must agree)
    s = sample("Candidates: CCO, CCN, c1ccccc1.\nAnswer: COc1ccccc1C(=O)O")
    assert s.info.get("molecule") is None and molecule(s) > 0.4
    assert s.info["molecule"]["smiles"] == "COc1ccccc1C(=O)O"
    assert molecule(sample("Answer: `COc1ccccc1C(=O)O`.")) == pytest.approx(molecule(s))


def test_properties_without_an_oracle_are_missing_not_zero(tmp_path):
    s = sample("Answer: COc1ccccc1C(=O)O")
    r = molecule(s, task="qed+bbbp")
    info = s.info["molecule"]
    assert info["missing"] == ["bbbp"] and set(info["scores"]) == {"qed", "sim"}
    assert r == pytest.approx(geometric_mean([info["scores"]["qed"], info["scores"]["sim"]]))
    assert molecule_status(s, task="qed+bbbp") == {"valid": 1.0, "success": 0.0, "missing": 1.0}
    # an ADMET model in the slot: a function of the SMILES (here a stand-in: 0.9 for the edit, 0.5 for aspirin)
    model = tmp_path / "admet.py"
    model.write_text(f"def bbbp(smiles):\n    return 0.5 if smiles == {ASPIRIN!r} else 0.9\n")
    s = sample("Answer: COc1ccccc1C(=O)O")
    molecule(s, task="qed+bbbp", oracles={"bbbp": f"{model}:bbbp"})
    # BBBP 0.5 < 0.8: improve to 0.6 with k 40; 0.9 -> σ(12)
    assert s.info["molecule"]["missing"] == [] and s.info["molecule"]["scores"]["bbbp"] == pytest.approx(
        1 / (1 + math.exp(-12)))


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="must name distinct properties"):
        requested("qed+logp")
    assert requested("QED+plogp") == ["qed", "plogp", "sim"] and requested("qed", similarity=False) == ["qed"]
    with pytest.raises(ValueError, match="source molecule's SMILES"):
        molecule(sample("Answer: CCO", source=None))
    with pytest.raises(ValueError, match="the row's source 'CCO.O' is several fragments"):
        molecule(sample("Answer: CCO", source="CCO.O"))


def test_no_state_between_samples():
    first = sample("Answer: COc1ccccc1C(=O)O")
    other = sample("Answer: Cc1ccc(O)cc1", source="CC(=O)Nc1ccc(O)cc1")
    a, b, a_again = molecule(first), molecule(other), molecule(sample("Answer: COc1ccccc1C(=O)O"))
    assert a == a_again and b != a


def test_the_shipped_task_holds_valid_single_molecules_with_their_recorded_values():
    import json

    from rdkit.Chem import QED

    from lmrl.recipe_files import shipped_or_local

    rows = [json.loads(line) for line in shipped_or_local("molecules.jsonl").open()]
    assert 20 <= len(rows) <= 60 and len({r["source"] for r in rows}) == len(rows)
    for row in rows:
        mol, canonical = parse_molecule(row["source"])
        assert canonical == row["source"] and row["source"] in row["question"]
        assert round(QED.qed(mol), 4) == row["qed"] and round(penalised_logp(mol), 4) == row["plogp"]
        assert molecule(sample(f"Answer: {row['source']}", source=row["source"])) < 0.5  # the copy pays little


def test_without_rdkit_the_error_says_what_to_install(monkeypatch):
    import sys

    from lmrl.rewards.molecule import _chem

    monkeypatch.setitem(sys.modules, "rdkit", None)
    _chem.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"needs RDKit: pip install rdkit"):
            molecule(sample("Answer: CCO", source="CCN"))
    finally:
        _chem.cache_clear()
