"""Advantages from tree rollouts: each node valued by the leaves below it, credit per segment (TreePO, TreeRL).

A tree rollout branches a prompt's completion at segment boundaries. Every leaf is one batch row (the
prompt and its whole path), and the input `tree_nodes` [B, T] gives the node each completion token
belongs to (-1 elsewhere; `lmrl.inputs.tree`). A row's path is its node ids in the order they appear;
the root of every tree is the row's advantage group. The rows' rewards (row sums of `token_rewards`)
give every node a value V(n) (`node_values`), and each estimator turns the values into per-token
advantages:

- `tree_segment` (TreePO's segment advantage): A = V(n_k) − V(n_{k−1}) on the tokens of segment k;
- `treerl` (TreeRL): R(n) = [V(n) − V(root) + V(n) − V(parent)] / √|L(n)| on n's tokens;
- `tree_subgroup` (TreePO's subgroup baseline): one advantage per leaf from its ancestors' subgroups,
  whitened over the batch's tokens;
- `tree_progress` (TreePO's progress): leaf rewards made relative to their ancestors, then segment advantages.

Formulas, knobs and the hand-computed checks: docs/methods/tree_credit.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.advantages import ADVANTAGES, masked_whiten, required, sequence_scores, to_tokens
from lmrl.stats import group_slots

NODE_VALUES = ("leaf_mean", "child_mean")
ROOT_VALUES = ("leaves", "zero")
WEIGHTED_VALUE_STYLES = ("sqrt", "uniform", "original")
WEIGHTINGS = ("group_size", "average")


def choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Forest:
    """The trees of one batch, read off the per-token node ids; nodes are numbered 0..N-1."""

    token_node: torch.Tensor  # [B, T] the node of each token, -1 where there is none
    through: torch.Tensor  # [B, N] bool: the row's path passes through the node
    parent: torch.Tensor  # [N] the parent node, -1 for a child of the root
    depth: torch.Tensor  # [N] 1 for a child of the root
    root: torch.Tensor  # [N] the node's tree: its rows' group slot
    row_root: torch.Tensor  # [B] each row's group slot
    leaf: torch.Tensor  # [B] the row's last node, -1 for a row without tokens
    num_roots: int

    @property
    def leaf_depth(self) -> torch.Tensor:
        """[B] the depth of each row's leaf (0 for a row without tokens)."""
        return torch.where(self.leaf >= 0, self.depth[self.leaf.clamp(min=0)], torch.zeros_like(self.leaf))

    def per_token(self, per_node: torch.Tensor) -> torch.Tensor:
        """[B, T] each token's value of its node, 0 where there is no node."""
        on = self.token_node >= 0
        return torch.where(on, per_node[self.token_node.clamp(min=0)], torch.zeros((), dtype=per_node.dtype))


def read_forest(tree_nodes: torch.Tensor, group_index: torch.Tensor) -> Forest:
    """The trees of a batch: each row's path is the order in which its node ids appear.

    A node's tokens must be contiguous in a row, and a node shared by several rows must have the same
    parent and group in each (the tree sampler guarantees both); a ValueError says which row breaks it.
    """
    tree_nodes = tree_nodes.long()
    valid = tree_nodes >= 0
    ids = torch.unique(tree_nodes[valid])
    token_node = torch.full_like(tree_nodes, -1)
    token_node[valid] = torch.searchsorted(ids, tree_nodes[valid])
    row_root, counts = group_slots(group_index)
    n = len(ids)
    parent = torch.full((n,), -2, dtype=torch.long)
    depth = torch.zeros(n, dtype=torch.long)
    root = torch.full((n,), -1, dtype=torch.long)
    through = torch.zeros((tree_nodes.shape[0], n), dtype=torch.bool)
    leaf = torch.full((tree_nodes.shape[0],), -1, dtype=torch.long)
    for row in range(tree_nodes.shape[0]):
        path = torch.unique_consecutive(token_node[row][token_node[row] >= 0]).tolist()
        if len(set(path)) != len(path):
            raise ValueError(f"row {row}: a node's tokens are not contiguous (tree_nodes ids {ids[path].tolist()})")
        for k, node in enumerate(path):
            above = path[k - 1] if k else -1
            if parent[node] != -2 and (parent[node] != above or root[node] != row_root[row]):
                raise ValueError(f"row {row}: node {int(ids[node])} sits under another parent or group in another row")
            parent[node], depth[node], root[node] = above, k + 1, row_root[row]
        through[row, path] = True
        leaf[row] = path[-1] if path else -1
    return Forest(token_node, through, parent, depth, root, row_root, leaf, len(counts))


def node_values(forest: Forest, rewards: torch.Tensor, node_value: str = "leaf_mean"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(V [N] of every node, V [G] of every root) from the rows' rewards [B].

    `leaf_mean` (TreeRL): the mean reward of the leaves under the node, so V(leaf) = r_leaf and the
    root's value is its group's mean. `child_mean` (TreePO's `calculate_rewards_iterative`): bottom up,
    the mean of the children's values (a row ending at the node counts as a child with its reward);
    it equals the leaf mean only where the subtrees are balanced.
    """
    choice("node_value", node_value, NODE_VALUES)
    rewards = rewards.float()
    zeros_g = torch.zeros(forest.num_roots)
    if node_value == "leaf_mean":
        weights = forest.through.float()
        values = (weights * rewards.unsqueeze(1)).sum(0) / weights.sum(0).clamp(min=1)
        totals = zeros_g.index_add(0, forest.row_root, rewards)
        return values, totals / zeros_g.index_add(0, forest.row_root, torch.ones_like(rewards))
    n = forest.parent.numel()
    ends = forest.leaf >= 0
    entry_sum = torch.zeros(n).index_add_(0, forest.leaf[ends], rewards[ends])
    entry_count = torch.zeros(n).index_add_(0, forest.leaf[ends], torch.ones(int(ends.sum())))
    values = torch.zeros(n)
    for d in range(int(forest.depth.max()) if n else 0, 0, -1):
        at = forest.depth == d
        values[at] = entry_sum[at] / entry_count[at]
        child = at & (forest.parent >= 0)
        entry_sum.index_add_(0, forest.parent[child], values[child])
        entry_count.index_add_(0, forest.parent[child], torch.ones(int(child.sum())))
    top = forest.parent == -1
    root_sum = zeros_g.index_add(0, forest.root[top], values[top]).index_add(0, forest.row_root[~ends], rewards[~ends])
    root_count = zeros_g.index_add(0, forest.root[top], torch.ones(int(top.sum())))
    root_count = root_count.index_add(0, forest.row_root[~ends], torch.ones(int((~ends).sum())))
    return values, root_sum / root_count.clamp(min=1)


def parent_values(forest: Forest, values: torch.Tensor, root_values: torch.Tensor) -> torch.Tensor:
    """[N] the value of each node's parent (its root's for a child of the root)."""
    return torch.where(forest.parent >= 0, values[forest.parent.clamp(min=0)], root_values[forest.root])


def sibling_normalise(forest: Forest, values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Each node's value z-scored among its siblings (the children of its parent), with the population std:
    (V − mean) / std, 0 where std ≤ eps, unchanged for an only child (TreePO's `normalize_sibling_rewards`)."""
    family = torch.where(forest.parent >= 0, forest.parent, forest.parent.numel() + forest.root)
    _, slot, size = torch.unique(family, return_inverse=True, return_counts=True)
    zeros = torch.zeros(len(size))
    mean = zeros.index_add(0, slot, values)[slot] / size[slot]
    std = (zeros.index_add(0, slot, (values - mean) ** 2)[slot] / size[slot]).sqrt()
    z = torch.where(std > eps, (values - mean) / std.clamp(min=eps), torch.zeros_like(values))
    return torch.where(size[slot] > 1, z, values)


def segment_advantages(forest: Forest, values: torch.Tensor, root_values: torch.Tensor,
                       eta: float = 0.0) -> torch.Tensor:
    """[B, T] A = V(n_k) − V(n_{k−1}) on the tokens of each path's segment k (n_0 the root).

    With η > 0 the parent's value decays with the distance to the leaf as TreePO's code has it:
    A = V(n_k) − η^(D − k + 1)·V(n_{k−1}), D the depth of the row's leaf.
    """
    before = forest.per_token(parent_values(forest, values, root_values))
    if eta > 0:
        distance = forest.leaf_depth.unsqueeze(1) - forest.per_token(forest.depth) + 1
        before = before * eta ** distance.float()
    return forest.per_token(values) - before


@ADVANTAGES.register("tree_segment", "tree rollouts: V(node) - V(parent) on each segment's tokens (TreePO)",
                     requires={"tree_nodes"}, group_relative=True, group_local=True)
def tree_segment(token_rewards, group_index, mask, tree_nodes=None, node_value: str = "leaf_mean",
                 root_value: str = "leaves", eta: float = 0.0, sibling_norm: bool = False, **_):
    """TreePO's segment advantage (`calculate_segment_advantage`; docs/methods/tree_credit.md). Confidence: high.

    The tokens of segment k of a path get V(n_k) − V(n_{k−1}), V from `node_value`; the root's value
    is its group's mean reward (`root_value: leaves`) or 0 (`zero`, TreePO's choice). `sibling_norm`
    z-scores the node values among siblings first (the root, without siblings, keeps its value; TreePO's
    `spo` is `sibling_norm: true, root_value: zero, node_value: child_mean`); `eta` > 0 decays the
    parent's value (`segment_advantages`). A batch without trees (one node per row) gives r − group
    mean, Dr.GRPO's advantage. With `eta` ≤ 0 a node's advantage depends on the node only, so every
    leaf through a shared node gives its tokens the same advantage, and training each shared segment
    once is exact.
    """
    forest = read_forest(required("tree_nodes", tree_nodes), group_index)
    values, roots = node_values(forest, sequence_scores(token_rewards), node_value)
    if sibling_norm:
        values = sibling_normalise(forest, values)
    if choice("root_value", root_value, ROOT_VALUES) == "zero":
        roots = torch.zeros_like(roots)
    return segment_advantages(forest, values, roots, eta) * mask


@ADVANTAGES.register("treerl", "tree rollouts: [V(n) - V(root) + V(n) - V(parent)] / sqrt(leaves under n) (TreeRL)",
                     requires={"tree_nodes"}, group_relative=True, group_local=True)
def treerl(token_rewards, group_index, mask, tree_nodes=None, node_value: str = "leaf_mean",
           weighted_value_style: str = "sqrt", **_):
    """TreeRL's node reward (THUDM/TreeRL `tree_node.py`; docs/methods/tree_credit.md). Confidence: high.

    R(n) = [GA(n) + LA(n)] / w(|L(n)|) on n's segment tokens, with the global advantage GA = V(n) −
    V(root), the local advantage LA = V(n) − V(parent) and |L(n)| the leaves under n; w = √|L|
    (`weighted_value_style: sqrt`), |L| (`uniform`) or 1 (`original`). The weight offsets a shared
    prefix being trained once per leaf through it. R depends on the node only: every leaf through a
    shared node gives its tokens the same advantage. Without trees R = 2·(r − group mean).
    """
    forest = read_forest(required("tree_nodes", tree_nodes), group_index)
    values, roots = node_values(forest, sequence_scores(token_rewards), node_value)
    leaves = forest.through.sum(0).float()
    weight = {"sqrt": leaves.sqrt(), "uniform": leaves, "original": torch.ones_like(leaves)}
    per_node = (2 * values - roots[forest.root] - parent_values(forest, values, roots))
    per_node = per_node / weight[choice("weighted_value_style", weighted_value_style, WEIGHTED_VALUE_STYLES)]
    return forest.per_token(per_node) * mask


def subgroup_scores(forest: Forest, rewards: torch.Tensor, weighting: str = "group_size",
                    skip_zero_std: bool = False) -> torch.Tensor:
    """[B] A_i = Σ_d a_d·n_d / Σ_d n_d (`group_size`) or mean_d a_d (`average`), a_d = r_i − mean of the
    subgroup at depth d and n_d its size (TreePO's `compute_tree_reinforce_plus_plus_baseline_outcome_advantage`).

    The subgroups are the root's (always; a root with one leaf has mean 0, as in GRPO) and those of the
    leaf's strict ancestors with more than one leaf under them; `skip_zero_std` drops the ancestors
    whose leaves all have the same reward.
    """
    rewards = rewards.float()
    values, roots = node_values(forest, rewards, "leaf_mean")
    root_size = torch.zeros(forest.num_roots).index_add(0, forest.row_root, torch.ones_like(rewards))
    roots = torch.where(root_size > 1, roots, torch.zeros_like(roots))
    size = forest.through.sum(0).float()
    nodes = torch.arange(size.numel())
    used = forest.through & (nodes.unsqueeze(0) != forest.leaf.unsqueeze(1)) & (size > 1).unsqueeze(0)
    if skip_zero_std:
        highest = torch.where(forest.through, rewards.unsqueeze(1), -torch.inf).amax(0)
        lowest = torch.where(forest.through, rewards.unsqueeze(1), torch.inf).amin(0)
        used &= (highest > lowest).unsqueeze(0)
    a_root = rewards - roots[forest.row_root]
    a = (rewards.unsqueeze(1) - values.unsqueeze(0)) * used
    if choice("weighting", weighting, WEIGHTINGS) == "group_size":
        n_root = root_size[forest.row_root]
        return (a_root * n_root + (a * size).sum(1)) / (n_root + (used * size).sum(1))
    return (a_root + a.sum(1)) / (1 + used.sum(1))


@ADVANTAGES.register("tree_subgroup", "tree rollouts: r minus the leaf's ancestor-subgroup means, weighted, "
                     "whitened over the batch's tokens (TreePO)", requires={"tree_nodes"}, group_relative=True)
def tree_subgroup(token_rewards, group_index, mask, tree_nodes=None, weighting: str = "group_size",
                  skip_zero_std: bool = False, **_):
    """TreePO's sequence-level subgroup baseline (docs/methods/tree_credit.md). Confidence: high.

    `subgroup_scores` per leaf, broadcast to its tokens, then whitened over all valid tokens of the batch
    (unbiased std). The advantage belongs to the leaf, not to the node: a shared segment gets a
    different advantage in each leaf through it, so training it once would change the update. Without
    trees it is REINFORCE++ with a group-mean baseline (`reinforce_pp_baseline`).
    """
    forest = read_forest(required("tree_nodes", tree_nodes), group_index)
    scores = subgroup_scores(forest, sequence_scores(token_rewards), weighting, skip_zero_std)
    return masked_whiten(to_tokens(scores, mask), mask)


def progress_rewards(forest: Forest, rewards: torch.Tensor) -> torch.Tensor:
    """[B] r̃_i = Σ_q (r_i − V(q))·n_q / Σ_q n_q over the root and every node q of the path, the leaf
    included, V the leaf mean and n_q the leaves under q (TreePO's `tree_group_wise_reward`)."""
    rewards = rewards.float()
    values, roots = node_values(forest, rewards, "leaf_mean")
    size = forest.through.sum(0).float() * forest.through
    n_root = torch.zeros(forest.num_roots).index_add(0, forest.row_root, torch.ones_like(rewards))[forest.row_root]
    total = (rewards - roots[forest.row_root]) * n_root + ((rewards.unsqueeze(1) - values) * size).sum(1)
    return total / (n_root + size.sum(1))


@ADVANTAGES.register("tree_progress", "tree rollouts: leaf rewards relative to their ancestors, then "
                     "V(node) - V(parent) per segment, whitened (TreePO)", requires={"tree_nodes"},
                     group_relative=True)
def tree_progress(token_rewards, group_index, mask, tree_nodes=None, eta: float = 0.0, whiten: bool = True, **_):
    """TreePO's progress advantage (`compute_tree_rfpp_progress_outcome_advantage`;
    docs/methods/tree_credit.md). Confidence: high.

    Each leaf's reward becomes r̃ (`progress_rewards`); the segment advantages of the child-mean values
    of r̃ with V(root) = 0 follow (`segment_advantages`, `eta` as there), whitened over the batch's valid
    tokens as TreePO does (`whiten: false` keeps them raw). With `eta` ≤ 0 a shared node gets the same
    advantage in every leaf through it (whitening maps equal values to equal values).
    """
    forest = read_forest(required("tree_nodes", tree_nodes), group_index)
    values, roots = node_values(forest, progress_rewards(forest, sequence_scores(token_rewards)), "child_mean")
    adv = segment_advantages(forest, values, torch.zeros_like(roots), eta) * mask
    return masked_whiten(adv, mask) if whiten else adv
