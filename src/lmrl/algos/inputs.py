"""Per-sample inputs of estimators and losses: the names, where each one lives in a Batch, the lookup.

An estimator or loss declares the inputs it needs beyond rewards, groups and masks at registration
(`requires=...`, read back as `ADVANTAGES.spec(name).requires`). The training loop fills them into
the Batch (`extras`, `row_extras`, `context`), the learner computes the model outputs among them in
a no-grad pass before `Algorithm.prepare`, and `gather` hands them to the function as keyword
arguments. A name the batch lacks raises a ValueError naming it (docs/methods/inputs.md).
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch

from lmrl.algos.multi_reward import modality_mask
from lmrl.stats import masked_mean

# Computed by the learner in the packed forward: value-head outputs [B,T], hidden states of the
# generated positions [B,T,H], exact per-token entropies [B,T].
MODEL_OUTPUTS = frozenset({"values", "hidden", "token_entropy"})
# Copied from the task row of each sample (every sample of a prompt carries its prompt's value).
ROW_FIELD_INPUTS = frozenset({"peer_rewards", "perm_index", "prompt_variant"})
# Knobs read by `lookup` rather than by the estimator (allowed in `algo.advantage_params`).
INPUT_KNOBS = frozenset({"acoustic_component", "speech_id_range", "pmi_field"})
# Keyword names of the estimators that differ from the loop's input names.
ALIASES = {"components": "reward_components"}


def canonical(names: Iterable[str]) -> set[str]:
    """The loop's names for `names` (estimator keyword aliases resolved)."""
    return {ALIASES.get(n, n) for n in names}


def model_outputs_for(names: Iterable[str]) -> set[str]:
    """Model outputs the learner must compute before `prepare` to provide `names`."""
    names = set(names)
    out = names & MODEL_OUTPUTS
    if "entropy" in names:
        out.add("token_entropy")
    return out


def _component(batch, name: str) -> torch.Tensor | None:
    names = batch.context.get("reward_component_names", [])
    if "reward_components" not in batch.row_extras or name not in names:
        return None
    return batch.row_extras["reward_components"][:, names.index(name)]


def lookup(name: str, batch, knobs: dict[str, Any]) -> Any:
    """The value of input `name` for `batch` (None when the batch does not carry it).

    `entropy` is the token-mean of the exact per-token entropies of the batch's generated tokens;
    `acoustic_rewards` is the reward component named by the knob `acoustic_component` (default
    "acoustic"); `speech_mask` marks the generated tokens whose id lies in the knob
    `speech_id_range` [start, end).
    """
    key = ALIASES.get(name, name)
    for store in (batch.context, batch.row_extras, batch.extras):
        if key in store:
            return store[key]
    if name == "entropy" and "token_entropy" in batch.extras:
        return masked_mean(batch.extras["token_entropy"], batch.completion_mask)
    if name == "acoustic_rewards":
        return _component(batch, knobs.get("acoustic_component", "acoustic"))
    if name == "speech_mask" and "speech_id_range" in knobs:
        return modality_mask(batch.input_ids[:, 1:], knobs["speech_id_range"]) * batch.completion_mask
    return None


def optional_inputs(fn, required: Iterable[str], batch, knobs: dict[str, Any]) -> dict[str, Any]:
    """Keyword parameters of `fn` (after the three positional ones) that the batch carries and that
    neither `required` nor the knobs set (e.g. P-GRPO's `step` for its ramp)."""
    params = list(inspect.signature(fn).parameters.values())[3:]
    found = {}
    for p in params:
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.name in knobs or p.name in set(required):
            continue
        value = lookup(p.name, batch, knobs)
        if value is not None:
            found[p.name] = value
    return found


def gather(names: Iterable[str], batch, knobs: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for a function that requires `names`; a missing one raises, naming it."""
    found = {}
    for name in sorted(names):
        value = lookup(name, batch, knobs)
        if value is None:
            raise ValueError(f"the batch lacks the input {name!r}; the training loop provides it only when "
                             "the algorithm declares it (see docs/methods/inputs.md)")
        found[name] = value
    return found
