"""Multi-objective aggregation of named reward components, registered in `REWARD_AGGREGATIONS`.

Signature (see compute.py): `agg(components: {name: [value per valid sample of one group]},
weights: {name: weight}, **reward.aggregation_params) -> [reward per sample]`, called once per group.
Each component is still logged on its own (`reward/<name>`); only `sample.reward` is the aggregate.

- normalize_sum (GDPO): z-score each component within the group, then the weighted sum.
- soft_min (RVPO): −τ·log Σ_k w̃_k exp(−A_k/τ) over the (group-normalised) components.
- bottleneck (C-MORAL): weighted geometric mean (or min, or product) of [0, 1] scores, so one failing
  objective drags the whole reward down; optional sigmoid alignment of raw property values first.
- gated: quality components count only once every gate component reaches its threshold.

The group maths is shared with the advantage estimators (`lmrl.stats`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from lmrl.rewards.compute import REWARD_AGGREGATIONS
from lmrl.stats import component_advantages, softmin_aggregate


def _check_names(names: Sequence[str], components: Mapping[str, list[float]], what: str) -> None:
    missing = [n for n in names if n not in components]
    if missing:
        raise ValueError(f"{what} names unknown components {missing}; the components are {sorted(components)}")


def _matrix(components: Mapping[str, list[float]], names: Sequence[str]) -> torch.Tensor:
    """[n samples, K] float64 matrix of the named components."""
    return torch.tensor([components[n] for n in names], dtype=torch.float64).T.reshape(-1, len(names))


def _group_normalise(values: torch.Tensor, eps: float) -> torch.Tensor:
    return component_advantages(values, torch.zeros(values.shape[0], dtype=torch.long), eps).double()


@REWARD_AGGREGATIONS.register("normalize_sum", "GDPO: z-score each component within the group, then weighted sum")
def normalize_sum(components: dict[str, list[float]], weights: dict[str, float], eps: float = 1e-4,
                  **_) -> list[float]:
    """Σ_k w_k (r_k − mean_g r_k)/(std_g r_k + eps), unbiased std; a constant component contributes 0.

    GDPO (NVlabs/GDPO), confidence high. The batch z-score GDPO applies afterwards is the advantage
    estimator's job here (`algo.advantage: gdpo` does it on components; grpo re-normalises per group).
    A group of one sample keeps its raw values (GRPO's singleton convention: mean 0, std 1).
    """
    names = list(components)
    adv = _group_normalise(_matrix(components, names), eps)
    w = torch.tensor([weights.get(n, 1.0) for n in names], dtype=torch.float64)
    return (adv * w).sum(dim=1).tolist()


@REWARD_AGGREGATIONS.register("soft_min", "RVPO: -tau*log(sum_k w_k exp(-A_k/tau)) over group-normalised components")
def soft_min(components: dict[str, list[float]], weights: dict[str, float], tau: float = 1.0,
             normalize: bool = True, eps: float = 1e-4, **_) -> list[float]:
    """RVPO SoftMin (arXiv 2605.05750) — confidence medium-low (τ and the normalisation were not retrieved).

    With weights w̃_k = w_k/Σw (equal weights give RVPO's 1/K): ≈ weighted mean − variance/(2τ); τ → ∞ is
    the mean, τ → 0 the minimum, so a sample failing one objective is not carried by the others.
    normalize=false applies the SoftMin to the raw components. Zero-weight components are left out.
    """
    if tau <= 0:
        raise ValueError(f"soft_min tau must be > 0, got {tau}")
    names = [n for n in components if weights.get(n, 1.0) != 0]
    if any(weights.get(n, 1.0) < 0 for n in names):
        raise ValueError("soft_min weights must be >= 0 (they are mixture weights)")
    if not names:
        raise ValueError("soft_min needs at least one component with a non-zero weight")
    values = _matrix(components, names)
    adv = _group_normalise(values, eps) if normalize else values
    w = torch.tensor([weights.get(n, 1.0) for n in names], dtype=torch.float64)
    shift = tau * torch.log(len(names) * w / w.sum())  # folds w̃_k into the unweighted (1/K) SoftMin
    return softmin_aggregate(adv - shift, tau).tolist()


def sigmoid_align(value: float, target: float, slope: float = 10.0, direction: str = "maximize") -> float:
    """C-MORAL property alignment: σ(k(x − t)) to maximise, σ(k(t − x)) to minimise."""
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
    z = slope * (value - target) if direction == "maximize" else slope * (target - value)
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@REWARD_AGGREGATIONS.register("bottleneck", "C-MORAL: weighted geometric mean (or min/product) of [0,1] scores",
                              per_sample=True)
def bottleneck(components: dict[str, list[float]], weights: dict[str, float], mode: str = "geometric",
               eps: float = 1e-6, align: dict[str, dict] | None = None, **_) -> list[float]:
    """Bottleneck-sensitive aggregation (C-MORAL, Rwigie/C-MORAL `rl/reward_sigmoid.py`): confidence medium.

    mode="geometric": exp(Σ_k w_k log(s_k + eps) / Σ_k w_k) — the released code's unweighted
    (Π (s_k + 1e-6))^(1/K) when weights are equal; "min": min_k s_k; "product": Π_k s_k.
    `align: {name: {target, slope, direction}}` first maps a raw value to [0, 1] with the code's sigmoid
    (its slope is 4/δ for a property step δ). Every score must lie in [0, 1] after alignment.
    """
    if mode not in ("geometric", "min", "product"):
        raise ValueError(f"bottleneck mode must be 'geometric', 'min' or 'product', got {mode!r}")
    align = align or {}
    _check_names(list(align), components, "bottleneck align")
    scores = {n: [sigmoid_align(v, **align[n]) for v in vals] if n in align else list(vals)
              for n, vals in components.items()}
    names = [n for n in scores if weights.get(n, 1.0) != 0]
    for n in names:
        if any(not 0.0 <= v <= 1.0 for v in scores[n]):
            raise ValueError(f"bottleneck needs scores in [0, 1]; component {n!r} has {scores[n]} "
                             "(map it with aggregation_params.align)")
    s = _matrix(scores, names)
    if mode == "min":
        return s.min(dim=1).values.tolist()
    if mode == "product":
        return s.prod(dim=1).tolist()
    w = torch.tensor([weights.get(n, 1.0) for n in names], dtype=torch.float64)
    if (w < 0).any():
        raise ValueError("bottleneck weights must be >= 0")
    return torch.exp((torch.log(s + eps) * w).sum(dim=1) / w.sum()).tolist()


@REWARD_AGGREGATIONS.register("gated", "quality components count only once every gate passes its threshold",
                              per_sample=True)
def gated(components: dict[str, list[float]], weights: dict[str, float], gates: dict[str, float] | None = None,
          combine: str = "sum", fail_value: float = 0.0, partial_credit: float = 0.0, include_gates: bool = False,
          **_) -> list[float]:
    """Hierarchical gates (ordered): a sample that passes gates 1..j and fails gate j+1 gets
    fail_value + j·partial_credit; one that passes all gets the weighted `combine` ("sum" or "mean" =
    Σw·r/Σw) of the other components (plus the gates' own weighted values with include_gates), and
    len(gates)·partial_credit. Gate g passes when its value ≥ its threshold.

    MiLMMT is `gates: {language_match: 1}, combine: mean` over two QE components.
    """
    if not gates:
        raise ValueError("gated needs aggregation_params.gates: {component: threshold, ...} (in order)")
    if combine not in ("sum", "mean"):
        raise ValueError(f"gated combine must be 'sum' or 'mean', got {combine!r}")
    _check_names(list(gates), components, "gated gates")
    quality = [n for n in components if include_gates or n not in gates]
    n = len(next(iter(components.values())))
    total_w = sum(weights.get(q, 1.0) for q in quality)
    out = []
    for i in range(n):
        passed = 0
        for name, threshold in gates.items():
            if components[name][i] < threshold:
                break
            passed += 1
        if passed < len(gates):
            out.append(fail_value + passed * partial_credit)
            continue
        value = sum(weights.get(q, 1.0) * components[q][i] for q in quality)
        if combine == "mean":
            value = value / total_w if total_w else 0.0
        out.append(value + passed * partial_credit)
    return out
