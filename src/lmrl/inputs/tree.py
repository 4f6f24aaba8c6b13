"""The tree node of every completion token, for the estimators that credit the segments of tree rollouts.

A tree rollout makes one sample per leaf: the prompt and the whole path's completion, with
`info["tree"] = {"nodes": ["0", "0.1", "0.1.0"], "ends": [4, 8, 11]}`, the path's node ids from the
root's first child down to the leaf (unique within the prompt's tree) and where each node's segment
ends in the completion (segment k = completion tokens [ends[k-1], ends[k]), ends[-1] =
len(completion_ids)). A sample without `info["tree"]` is a one-node path. The `tree_nodes` provider
numbers the (prompt, node id) pairs of the batch and fills `extras["tree_nodes"]` [B, T-1] like every
per-token input: aligned with `completion_mask`, completion token j of a row at position
len(prompt_ids) - 1 + j, -1 on prompt and padding positions. Environment tokens inside a segment
(loss mask 0) keep their node, so the trees do not depend on which tokens are trained. The estimators
are in `lmrl.algos.tree_credit` (docs/methods/tree_credit.md).
"""
from __future__ import annotations

import torch

from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.types import Batch, Sample


def tree_segments(sample: Sample) -> list[tuple[str | None, int, int]]:
    """(node id, start, end) of each non-empty segment of the sample's completion; one unnamed node without a tree.

    An empty segment (a branch that got no token) has no token to carry its node, so its child hangs
    under the nearest ancestor with tokens. A ValueError names what breaks the layout: nodes and ends
    of different lengths, decreasing ends, or ends that do not finish at the completion's length.
    """
    n = len(sample.completion_ids)
    tree = sample.info.get("tree")
    if tree is None:
        return [(None, 0, n)] if n else []
    nodes, ends = list(tree["nodes"]), [int(e) for e in tree["ends"]]
    if len(nodes) != len(ends) or not nodes:
        raise ValueError(f"info['tree'] needs one end per node, got nodes {nodes} and ends {ends}")
    starts = [0] + ends[:-1]
    if any(e < s for s, e in zip(starts, ends)) or ends[-1] != n:
        raise ValueError(f"info['tree'] ends {ends} must not decrease and must finish at the completion's "
                         f"{n} tokens (nodes {nodes})")
    return [(node, s, e) for node, s, e in zip(nodes, starts, ends) if e > s]


@PROVIDERS.register("tree_nodes", "the tree node of each completion token [B, T-1] (a batch-unique number of the "
                    "(prompt, info['tree'] node id) pair), -1 off the completion", needs={"groups"})
def tree_nodes(batch: Batch, ctx: InputContext) -> None:
    out = torch.full_like(batch.completion_mask, -1, dtype=torch.long)
    numbers: dict[tuple, int] = {}
    tokens: dict[tuple, list[int]] = {}
    row = 0
    for position, group in enumerate(ctx.groups):
        for sample in group.scored:
            offset = len(sample.prompt_ids) - 1
            for node, start, end in tree_segments(sample):
                key = (position, node) if node is not None else (position, None, row)
                segment = sample.completion_ids[start:end]
                if tokens.setdefault(key, segment) != segment:
                    raise ValueError(f"prompt {group.uid!r}: node {node!r} holds different tokens in two leaves")
                out[row, offset + start: offset + end] = numbers.setdefault(key, len(numbers))
            row += 1
    batch.extras["tree_nodes"] = out
