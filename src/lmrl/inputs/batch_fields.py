"""The providers computed from the samples, the task rows and the config alone: they need no learner,
so they run when the batch is assembled (`lmrl.loops.batching.to_batch`)."""
from __future__ import annotations

import torch

from lmrl.algos.multi_reward import modality_mask
from lmrl.envs.mixture import TASK_FIELD
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.inputs.vocabulary import ROW_FIELD_INPUTS
from lmrl.types import Batch

@PROVIDERS.register("step", "the training step and the run's total steps (batch context)",
                    provides={"step", "total_steps"}, needs={"cfg", "step"}, always=True)
def training_step(batch: Batch, ctx: InputContext) -> None:
    batch.context.update(step=ctx.step, total_steps=ctx.cfg.trainer.steps)


@PROVIDERS.register("accuracy", "per-sample correctness (reward.accuracy_component >= 1) and its prompt's mean",
                    provides={"acc", "group_acc"}, needs={"cfg", "groups"}, always=True)
def accuracy(batch: Batch, ctx: InputContext) -> None:
    name = ctx.cfg.reward.accuracy_component
    acc, group_acc = [], []
    for group in ctx.groups:
        correct = [float(x.rewards.get(name, 0.0) >= 1.0) for x in group.scored]
        for c in correct:
            acc.append(c)
            group_acc.append(sum(correct) / len(correct))
    batch.extras.update(acc=torch.tensor(acc), group_acc=torch.tensor(group_acc))


@PROVIDERS.register("task_index", "each row's mixture task (its row's `task` field) as an index [B] into the batch "
                    "context's `task_names` (sorted); 0 and no names in a run of one task",
                    needs={"rows"}, always=True)
def task_index(batch: Batch, ctx: InputContext) -> None:
    tasks = [r.get(TASK_FIELD) if isinstance(r.get(TASK_FIELD), str) else "" for r in ctx.rows]
    names = sorted(set(tasks) - {""})
    batch.row_extras["task_index"] = torch.tensor([names.index(t) if t else 0 for t in tasks], dtype=torch.long)
    batch.context["task_names"] = names


@PROVIDERS.register("reward_components", "each reward component's score [B, K] in the order of reward.components "
                    "(NaN where one gave none); when declared, `acoustic_rewards` [B] is the column of the component "
                    "named by the knob acoustic_component of algo.advantage_params (default \"acoustic\")",
                    provides={"reward_components", "acoustic_rewards"}, needs={"cfg", "samples", "requested"},
                    always=True)
def reward_components(batch: Batch, ctx: InputContext) -> None:
    names = [c.name for c in ctx.cfg.reward.components]
    if not names:
        return
    scores = torch.tensor(
        [[float("nan") if x.rewards.get(n) is None else float(x.rewards[n]) for n in names] for x in ctx.samples])
    batch.row_extras["reward_components"] = scores
    batch.context["reward_component_names"] = names
    acoustic = ctx.cfg.algo.advantage_params.get("acoustic_component", "acoustic")
    if "acoustic_rewards" in ctx.requested and acoustic in names:
        batch.row_extras["acoustic_rewards"] = scores[:, names.index(acoustic)]


def row_field_tensor(values: list, name: str) -> torch.Tensor:
    """A task row field as a tensor: numbers give [B], lists give [B, P] padded with NaN (absent entries)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float if any(isinstance(v, float) for v in values) else torch.long)
    if all(isinstance(v, (list, tuple)) for v in values):
        out = torch.full((len(values), max((len(v) for v in values), default=0)), float("nan"))
        for i, v in enumerate(values):
            out[i, : len(v)] = torch.tensor([float("nan") if e is None else float(e) for e in v])
        return out
    raise ValueError(f"task field {name!r} must be a number or a list of numbers in every row")


@PROVIDERS.register("row_fields", "the declared task row fields, each sample carrying its prompt's value",
                    provides=ROW_FIELD_INPUTS, needs={"rows", "requested"})
def row_fields(batch: Batch, ctx: InputContext) -> None:
    for name in sorted(ctx.requested & ROW_FIELD_INPUTS):
        batch.row_extras[name] = row_field_tensor([r[name] for r in ctx.rows], name)


@PROVIDERS.register("origin", "where each row came from (`types.Origin`): `demonstration` 1.0 where the policy "
                    "did not sample it, `in_advantage` False where it stays out of the advantage estimate; each "
                    "only when some row needs it", provides={"demonstration", "in_advantage"}, needs={"samples"},
                    always=True)
def origin_flags(batch: Batch, ctx: InputContext) -> None:
    origins = [x.origin for x in ctx.samples]
    if not all(o.sampled for o in origins):
        batch.row_extras["demonstration"] = torch.tensor([0.0 if o.sampled else 1.0 for o in origins])
    if not all(o.in_advantage for o in origins):
        batch.row_extras["in_advantage"] = torch.tensor([o.in_advantage for o in origins])


@PROVIDERS.register("speech_mask", "the generated tokens whose id lies in the knob speech_id_range [start, end) "
                    "of algo.advantage_params", needs={"cfg"})
def speech_mask(batch: Batch, ctx: InputContext) -> None:
    knobs = ctx.cfg.algo.advantage_params
    if "speech_id_range" in knobs:
        speech = modality_mask(batch.input_ids[:, 1:], knobs["speech_id_range"])
        batch.extras["speech_mask"] = speech * batch.completion_mask


@PROVIDERS.register("preference", "an offline preference source's row labels (`data.sources`): `chosen` 1.0 on a "
                    "pair's chosen row and 0.0 on its rejected one, `pair` its pair (the row's group), `margin` a "
                    "pair's margin column, `desirable` an unpaired row's label", needs={"samples"},
                    provides={"chosen", "pair", "margin", "desirable"}, always=True)
def preference_labels(batch: Batch, ctx: InputContext) -> None:
    info = [x.info for x in ctx.samples]
    if all("preference" in i for i in info):
        batch.row_extras["chosen"] = torch.tensor([1.0 if i["preference"] == "chosen" else 0.0 for i in info])
        batch.row_extras["pair"] = batch.group_index.clone()
    if all("margin" in i for i in info):
        batch.row_extras["margin"] = torch.tensor([float(i["margin"]) for i in info])
    if all("desirable" in i for i in info):
        batch.row_extras["desirable"] = torch.tensor([1.0 if i["desirable"] else 0.0 for i in info])


@PROVIDERS.register("step_labels", "a stepwise source's labels (`data.steps`): `step_labels` [B, T-1], the probability "
                    "that the step ending at each token is correct (0.0 off the step ends, which the loss mask marks)",
                    needs={"samples"}, provides={"step_labels"})
def step_labels(batch: Batch, ctx: InputContext) -> None:
    labels = torch.zeros_like(batch.completion_mask)
    for row, x in enumerate(ctx.samples):
        start = len(x.prompt_ids) - 1
        labels[row, start: start + len(x.completion_ids)] = torch.tensor(x.info["step_labels"], dtype=labels.dtype)
    batch.extras["step_labels"] = labels
