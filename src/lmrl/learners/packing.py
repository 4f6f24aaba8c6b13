"""Shared-prompt packing: the samples of one prompt train in one row, the prompt computed once.

A packed row is `prompt, completion_1, …, completion_G`. Each completion attends to the prompt and
causally to itself, never to its siblings; its position ids continue from the prompt's end. The
forward pass therefore gives exactly the per-sample log-probs of separate rows, while the prompt's
tokens are processed once per group instead of G times (GRPO groups share their prompt). Only the
positions that predict a generated token reach the LM head; each row's last token (`last_row`,
`last_pos`) is where a sequence-level head (the reward model's score) reads it, and each generated
token's own position (`own_pos`) where a per-token head (a process reward model's) reads it.
"""
from __future__ import annotations

import bisect
from collections import defaultdict, deque
from dataclasses import dataclass

import torch

from lmrl.types import Batch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [n, W]
    position_ids: torch.Tensor  # [n, W]
    attention_mask: torch.Tensor  # [n, 1, W, W] bool, True = may attend
    src_row: torch.Tensor  # [N] packed row of each predicting position
    src_pos: torch.Tensor  # [N] its position in the packed row
    dst_row: torch.Tensor  # [N] the Batch row this prediction belongs to
    dst_t: torch.Tensor  # [N] its (shifted) position in that Batch row
    targets: torch.Tensor  # [N] the token being predicted
    own_pos: torch.Tensor  # [N] the predicted token's own position in the packed row (a per-token head reads it)
    lengths: list[int]  # packed row lengths
    last_row: torch.Tensor  # [b] packed row holding each Batch row's last token
    last_pos: torch.Tensor  # [b] that token's position in the packed row


def prompt_length(batch: Batch, row: int) -> int:
    positions = torch.nonzero(batch.completion_mask[row]).squeeze(1)
    return int(positions[0]) + 1 if len(positions) else int(batch.attention_mask[row].sum())


def prompt_units(batch: Batch) -> list[list[int]]:
    """Rows grouped by identical prompt token ids (the unit that shares one prompt)."""
    units: dict[tuple, list[int]] = {}
    for row in range(batch.num_rows):
        p = prompt_length(batch, row)
        units.setdefault((int(batch.group_index[row]), tuple(batch.input_ids[row, :p].tolist())), []).append(row)
    return list(units.values())


def packed_length(batch: Batch, rows: list[int]) -> int:
    p = prompt_length(batch, rows[0])
    return p + sum(int(batch.attention_mask[r].sum()) - p for r in rows)


def pack(batch: Batch, units: list[list[int]], pad_id: int, bins: list[list[int]] | None = None) -> PackedBatch:
    """The packed rows of `units`: by default one unit per row; `bins` (lists of unit indices) put several units
    in one row, each attending only within itself, its position ids starting at 0 (document packing)."""
    bins = bins if bins is not None else [[u] for u in range(len(units))]
    lengths = [sum(packed_length(batch, units[u]) for u in members) for members in bins]
    width = max(lengths)
    n = len(bins)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, 1, width, width), dtype=torch.bool)
    src_row, src_pos, dst_row, dst_t, targets, own_pos = [], [], [], [], [], []
    last_row, last_pos = [0] * batch.num_rows, [0] * batch.num_rows
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for i, members in enumerate(bins):
        cursor = 0
        for u in members:
            rows, start = units[u], cursor
            p = prompt_length(batch, rows[0])
            prompt = slice(start, start + p)
            ids[i, prompt] = batch.input_ids[rows[0], :p]
            pos[i, prompt] = torch.arange(p)
            mask[i, 0, prompt, prompt] = causal[:p, :p]
            cursor = start + p
            for r in rows:
                total = int(batch.attention_mask[r].sum())
                comp = batch.input_ids[r, p:total]
                c = len(comp)
                span = slice(cursor, cursor + c)
                ids[i, span] = comp
                pos[i, span] = torch.arange(p, p + c)
                mask[i, 0, span, prompt] = True
                mask[i, 0, span, span] = causal[:c, :c]
                # token k of the completion (Batch position p+k) is predicted from the prompt's last
                # position for k = 0, and from the completion's own previous token otherwise
                src_row += [i] * c
                src_pos += [start + p - 1] + list(range(cursor, cursor + c - 1))
                dst_row += [r] * c
                dst_t += list(range(p - 1, p - 1 + c))
                targets += comp.tolist()
                own_pos += list(range(cursor, cursor + c))
                last_row[r], last_pos[r] = i, cursor + c - 1 if c else start + p - 1
                cursor += c
        for j in range(cursor, width):  # padding attends to itself only (no empty softmax rows)
            mask[i, 0, j, j] = True
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return PackedBatch(ids, pos, mask, as_long(src_row), as_long(src_pos), as_long(dst_row), as_long(dst_t),
                       as_long(targets), as_long(own_pos), lengths, as_long(last_row), as_long(last_pos))


def unit_bins(batch: Batch, units: list[list[int]]) -> list[list[int]]:
    """Units binned best-fit decreasing into rows no longer than the longest unit: the packed width stays that
    of the unpacked micro-batch, and the rows a shorter unit would have padded hold other units instead."""
    lengths = [packed_length(batch, u) for u in units]
    return pack_documents(lengths, max(lengths))


def fill_budget(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped, shortest first, so that count × longest length stays within `budget` tokens.

    An item longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and (len(current) + 1) * lengths[i] > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def budget_units(batch: Batch, budget: int) -> list[list[list[int]]]:
    """Micro-batches of prompt units whose padded packed size stays within `budget` tokens."""
    units = prompt_units(batch)
    return [[units[i] for i in group] for group in fill_budget([packed_length(batch, u) for u in units], budget)]


def pack_documents(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Best-fit-decreasing packing (TRL's `bfd`): the documents' indices in bins of at most `max_tokens`
    tokens. Longest first (a document longer than `max_tokens` counts as `max_tokens`: the caller truncates
    it); each goes to the bin with the least room that fits it (the oldest such bin on a tie), or a new bin."""
    if any(n <= 0 for n in lengths):
        raise ValueError(f"pack_documents: every document needs at least one token, got lengths {lengths}")
    sizes = [min(n, max_tokens) for n in lengths]
    bins: list[list[int]] = []
    rooms: list[int] = []  # the distinct free rooms of the bins, sorted
    by_room: dict[int, deque[int]] = defaultdict(deque)  # free room -> the bins with that room, oldest first
    for doc in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        size = sizes[doc]
        at = bisect.bisect_left(rooms, size)
        if at < len(rooms):
            room = rooms[at]
            target = by_room[room].popleft()
            if not by_room[room]:
                rooms.pop(at)
        else:
            room, target = max_tokens, len(bins)
            bins.append([])
        bins[target].append(doc)
        left = room - size
        if left:
            if not by_room[left]:
                bisect.insort(rooms, left)
            by_room[left].append(target)
    return bins


def row_groups(batch: Batch) -> list[list[int]]:
    """The batch's rows by group (`group_index`), in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(batch.group_index.tolist()):
        groups.setdefault(g, []).append(row)
    return list(groups.values())


def group_budget(batch: Batch, budget: int) -> list[list[int]]:
    """Micro-batches of whole groups, shortest first, each within `budget` padded tokens (rows × longest row);
    a group over the budget gets one of its own."""
    lengths = batch.attention_mask.sum(1).tolist()
    groups = sorted(row_groups(batch), key=lambda g: max(lengths[r] for r in g))
    batches: list[list[int]] = []
    for group in groups:
        longest = max(lengths[r] for r in group)
        if batches and (len(batches[-1]) + len(group)) * longest > budget:
            batches.append([])
        if not batches:
            batches.append([])
        batches[-1].extend(group)
    return batches
