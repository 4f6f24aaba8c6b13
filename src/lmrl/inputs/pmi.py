"""The `pmi` provider: per-token pointwise mutual information of each completion with the prompt's evidence
(P-GRPO's `pmi`).

PMI_t = log p(y_t | x, y<t) − log p(y_t | x⁻, y<t), where x⁻ is the prompt without its evidence:
the task row's field named by the knob `pmi_field` (default "question_without_evidence"), encoded
with the same chat template and system prompt. Both terms come from the current (pre-update)
policy in no-grad passes, so the completion is scored under two prompts by one model.
"""
from __future__ import annotations

import torch

from lmrl.envs import encode_prompt
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.inputs.vocabulary import pmi_field
from lmrl.types import Batch, Sample, collate


def completion_logprobs(logp: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's log-probs at its generated positions, in order."""
    return [logp[r][mask[r] > 0] for r in range(mask.shape[0])]


def pmi(batch: Batch, rows: list[dict], learner, tokenizer, system_prompt: str | None, field: str) -> torch.Tensor:
    """[B, T] PMI of the batch's generated tokens (0 elsewhere); `rows[i]` is row i's task row."""
    mask = batch.completion_mask
    samples = []
    for r, row in enumerate(rows):
        ids = _completion_ids(batch, r)
        prompt = encode_prompt(tokenizer, {"question": row[field]}, system_prompt)
        samples.append(Sample(prompt, ids, [0.0] * len(ids), reward=0.0))
    without = collate(samples, batch.group_index.tolist(), pad_id=0)
    with_evidence = completion_logprobs(learner.logprobs(batch), mask)
    without_evidence = completion_logprobs(learner.logprobs(without), without.completion_mask)
    out = torch.zeros_like(mask)
    for r in range(mask.shape[0]):
        out[r, mask[r] > 0] = with_evidence[r] - without_evidence[r]
    return out


def _completion_ids(batch: Batch, row: int) -> list[int]:
    """The generated token ids of a row: position t of the mask predicts token t+1."""
    positions = torch.nonzero(batch.completion_mask[row]).squeeze(1) + 1
    return batch.input_ids[row, positions].tolist()


@PROVIDERS.register("pmi", "per-token PMI of each completion with its prompt's evidence",
                    needs={"learner", "tokenizer", "rows", "cfg"})
def pointwise_mutual_information(batch: Batch, ctx: InputContext) -> None:
    batch.extras["pmi"] = pmi(batch, ctx.rows, ctx.learner, ctx.tokenizer, ctx.cfg.task.system_prompt,
                              pmi_field(ctx.cfg.algo.advantage_params))
