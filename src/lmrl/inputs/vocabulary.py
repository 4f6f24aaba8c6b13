"""The names of per-sample inputs: the estimators' aliases, the knobs providers read, the task row fields
copied as inputs, and the fields a training step fills itself.

A method declares the inputs it reads by name (`requires` of an estimator or loss, `inputs` of a term
or shaper). Each name is either filled by exactly one provider (`lmrl.inputs.registry.PROVIDERS`) or
is a step field below; config validation refuses any other name, suggesting the nearest.
"""
from __future__ import annotations

import difflib
from typing import Iterable

# Keyword names of the estimators that differ from the providers' names; `provide` stores the
# provided value under the alias too when the alias is requested.
ALIASES = {"components": "reward_components"}
# Knobs of `algo.advantage_params` read by providers rather than by the estimator.
INPUT_KNOBS = frozenset({"acoustic_component", "speech_id_range", "pmi_field",
                         "stages", "scores_from", "format_penalty"})  # the last three: StructPO (inputs.stages)
# Copied from the task row of each sample (every sample of a prompt carries its prompt's value).
ROW_FIELD_INPUTS = frozenset({"peer_rewards", "perm_index", "prompt_variant"})
# Filled by the training step itself, not by a provider: the learner's forward (`logp`, per-token
# `entropy`, `values`), the algorithm (`advantages`, the critic's `old_values` and `returns`, the
# loss `mask`), and what shapers read beside the batch's extras (`behaviour_logp`, `max_new_tokens`, `group_index`).
STEP_FIELDS = frozenset({"logp", "old_logp", "advantages", "mask", "entropy", "values", "old_values", "returns",
                         "behaviour_logp", "max_new_tokens", "group_index"})

DEFAULT_PMI_FIELD = "question_without_evidence"


def pmi_field(knobs: dict) -> str:
    """The task row field holding the prompt without its evidence (knob `pmi_field`)."""
    return knobs.get("pmi_field", DEFAULT_PMI_FIELD)


def canonical(names: Iterable[str]) -> set[str]:
    """The providers' names for `names` (estimator keyword aliases resolved)."""
    return {ALIASES.get(n, n) for n in names}


def unknown_inputs_message(names: Iterable[str], known: Iterable[str]) -> str:
    """`names` (unknown inputs) each with the nearest known input name, for a config error."""
    known = sorted(known)
    parts = []
    for name in sorted(names):
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        parts.append(f"{name!r} (did you mean {near[0]!r}?)" if near else repr(name))
    return ", ".join(parts)
