"""Tree rollouts: segment-level branching from shared prefixes under a leaf budget (specs §6.1, TreePO / TreeRL).

A prompt's n completions are the leaves of a tree instead of n independent samples. Completions are decoded in
segments of `segment_tokens` tokens; after each segment every branch still going is continued by `divergence`
children, each a fresh sample given the branch's tokens so far, until depth `depth`, whose segment runs to the
end (`rollout.max_new_tokens` in all). A branch that ends (EOS, or the token limit) is a leaf. The leaves are
kept at n: the first depth has max(1, n // divergence^(depth−1)) branches, and a depth's children are capped
by the leaves still to make; at the last depth the branches still going share them out (TreePO's fallback,
when branches ended early). Sampling is one batched `continue_from` call per depth over every prompt's
branches, so the engine's prefix reuse (the hf engine's kept KV, vLLM's prefix cache) prefills each parent's
tokens once for its children.

Each leaf is one completion: its path's tokens, behaviour log-probs and versions exactly as sampled, and
`info["tree"] = {"nodes": [...], "ends": [...]}`, the path's node ids (the first depth's "0", "1", …; a child's
id is its parent's + "." + its index) and where each node's segment ends in the completion: the contract the
tree advantages read (`algos.tree_credit`). A segment shared by several leaves has the same tokens in each;
with `prefix_dedup` only the first leaf through a node (in path order) keeps it in the loss, so each
generated token is trained once (exact for the estimators that give a node one advantage in every leaf).
Where a segment before the last depth ends is `split` (`cut_segment`): after `segment_tokens` tokens
(`tokens`), at the first step delimiter at or after them (`delimiter`, matched as `step_ends` matches it,
within `max_segment_tokens`), or just before the segment's most uncertain token (`entropy`); the tokens
past the cut are dropped and the children resample from there.
Confidence: medium for the sampler (TreePO's divergence heuristics were not traced line by line). For
`split: entropy` the sampled token's −log-prob stands in for TreeRL's entropy; confidence: low —
reconstructed from the abstract.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lmrl.envs.controllers import ROLLOUT_CONTROLLERS, Prefix, continue_from, continue_within, needs_tokenizer, step_ends

if TYPE_CHECKING:
    from lmrl.engines.base import Completion, SamplingParams


SPLITS = ("tokens", "delimiter", "entropy")


class TreeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    segment_tokens: int = Field(32, ge=1)  # tokens per segment before the last depth (TreePO's step_size)
    divergence: int = Field(2, ge=1)  # children of a branch still going
    depth: int = Field(3, ge=1)  # segments on a path; the last one runs to the end
    prefix_dedup: bool = False  # train each shared segment once (in the first leaf through it)
    split: Literal["tokens", "delimiter", "entropy"] = "tokens"  # where a segment ends (`cut_segment`)
    delimiter: str = Field("\n", min_length=1)  # split=delimiter: the step delimiter's text
    max_segment_tokens: int | None = Field(None, ge=1)  # split=delimiter: the longest segment (default 2x)

    @model_validator(mode="after")
    def _longest(self):
        if self.max_segment_tokens is not None and self.max_segment_tokens < self.segment_tokens:
            raise ValueError(f"max_segment_tokens={self.max_segment_tokens} must be at least segment_tokens="
                             f"{self.segment_tokens}")
        return self

    @property
    def window(self) -> int:
        """The tokens sampled for a segment before it is cut."""
        if self.split == "delimiter":
            return self.max_segment_tokens or 2 * self.segment_tokens
        return self.segment_tokens


def cut_segment(t: TreeParams, ids: list[int], logprobs: list[float], tokenizer) -> int:
    """How many of a segment's sampled tokens the node keeps (the rest are dropped; children resample them).

    `tokens`: all. `delimiter`: up to the end of the first step delimiter (`step_ends`) at or after
    `segment_tokens` tokens, else all (the window `max_segment_tokens`). `entropy`: up to the most uncertain
    token, the highest −log-prob of the sampled token after the first, which the children resample (the
    sampled token's surprisal stands in for TreeRL's entropy)."""
    if t.split == "delimiter":
        return next((e for e in step_ends(ids, tokenizer, t.delimiter) if e >= t.segment_tokens), len(ids))
    if t.split == "entropy" and len(ids) > 1:
        return 1 + max(range(len(ids) - 1), key=lambda i: -logprobs[i + 1])
    return len(ids)


@dataclass
class Node:
    """One segment of a tree: its tokens (after its parent's), and whether its branch has ended there."""

    id: str
    prompt: int
    parent: "Node | None"
    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    ended: bool

    def path(self) -> list["Node"]:
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def prefix(self, prompt: list[int]) -> Prefix:
        nodes = self.path()
        return Prefix(prompt, [t for n in nodes for t in n.ids], [x for n in nodes for x in n.logprobs],
                      [v for n in nodes for v in n.versions])


def share_out(leaves: int, branches: int, cap: int | None) -> list[int]:
    """Children per branch: one each, then round-robin up to `cap` each, `leaves` in all at most."""
    counts = [1] * branches
    total, i = branches, 0
    while total < leaves and (cap is None or total < cap * branches):
        if cap is None or counts[i % branches] < cap:
            counts[i % branches] += 1
            total += 1
        i += 1
    return counts


@ROLLOUT_CONTROLLERS.register("tree", "segment-level tree rollouts: branch every live path `divergence` ways "
                                      "after each segment, n leaves per prompt (TreePO / TreeRL)")
class TreeRollout:
    def __init__(self, tokenizer=None, **params):
        self.params = TreeParams(**params)
        self.tokenizer = tokenizer

    def complete(self, engine, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[list[Completion]]:
        t = self.params
        if t.split == "delimiter":
            needs_tokenizer(self.tokenizer, "tree", "with split=delimiter decodes segments to find the delimiter")
        width = max(1, min(n, n // t.divergence ** (t.depth - 1)))
        todo = [(p, str(i), None) for p in range(len(prompts)) for i in range(width)]
        leaves: list[list[Node]] = [[] for _ in prompts]
        left = [n] * len(prompts)
        budget = params.max_new_tokens
        for depth in range(1, t.depth + 1):
            last = depth == t.depth
            prefixes = [parent.prefix(prompts[p]) if parent else Prefix(prompts[p]) for p, _, parent in todo]
            keep = replace(params, keep_prefix=True)
            sampled = (continue_within(engine, prefixes, keep, budget, generator) if last else continue_from(
                engine, prefixes, replace(keep, max_new_tokens=t.window), generator))
            live: list[list[Node]] = [[] for _ in prompts]
            for (p, node_id, parent), prefix, c in zip(todo, prefixes, sampled):
                start = len(prefix.ids)
                ids, logprobs, versions = c.token_ids[start:budget], c.logprobs[start:budget], c.policy_version[start:budget]
                finish = "length" if len(c.token_ids) > budget else c.finish_reason
                kept = len(ids) if last else cut_segment(t, ids, logprobs, self.tokenizer)
                ended = last or start + kept >= budget or (kept == len(ids) and finish == "stop")
                node = Node(node_id, p, parent, ids[:kept], logprobs[:kept], versions[:kept], finish, ended)
                (leaves[p] if ended else live[p]).append(node)
                left[p] -= ended
            todo = []
            for p, branches in enumerate(live):
                cap = None if depth + 1 == t.depth else t.divergence
                for node, count in zip(branches, share_out(left[p], len(branches), cap) if branches else []):
                    todo += [(p, f"{node.id}.{k}", node) for k in range(count)]
            if not todo:
                break
        return [self._completions(sorted(ends, key=path_order)) for ends in leaves]

    def _completions(self, leaves: list[Node]) -> list[Completion]:
        from lmrl.engines.base import Completion

        trained: set[str] = set()
        out = []
        for leaf in leaves:
            nodes = leaf.path()
            ids = [tok for node in nodes for tok in node.ids]
            ends, mask, at = [], [], 0
            for node in nodes:
                at += len(node.ids)
                ends.append(at)
                keep = not self.params.prefix_dedup or node.id not in trained
                mask += [int(keep)] * len(node.ids)
                trained.add(node.id)
            out.append(Completion(ids, [x for node in nodes for x in node.logprobs], leaf.finish_reason,
                                  [v for node in nodes for v in node.versions],
                                  mask if self.params.prefix_dedup else None,
                                  {"tree": {"nodes": [node.id for node in nodes], "ends": ends}}))
        return out


def path_order(node: Node) -> tuple[int, ...]:
    return tuple(int(part) for part in node.id.split("."))


def tree_metrics(groups) -> dict[str, float]:
    """Generated tokens counted once per node against once per leaf, over the groups' tree rollouts."""
    unique = leaf = 0
    for g in groups:
        seen: dict[str, int] = {}
        for x in g.samples:
            tree = x.info.get("tree")
            if tree is None:
                continue
            leaf += len(x.completion_ids)
            starts = [0] + tree["ends"][:-1]
            seen.update({node: end - start for node, start, end in zip(tree["nodes"], starts, tree["ends"])})
        unique += sum(seen.values())
    if not leaf:
        return {}
    return {"rollout/tree_tokens": float(unique), "rollout/leaf_tokens": float(leaf),
            "rollout/tree_token_share": unique / leaf}
