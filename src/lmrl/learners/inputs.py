"""The input providers that run the model: they need the learner, so they run on the assembled batch,
just before `Algorithm.prepare`, in this order (`lmrl.data.inputs` has the registry). With them every
provider is registered, so `provided_inputs` here is the whole list config validation checks against."""
from __future__ import annotations

from lmrl.algos.inputs import ALIASES, MODEL_OUTPUTS
from lmrl.data.inputs import PROVIDERS, InputContext
from lmrl.algos.teacher import DISTILL_INPUTS
from lmrl.learners.pmi import pmi, pmi_field
from lmrl.learners.teacher import teacher_inputs
from lmrl.types import Batch


@PROVIDERS.register("rollout_logp", "behaviour log-probs: the engine's or the peer's; rows whose origin brings none "
                    "(demonstrations) get the current policy's, so their importance ratio starts at 1",
                    needs={"learner", "samples"}, always=True)
def behaviour_logprobs(batch: Batch, ctx: InputContext) -> None:
    rows = [i for i, x in enumerate(ctx.samples) if not x.origin.brings_logprobs]
    if rows:
        batch.behaviour_logprobs[rows] = ctx.learner.logprobs(batch, rows=rows)[rows]


@PROVIDERS.register("ref_logp", "the frozen reference policy's log-probs", needs={"learner"})
def reference_logprobs(batch: Batch, ctx: InputContext) -> None:
    batch.extras["ref_logp"] = ctx.learner.logprobs(batch, reference=True)


@PROVIDERS.register("pmi", "per-token PMI of each completion with its prompt's evidence (learners/pmi.py)",
                    needs={"learner", "tokenizer", "rows", "cfg"})
def pointwise_mutual_information(batch: Batch, ctx: InputContext) -> None:
    batch.extras["pmi"] = pmi(batch, ctx.rows, ctx.learner, ctx.tokenizer, ctx.cfg.task.system_prompt,
                              pmi_field(ctx.cfg.algo.advantage_params))


@PROVIDERS.register("model_outputs", "the model outputs the estimator reads, from a no-grad pass (value-head "
                    "values, hidden states, exact token entropies, and their token-mean `entropy`)",
                    provides=MODEL_OUTPUTS | {"entropy"}, needs={"learner", "algorithm"})
def model_outputs(batch: Batch, ctx: InputContext) -> None:
    outputs = ctx.algorithm.prepare_outputs
    if outputs:
        batch.extras.update(ctx.learner.model_outputs(batch, outputs, ctx.algorithm.hidden_layer))


@PROVIDERS.register("old_logp", "the current policy's log-probs before the update (the learner recomputes them "
                    "in `update` when the loss rejects tokens or takes several optimiser steps)", needs={"learner"})
def old_logprobs(batch: Batch, ctx: InputContext) -> None:
    batch.extras["old_logp"] = ctx.learner.logprobs(batch)


@PROVIDERS.register("teacher_logp", "the current policy's log-probs of each completion under its privileged-context "
                    "teacher prompt, and the tokens distilled (the distill term, learners/teacher.py)",
                    provides=DISTILL_INPUTS | {"has_teacher"},
                    needs={"learner", "tokenizer", "samples", "rows", "cfg", "algorithm"})
def teacher_logprobs(batch: Batch, ctx: InputContext) -> None:
    teacher_inputs(batch, ctx.samples, ctx.rows, ctx.learner, ctx.tokenizer, ctx.cfg, ctx.algorithm.built["distill"],
                   ctx.algorithm.term("distill").settings["tokens"])


def provided_inputs() -> set[str]:
    """Every per-sample input name some provider can fill (with the estimators' aliases of them)."""
    names = {name for spec in PROVIDERS.specs().values() for name in spec.provides}
    return names | {alias for alias, target in ALIASES.items() if target in names}
