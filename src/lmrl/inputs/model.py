"""The providers that run the model: they need the learner (`ctx.learner`), so they run on the assembled
batch, just before `Algorithm.prepare`."""
from __future__ import annotations

import torch

from lmrl.algos.gather import MODEL_OUTPUTS
from lmrl.algos.preference_losses import kto_reference_point
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.stats import masked_mean
from lmrl.types import Batch, Origin, Sample, collate

REF_LOGP = "ref_logp"  # Sample.info key of an offline row's reference log-probs, per completion token


@PROVIDERS.register("rollout_logp", "behaviour log-probs: the engine's or the peer's; rows whose origin brings none "
                    "(demonstrations) get the current policy's, so their importance ratio starts at 1 (a batch "
                    "without a policy-gradient term, which no ratio reads, gets none)",
                    needs={"learner", "samples"}, always=True)
def behaviour_logprobs(batch: Batch, ctx: InputContext) -> None:
    if ctx.algorithm is not None and not ctx.algorithm.policy_gradient:
        return
    rows = [i for i, x in enumerate(ctx.samples) if not x.origin.brings_logprobs]
    if rows:
        batch.behaviour_logprobs[rows] = ctx.learner.logprobs(batch, rows=rows)[rows]


@PROVIDERS.register("ref_logp", "the frozen reference policy's log-probs (an offline dataset's rows: computed once, "
                    "the first time a row is trained, and kept with it)", needs={"learner", "samples"})
def reference_logprobs(batch: Batch, ctx: InputContext) -> None:
    samples = ctx.samples
    cached = [x.origin is Origin.DATASET and REF_LOGP in x.info for x in samples]
    todo = [i for i, hit in enumerate(cached) if not hit]
    out = ctx.learner.logprobs(batch, reference=True, rows=todo) if todo else torch.zeros_like(batch.completion_mask)
    for i, x in enumerate(samples):
        start, n = len(x.prompt_ids) - 1, len(x.completion_ids)
        if cached[i]:
            out[i, start: start + n] = x.info[REF_LOGP]
        elif x.origin is Origin.DATASET:  # fixed tokens, frozen reference: the same values every epoch
            x.info[REF_LOGP] = out[i, start: start + n].clone()
    batch.extras["ref_logp"] = out


def estimate_entropy(batch: Batch) -> float:
    """Token-mean of `token_entropy` over the generated tokens of the rows in the advantage estimate
    (all rows unless `row_extras["in_advantage"]` leaves some out), as the estimator sees them."""
    in_advantage = batch.row_extras.get("in_advantage")
    if in_advantage is not None and not bool(in_advantage.all()):
        batch = batch.select(in_advantage.nonzero().flatten().tolist())
    return masked_mean(batch.extras["token_entropy"], batch.completion_mask)


@PROVIDERS.register("model_outputs", "the model outputs the estimator reads, from a no-grad pass (value-head "
                    "values, hidden states, exact token entropies, and their token-mean `entropy` in the context)",
                    provides=MODEL_OUTPUTS | {"entropy"}, needs={"learner", "algorithm"})
def model_outputs(batch: Batch, ctx: InputContext) -> None:
    outputs = ctx.algorithm.prepare_outputs
    if outputs:
        batch.extras.update(ctx.learner.model_outputs(batch, outputs, ctx.algorithm.hidden_layer))
    if "token_entropy" in batch.extras:
        batch.context["entropy"] = estimate_entropy(batch)


@PROVIDERS.register("old_logp", "the current policy's log-probs before the update (the learner recomputes them "
                    "in `update` when the loss rejects tokens or takes several optimiser steps)", needs={"learner"})
def old_logprobs(batch: Batch, ctx: InputContext) -> None:
    batch.extras["old_logp"] = ctx.learner.logprobs(batch)


@PROVIDERS.register("kto_z0", "KTO's reference point: the batch mean of log π(y'|x) − log π_ref(y'|x) over mismatched "
                    "(prompt, completion) rows, each prompt with the next row's completion, clamped at 0, without "
                    "gradient (spec §2.5)", needs={"learner", "samples"})
def kto_mismatched_reference_point(batch: Batch, ctx: InputContext) -> None:
    samples = ctx.samples
    shifted = [Sample(x.prompt_ids, y.completion_ids, [0.0] * len(y.completion_ids), reward=0.0, loss_mask=y.loss_mask)
               for x, y in zip(samples, samples[1:] + samples[:1])]
    mismatched = collate(shifted, list(range(len(shifted))), pad_id=0)
    ratio = (ctx.learner.logprobs(mismatched) - ctx.learner.logprobs(mismatched, reference=True))
    batch.context["kto_z0"] = float(kto_reference_point((ratio * mismatched.completion_mask).sum(1)))
