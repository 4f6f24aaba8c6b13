"""The `teacher_logp` provider: teacher log-probs for distillation from a privileged context (the distill
term; contexts: algos/teacher.py).

The teacher prompt is the sample's opening chat (an episode's messages before its first reply, or the
single-turn prompt of its task row) with the context appended to the last user message
(`with_context`), encoded with the tokenizer's chat template and the environment's tool schemas, as
the student's prompt was. The sample's completion ids follow it unchanged, environment tokens
included, so completion token j is the same token under both prompts. The current policy scores them
in a no-grad pass.
"""
from __future__ import annotations

import torch

from lmrl.algos.teacher import DISTILL_INPUTS, distill_mask, opening_end, with_context
from lmrl.envs import build_env, prompt_messages
from lmrl.envs.chat import encode_opening
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.types import Batch, Sample, collate


def teacher_prompt_ids(sample: Sample, row: dict, context: str, tokenizer, system_prompt: str | None,
                       tools: list | None = None) -> list[int]:
    """Token ids of the sample's opening chat with `context` appended, ending with the assistant header."""
    if sample.info.get("messages"):
        opening = sample.info["messages"][: opening_end(sample)]
    else:
        opening = prompt_messages(row, system_prompt)
    return encode_opening(tokenizer, with_context(opening, context), tools)


def teacher_inputs(batch: Batch, samples: list[Sample], rows: list[dict], learner, tokenizer, cfg, context,
                   tokens: str) -> None:
    """Fill `extras["teacher_logp"]`, `extras["teacher_mask"]` [B, T] and `row_extras["has_teacher"]` [B].

    A sample is correct when its `reward.accuracy_component` is >= 1; `context(samples, rows, correct)`
    gives each sample its privileged text or None. Rows without a teacher get log-prob 0 and mask 0."""
    name = cfg.reward.accuracy_component
    texts = context(samples, rows, [(x.rewards.get(name) or 0.0) >= 1.0 for x in samples])
    logp, mask = torch.zeros_like(batch.completion_mask), torch.zeros_like(batch.completion_mask)
    taught = [i for i, text in enumerate(texts) if text]
    if taught:
        tools = getattr(build_env(cfg.env.name, cfg.env.params), "tools", None) if cfg.env.name else None
        teacher = [Sample(teacher_prompt_ids(samples[i], rows[i], texts[i], tokenizer, cfg.task.system_prompt, tools),
                          samples[i].completion_ids, [0.0] * len(samples[i].completion_ids), reward=0.0,
                          loss_mask=samples[i].loss_mask) for i in taught]
        scored = learner.logprobs(collate(teacher, list(range(len(teacher))), pad_id=0))
        for k, i in enumerate(taught):
            n, src, dst = len(samples[i].completion_ids), len(teacher[k].prompt_ids) - 1, len(samples[i].prompt_ids) - 1
            logp[i, dst:dst + n] = scored[k, src:src + n]
            mask[i, dst:dst + n] = torch.tensor(distill_mask(samples[i], tokens), dtype=mask.dtype)
    batch.extras.update(teacher_logp=logp, teacher_mask=mask)
    batch.row_extras["has_teacher"] = torch.tensor([float(bool(text)) for text in texts])


@PROVIDERS.register("teacher_logp", "the current policy's log-probs of each completion under its privileged-context "
                    "teacher prompt, and the tokens distilled (the distill term)",
                    provides=DISTILL_INPUTS | {"has_teacher"},
                    needs={"learner", "tokenizer", "samples", "rows", "cfg", "algorithm"})
def teacher_logprobs(batch: Batch, ctx: InputContext) -> None:
    teacher_inputs(batch, ctx.samples, ctx.rows, ctx.learner, ctx.tokenizer, ctx.cfg, ctx.algorithm.built["distill"],
                   ctx.algorithm.term("distill").settings["tokens"])
