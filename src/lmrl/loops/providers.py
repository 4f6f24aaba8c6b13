"""How the loop gets the per-sample inputs an algorithm declares: it asks the input providers.

The providers and their registry are in `lmrl.data.inputs` (those that run the model in
`lmrl.learners.inputs`). The loop requests what the algorithm declares (`requested_inputs`) and runs
every provider that fills one of those names, or fills every batch (`always`): the providers that
need no learner when the batch is assembled, the others just before `Algorithm.prepare`. Config
validation checks a method's declared inputs against `provided_inputs()` (`lmrl.learners.inputs`).
docs/architecture.md.
"""
from __future__ import annotations

import lmrl.learners.inputs  # noqa: F401  (registers the providers that run the model)
from lmrl.algos.inputs import canonical
from lmrl.data.inputs import PROVIDERS, InputContext
from lmrl.types import Batch


def requested_inputs(algorithm) -> frozenset[str]:
    """The inputs the algorithm declares: its estimator's and loss's, the reference policy's log-probs
    when it needs them, and the model outputs it reads before `prepare`."""
    reference = {"ref_logp"} if algorithm.needs_reference else set()
    return frozenset(canonical(algorithm.requires) | reference | algorithm.prepare_outputs)


def provide(batch: Batch, ctx: InputContext, with_learner: bool) -> None:
    """Run, in registration order, the providers of the requested inputs and those that always fill:
    with `with_learner`, the ones that need the learner, otherwise the others."""
    for name in PROVIDERS.in_order():
        spec = PROVIDERS.spec(name)
        if ("learner" in spec.needs) != with_learner or not (spec.always or spec.provides & ctx.requested):
            continue
        missing = sorted(n for n in spec.needs if getattr(ctx, n) is None)
        if missing:
            raise ValueError(f"input provider {name!r} needs {missing}, which the loop did not give it")
        PROVIDERS.get(name)(batch, ctx)
