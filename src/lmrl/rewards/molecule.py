"""Molecule optimisation rewards (C-MORAL, Rwigie/C-MORAL `rl/reward_sigmoid.py`, `props/properties.py`): the
reply proposes one molecule (a SMILES string) for a row's source molecule, and each requested property of it is
scored by a sigmoid against a target set from the source, then the scores are combined by a geometric mean, so
one failing property drags the whole reward down. Confidence: high (the released code read).

Per property p with threshold Θ_p, step Δ_p, direction ± (+ maximise, − minimise) and slope k_p = 4/Δ_p:
a per-sample target t (the row's `targets`) gives s_p = σ(±k_p (v_new − t)); else a source already at or past
Θ_p is maintained, s_p = σ(±k_p (v_new − v_src)); else it must improve by Δ_p, s_p = σ(±k_p (v_new − (v_src ± Δ_p))).
Similarity: s_sim = σ(60 (Tanimoto − 0.6)) on Morgan fingerprints (radius 2, 2048 bits). The reward is
(Π_p (s_p + 1e-6))^(1/n). The rules and the forgery guards: docs/rewards/molecule.md.
"""
from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from lmrl.registry import load_user_object
from lmrl.rewards.answers import final_answer
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

EPS = 1e-6  # added to every score before the geometric mean, as the released code does
SIM_THRESHOLD, SIM_SLOPE = 0.6, 60.0
# the released code's pLogP normalisation: ZINC250k means and deviations of logP, −SA and the ring penalty
PLOGP_NORMS = {"logp": (2.4570953396190123, 1.434324401111988), "sa": (-3.0525811293166134, 0.8335207024513095),
               "cycle": (-0.0485696876403053, 0.2860212110245455)}
MAX_SMILES_CHARS = 400  # a longer reply is refused unparsed (drug-like molecules take under 150)
_SMILES = re.compile(r"^[A-Za-z0-9@+\-\[\]()=#$:/\\%.*]+$")
RDKIT_MISSING = "the molecule reward needs RDKit: pip install rdkit (it is in lmrl's test extra: pip install 'lmrl[test]')"


@dataclass(frozen=True)
class Property:
    """A property's drug-relevant threshold Θ, required change Δ and direction (C-MORAL `props/props_info.py`)."""

    threshold: float
    delta: float
    maximise: bool

    @property
    def slope(self) -> float:
        return 4.0 / self.delta


PROPERTIES = {
    "qed": Property(0.9, 0.1, True), "plogp": Property(1.5, 1.0, True), "amp": Property(0.8, 0.1, True),
    "bbbp": Property(0.8, 0.1, True), "drd2": Property(0.4, 0.1, True), "hia": Property(0.9, 0.1, True),
    "carc": Property(0.2, 0.1, False), "herg": Property(0.3, 0.2, False), "liv": Property(0.4, 0.1, False),
    "mut": Property(0.2, 0.1, False),
}


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def property_score(name: str, new: float, source: float, target: float | None = None) -> tuple[float, float, str]:
    """(s_p, the target it was scored against, the mode: "target", "maintain" or "improve") of property `name`
    with value `new` for a molecule made from one with value `source`; `target`: a per-sample target."""
    prop = PROPERTIES[name]
    sign = 1.0 if prop.maximise else -1.0
    if target is not None:
        mode = "target"
    elif (source >= prop.threshold) if prop.maximise else (source <= prop.threshold):
        target, mode = source, "maintain"
    else:
        target, mode = source + sign * prop.delta, "improve"
    return sigmoid(sign * prop.slope * (new - target)), target, mode


def similarity_score(tanimoto: float) -> float:
    """σ(60 (T − 0.6)): near 0 below a Tanimoto similarity of 0.6 to the source, near 1 above it."""
    return sigmoid(SIM_SLOPE * (tanimoto - SIM_THRESHOLD))


def geometric_mean(scores: list[float]) -> float:
    """(Π (s + 1e-6))^(1/n), the released code's AND-like combination (0 for no scores)."""
    if not scores:
        return 0.0
    return math.exp(sum(math.log(s + EPS) for s in scores) / len(scores))


@lru_cache(maxsize=1)
def _chem() -> SimpleNamespace:
    """The RDKit modules the reward uses, imported on first use (an ImportError saying what to install)."""
    try:
        from rdkit import Chem, DataStructs, RDLogger
        from rdkit.Chem import QED, Crippen, RDConfig, rdFingerprintGenerator
    except ImportError:
        raise ImportError(RDKIT_MISSING) from None
    RDLogger.DisableLog("rdApp.*")  # an unparsable reply is an expected outcome, not a line on stderr
    return SimpleNamespace(Chem=Chem, DataStructs=DataStructs, QED=QED, Crippen=Crippen, RDConfig=RDConfig,
                           fingerprints=rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048))


@lru_cache(maxsize=1)
def _sascorer():
    """RDKit's Contrib SA score (Ertl & Schuffenhauer), shipped inside the rdkit wheel."""
    path = Path(_chem().RDConfig.RDContribDir) / "SA_Score" / "sascorer.py"
    if not path.is_file():
        raise ImportError(f"the molecule reward's SA score needs {path}, which this rdkit install lacks; "
                          "install the rdkit wheel from PyPI (pip install rdkit)")
    spec = importlib.util.spec_from_file_location("lmrl_rdkit_sascorer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def penalised_logp(mol, normalised: bool = True) -> float:
    """logP − SA score − ring penalty (rings over 6 atoms: size − 6, the largest ring); `normalised`: each term
    standardised by its ZINC250k mean and deviation, as the released code does (its Θ of 1.5 is on that scale)."""
    logp, sa = _chem().Crippen.MolLogP(mol), -_sascorer().calculateScore(mol)
    largest = max((len(ring) for ring in mol.GetRingInfo().AtomRings()), default=0)
    cycle = -max(largest - 6, 0)
    if not normalised:
        return logp + sa + cycle
    terms = {"logp": logp, "sa": sa, "cycle": cycle}
    return sum((terms[k] - mean) / std for k, (mean, std) in PLOGP_NORMS.items())


def tanimoto(a, b) -> float:
    """Tanimoto similarity of two molecules' Morgan fingerprints (radius 2, 2048 bits)."""
    rd = _chem()
    return rd.DataStructs.TanimotoSimilarity(rd.fingerprints.GetFingerprint(a), rd.fingerprints.GetFingerprint(b))


def parse_molecule(smiles: str):
    """(the RDKit molecule, its canonical SMILES) of a single-fragment SMILES, or (None, why not)."""
    chem = _chem().Chem
    if len(smiles) > MAX_SMILES_CHARS:
        return None, f"longer than {MAX_SMILES_CHARS} characters"
    if not _SMILES.match(smiles):
        return None, "not a SMILES string (one token of SMILES characters)"
    mol = chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0:
        return None, "not a valid molecule"
    if len(chem.GetMolFrags(mol)) != 1:
        return None, "several fragments (one molecule only)"
    canonical = chem.MolToSmiles(mol)
    return chem.MolFromSmiles(canonical), canonical


def reply_smiles(text: str, pattern: str | None = None) -> str | None:
    """The SMILES the reply commits to: the text of its last 'Answer:' marker (every marker agreeing, nothing
    after it retracting it), without wrapping backticks or quotes; None without a marker."""
    answer = final_answer(text, pattern)
    return None if answer is None else answer.strip().strip("`'\"").strip()


@dataclass
class Graded:
    """A reply's molecule, graded: validity, per-property values and scores, the reward, and why it is 0."""

    valid: bool
    status: str
    smiles: str | None = None
    same_as_source: bool = False
    values: dict[str, float] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    targets: dict[str, float] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False


def requested(task: str, similarity: bool = True) -> list[str]:
    """The property names of a task string ("qed+plogp"), plus "sim" unless `similarity` is false."""
    names = [n.strip().lower() for n in task.split("+") if n.strip()]
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"molecule: task {task!r} must name distinct properties joined by '+' from "
                         f"{', '.join(PROPERTIES)} (similarity is added by similarity: true)")
    return names + (["sim"] if similarity else [])


def _oracles(names: list[str], extra: dict[str, str] | None, normalised_plogp: bool) -> dict[str, Callable]:
    """Property name -> function(mol, smiles) -> value or None; QED and pLogP from RDKit, the others (the ADMET
    classifiers, DRD2) only when `extra` names a model as `module:function` or `file.py:function` of the SMILES."""
    found: dict[str, Callable] = {"qed": lambda mol, _: _chem().QED.qed(mol),
                                  "plogp": lambda mol, _: penalised_logp(mol, normalised_plogp)}
    for name, spec in (extra or {}).items():
        if name not in PROPERTIES:
            raise ValueError(f"molecule: oracles names {name!r}, not a property ({', '.join(PROPERTIES)})")
        predict = load_user_object(spec)
        found[name] = lambda _, smiles, predict=predict: predict(smiles)
    return {n: found[n] for n in names if n in found}


@lru_cache(maxsize=4096)
def _source(smiles: str):
    mol, canonical = parse_molecule(smiles)
    if mol is None:
        raise ValueError(f"molecule: the row's source {smiles!r} is {canonical}")
    return mol, canonical


def _value(oracle: Callable, mol, smiles: str) -> float | None:
    value = oracle(mol, smiles)
    return None if value is None or not math.isfinite(float(value)) else float(value)


def grade(sample: Sample, task: str = "qed+plogp", similarity: bool = True, source_field: str = "source",
          targets_field: str = "targets", oracles: dict[str, str] | None = None, normalised_plogp: bool = True,
          pattern: str | None = None) -> Graded:
    """The reply's molecule graded against the row's source molecule (see the module docstring). Invalid
    (no answer, not one parsable single-fragment molecule) → reward 0. A property without an oracle is left out
    of the mean and listed in `missing`, never scored 0."""
    names = requested(task, similarity)
    source_smiles = sample.row.get(source_field)
    if not isinstance(source_smiles, str) or not source_smiles.strip():
        raise ValueError(f"molecule needs the source molecule's SMILES in the row's {source_field!r} field "
                         "(set params.source_field)")
    source, source_canonical = _source(source_smiles.strip())
    smiles = reply_smiles(sample.text, pattern)
    if smiles is None:
        return Graded(False, "no answer: one 'Answer: <SMILES>' line (differing answers count as none)")
    mol, canonical = parse_molecule(smiles)
    if mol is None:
        return Graded(False, canonical)
    graded = Graded(True, "scored", canonical, canonical == source_canonical)
    functions = _oracles([n for n in names if n != "sim"], oracles, normalised_plogp)
    row_targets: dict[str, Any] = sample.row.get(targets_field) or {}
    reached = []
    for name in names:
        if name == "sim":
            value = tanimoto(source, mol)
            graded.values["sim"], graded.scores["sim"] = value, similarity_score(value)
            reached.append(value >= SIM_THRESHOLD)
            continue
        new = _value(functions[name], mol, canonical) if name in functions else None
        old = _value(functions[name], source, source_canonical) if name in functions else None
        if new is None or old is None:
            graded.missing.append(name)
            continue
        wanted = row_targets.get(name)
        score, target, _ = property_score(name, new, old, None if wanted is None else float(wanted))
        graded.values[name], graded.scores[name], graded.targets[name] = new, score, target
        reached.append(new >= target if PROPERTIES[name].maximise else new <= target)
    graded.reward = geometric_mean(list(graded.scores.values()))
    graded.success = all(reached) and not graded.missing and not graded.same_as_source
    return graded


def _record(sample: Sample, graded: Graded) -> Graded:
    sample.info["molecule"] = {"valid": graded.valid, "status": graded.status, "smiles": graded.smiles,
                               "same_as_source": graded.same_as_source, "values": graded.values,
                               "scores": graded.scores, "missing": graded.missing}
    return graded


@REWARD_FNS.register("molecule", "C-MORAL: geometric mean of per-property sigmoid scores (QED, penalised logP, "
                                 "similarity to the source; ADMET models pluggable) of the reply's SMILES, 0 if invalid")
def molecule_reward(sample: Sample, task: str = "qed+plogp", similarity: bool = True, source_field: str = "source",
                    targets_field: str = "targets", oracles: dict[str, str] | None = None,
                    normalised_plogp: bool = True, pattern: str | None = None) -> float:
    """The C-MORAL reward of the reply's molecule; the grading (validity, values, scores, missing properties)
    is kept in `sample.info["molecule"]`."""
    return _record(sample, grade(sample, task, similarity, source_field, targets_field, oracles, normalised_plogp,
                                 pattern)).reward


@REWARD_FNS.register("molecule_status", "the molecule reward's verdicts as parts: valid (one parsable molecule), "
                                        "success (every property scored and at its target, sim >= 0.6, not the source), "
                                        "missing (properties without an oracle)")
def molecule_status(sample: Sample, task: str = "qed+plogp", similarity: bool = True, source_field: str = "source",
                    targets_field: str = "targets", oracles: dict[str, str] | None = None,
                    normalised_plogp: bool = True, pattern: str | None = None) -> dict[str, float]:
    """Meant at weight 0 beside `molecule` with the same params: it logs the share of valid molecules and of
    successes (the accuracy component `molecule_status/success`) and the count of missing properties."""
    graded = grade(sample, task, similarity, source_field, targets_field, oracles, normalised_plogp, pattern)
    return {"valid": float(graded.valid), "success": float(graded.success), "missing": float(len(graded.missing))}
