"""How an estimator gets the per-sample inputs it declares: read them from the Batch by name.

An estimator or loss declares the inputs it needs beyond rewards, groups and masks at registration
(`requires=...`, read back as `ADVANTAGES.spec(name).requires`). The input providers (`lmrl.inputs`)
fill them into the Batch (`extras`, `row_extras`, `context`) under the names the estimator uses,
and `gather` hands them over as keyword arguments. The lookup derives nothing: a name the batch
lacks raises a ValueError naming it. This helper stays in `algos` because `lmrl.inputs` sits above
it (its providers encode prompts and call the learner); docs/architecture.md, "Input providers".
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

# Computed by the learner in the packed forward: value-head outputs [B,T], hidden states of the
# generated positions [B,T,H], exact per-token entropies [B,T], the reward model's scalar [B]
# (its score head on each row's last token), and a process reward model's class logits [B,T,2] (the
# score head on each generated token's own position).
MODEL_OUTPUTS = frozenset({"values", "hidden", "token_entropy", "score", "token_scores", "logits"})
# the score head's outputs, each with its number of labels (the head's rows)
SCORE_HEAD_LABELS = {"score": 1, "token_scores": 2}


def model_outputs_for(names: Iterable[str]) -> set[str]:
    """Model outputs the learner must compute before `prepare` to provide `names` (`entropy` is the
    token-mean of `token_entropy`)."""
    names = set(names)
    out = names & MODEL_OUTPUTS
    if "entropy" in names:
        out.add("token_entropy")
    return out


def lookup(name: str, batch) -> Any:
    """The value of input `name` in `batch` (context, then row_extras, then extras), None if absent."""
    for store in (batch.context, batch.row_extras, batch.extras):
        if name in store:
            return store[name]
    return None


def optional_inputs(fn, required: Iterable[str], batch, knobs: dict[str, Any]) -> dict[str, Any]:
    """Keyword parameters of `fn` (after the three positional ones) that the batch carries and that
    neither `required` nor the knobs set (e.g. P-GRPO's `step` for its ramp)."""
    params = list(inspect.signature(fn).parameters.values())[3:]
    found = {}
    for p in params:
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.name in knobs or p.name in set(required):
            continue
        value = lookup(p.name, batch)
        if value is not None:
            found[p.name] = value
    return found


def gather(names: Iterable[str], batch) -> dict[str, Any]:
    """Keyword arguments for a function that requires `names`; a missing one raises, naming it."""
    found = {}
    for name in sorted(names):
        value = lookup(name, batch)
        if value is None:
            raise ValueError(f"the batch lacks the input {name!r}; the training loop provides it only when "
                             "the algorithm declares it (see docs/methods/inputs.md)")
        found[name] = value
    return found
