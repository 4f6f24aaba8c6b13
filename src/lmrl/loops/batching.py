"""Batch assembly: the scored samples of the kept groups, collated, in their advantage groups, with the
inputs that the providers fill from the samples alone."""
from __future__ import annotations

from lmrl.inputs import InputContext, provide
from lmrl.types import Batch, collate


def advantage_groups(ctx: InputContext) -> list[int]:
    """The advantage group of each batch row: one per prompt, or per value of the task field
    `algo.group_by`; a group with rows outside the advantage estimate is never pooled with another."""
    group_by = ctx.cfg.algo.group_by
    keys: dict = {}
    index = []
    for position, group in enumerate(ctx.groups):
        scored = group.scored
        if not all(x.in_advantage for x in scored):
            key = ("apart", position)
        else:
            key = position if group_by is None else repr(group.row[group_by])
        index += [keys.setdefault(key, len(keys))] * len(scored)
    return index


def to_batch(ctx: InputContext, pad_id: int) -> Batch | None:
    """The collated batch of `ctx.groups` with its sample inputs; None when no sample was scored."""
    if not ctx.samples:
        return None
    batch = collate(ctx.samples, advantage_groups(ctx), pad_id)
    provide(batch, ctx, with_learner=False)
    return batch
