"""Tree advantages against the hand-computed tree of docs/methods/tree_credit.md, and the `tree_nodes` input.

The tree: root → A, B; A → A1 (r=1), A2 (0); B → B1 (0), B2 (0), B3 (1); every segment 4 tokens.
Rows are the leaves A1, A2, B1, B2, B3; node numbers A=0, B=1, A1=2, A2=3, B1=4, B2=5, B3=6.
"""
from __future__ import annotations

import math

import pytest
import torch

from lmrl.algos import ADVANTAGES, Algorithm
from lmrl.algos.advantages import masked_whiten, outcome_to_token_rewards
from lmrl.algos.tree_credit import node_values, progress_rewards, read_forest, subgroup_scores
from lmrl.config import AlgoConfig
from lmrl.inputs import InputContext, requested_inputs
from lmrl.loading import build_config
from lmrl.loops.batching import to_batch
from lmrl.types import Group, Sample
from conftest import toy_run_config, train_tiny

PATHS = [(0, 2), (0, 3), (1, 4), (1, 5), (1, 6)]
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0]
TREE_ESTIMATORS = ["tree_segment", "treerl", "tree_subgroup", "tree_progress"]


def spec_tree(rewards=REWARDS, paths=PATHS, group=0, offset=0):
    """(token_rewards, group_index, mask, tree_nodes) of the spec's tree: two 4-token segments per row."""
    nodes = torch.tensor([[a + offset] * 4 + [b + offset] * 4 for a, b in paths])
    mask = torch.ones(len(paths), 8)
    tr = outcome_to_token_rewards(torch.tensor(rewards), mask)
    return tr, torch.full((len(paths),), group), mask, nodes


def run(name, batch=None, **knobs):
    tr, g, mask, nodes = batch or spec_tree()
    return ADVANTAGES.get(name)(tr, g, mask, tree_nodes=nodes, **knobs)


def segments(adv):
    """[B, 2]: (segment 1, segment 2) of each row of a spec-tree advantage."""
    return adv[:, [0, 4]]


def close(actual, expected, atol=1e-4):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=atol, rtol=0)


def test_node_values_leaf_mean_and_child_mean():
    forest = read_forest(spec_tree()[3], torch.zeros(5, dtype=torch.long))
    values, root = node_values(forest, torch.tensor(REWARDS))
    assert values.tolist() == pytest.approx([0.5, 1 / 3, 1.0, 0.0, 0.0, 0.0, 1.0])
    assert root.tolist() == pytest.approx([0.4])  # the spec's 0.4000
    _, child_root = node_values(forest, torch.tensor(REWARDS), "child_mean")
    assert child_root.item() == pytest.approx(0.4167, abs=1e-4)  # (0.5 + 0.3333) / 2


def test_tree_segment_matches_the_spec():
    close(segments(run("tree_segment")),
          [[0.1, 0.5], [0.1, -0.5], [-0.0667, -0.3333], [-0.0667, -0.3333], [-0.0667, 0.6667]])
    zero = segments(run("tree_segment", root_value="zero"))  # TreePO's V(root) := 0
    close(zero[:, 0], [0.5, 0.5, 0.3333, 0.3333, 0.3333])


def test_tree_segment_eta_decays_the_parent_by_the_distance_to_the_leaf():
    # A1: segment 1 = 0.5 − 0.5²·0.4 = 0.4, segment 2 = 1 − 0.5·0.5 = 0.75
    close(segments(run("tree_segment", eta=0.5))[0], [0.4, 0.75], atol=1e-6)


def test_tree_segment_sibling_norm_z_scores_among_siblings():
    # A, B: z = ±1; A1, A2: ±1; B1, B2, B3 = (0, 0, 1): mean 1/3, population std √2/3 → −0.7071, 1.4142
    close(segments(run("tree_segment", sibling_norm=True, root_value="zero")),
          [[1.0, 0.0], [1.0, -2.0], [-1.0, 1 - 0.7071], [-1.0, 1 - 0.7071], [-1.0, 2.4142]])


def test_treerl_matches_the_spec():
    adv = segments(run("treerl"))
    close(adv[0], [0.1414, 1.1])  # R(A), R(A1)
    close(adv[4], [-0.0770, 1.2667])  # R(B), R(B3)
    assert segments(run("treerl", weighted_value_style="uniform"))[0, 0].item() == pytest.approx(0.1)  # 0.2 / 2
    assert segments(run("treerl", weighted_value_style="original"))[0, 0].item() == pytest.approx(0.2)


def test_tree_subgroup_before_and_after_whitening():
    forest = read_forest(spec_tree()[3], torch.zeros(5, dtype=torch.long))
    raw = subgroup_scores(forest, torch.tensor(REWARDS))
    assert raw.tolist() == pytest.approx([0.5714, -0.4286, -0.375, -0.375, 0.625], abs=1e-4)
    tr, g, _, nodes = spec_tree()
    last = torch.zeros(5, 8)
    last[:, 7] = 1  # one trained token per leaf: the spec's whitening; the tree still comes from tree_nodes
    adv = ADVANTAGES.get("tree_subgroup")(tr, g, last, tree_nodes=nodes)
    assert adv[:, 7].tolist() == pytest.approx([1.0446, -0.7950, -0.6964, -0.6964, 1.1432], abs=1e-4)
    assert (adv[:, :7] == 0).all()
    average = subgroup_scores(forest, torch.tensor(REWARDS), weighting="average")
    assert average.tolist() == pytest.approx([0.55, -0.45, -0.3667, -0.3667, 0.6333], abs=1e-4)  # A1: (0.6+0.5)/2


def test_tree_subgroup_skip_zero_std_drops_subgroups_of_equal_rewards():
    # B's leaves now all 0: its subgroup is skipped, B1 keeps only the root's a = 0 − 0.2
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0]
    forest = read_forest(spec_tree()[3], torch.zeros(5, dtype=torch.long))
    kept = subgroup_scores(forest, torch.tensor(rewards))
    skipped = subgroup_scores(forest, torch.tensor(rewards), skip_zero_std=True)
    assert kept[2].item() == pytest.approx(-0.2 * 5 / 8)  # (−0.2·5 + 0·3) / 8
    assert skipped[2].item() == pytest.approx(-0.2)
    assert skipped[0].item() == pytest.approx(kept[0].item())  # A's subgroup has spread: unchanged


def test_tree_progress_matches_the_spec():
    forest = read_forest(spec_tree()[3], torch.zeros(5, dtype=torch.long))
    assert progress_rewards(forest, torch.tensor(REWARDS)).tolist() == pytest.approx(
        [0.5, -0.375, -0.3333, -0.3333, 0.5556], abs=1e-4)
    raw = run("tree_progress", whiten=False)
    close(segments(raw),
          [[0.0625, 0.4375], [0.0625, -0.4375], [-0.0370, -0.2963], [-0.0370, -0.2963], [-0.0370, 0.5926]])
    assert torch.allclose(run("tree_progress"), masked_whiten(raw, torch.ones(5, 8)))


def test_unique_tokens_28_against_40_replicated():
    samples = [tree_sample(p) for p in SPEC_LEAVES]
    batch = to_batch(InputContext(build_config({}), [Group("q", {}, samples)], frozenset({"tree_nodes"}), step=1), 0)
    nodes = batch.extras["tree_nodes"]
    unique = sum(int((nodes == n).sum(1).max()) for n in torch.unique(nodes[nodes >= 0]))
    assert (unique, int(batch.completion_mask.sum())) == (28, 40)


def test_two_prompts_in_one_batch_do_not_mix():
    alone = {name: run(name, whiten=False) for name in ("tree_segment", "treerl", "tree_progress")}
    first, second = spec_tree(), spec_tree([0.0, 1.0, 1.0, 1.0, 0.0], group=1, offset=7)
    both = tuple(torch.cat([a, b]) for a, b in zip(first, second))
    for name, adv in alone.items():
        assert torch.allclose(run(name, both, whiten=False)[:5], adv)
    forest = read_forest(both[3], both[1])
    assert torch.allclose(subgroup_scores(forest, both[0].sum(1))[:5], subgroup_scores(
        read_forest(first[3], first[1]), first[0].sum(1)))


def test_a_node_number_in_two_groups_is_refused():
    first, second = spec_tree(), spec_tree(group=1)
    both = tuple(torch.cat([a, b]) for a, b in zip(first, second))
    with pytest.raises(ValueError, match="another parent or group"):
        run("tree_segment", both)


def flat_batch(rewards, groups, width=3):
    """A batch without trees: every row is one node of its own."""
    mask = torch.ones(len(rewards), width)
    nodes = torch.arange(len(rewards)).unsqueeze(1).expand(-1, width)
    return outcome_to_token_rewards(torch.tensor(rewards), mask), torch.tensor(groups), mask, nodes


def test_without_trees_the_estimators_reduce_to_flat_ones():
    rewards, groups = [1.0, 0.0, 0.0, 2.0, 1.0], [0, 0, 0, 1, 1]
    batch = flat_batch(rewards, groups)
    tr, g, mask, _ = batch
    dr_grpo = ADVANTAGES.get("dr_grpo")(tr, g, mask)  # r − group mean
    assert torch.allclose(run("tree_segment", batch), dr_grpo)
    assert torch.allclose(run("tree_segment", batch, root_value="zero"), tr.sum(1, keepdim=True) * mask)
    assert torch.allclose(run("treerl", batch), 2 * dr_grpo)
    assert torch.allclose(run("tree_subgroup", batch), ADVANTAGES.get("reinforce_pp_baseline")(tr, g, mask))
    sizes = torch.tensor([3.0, 3, 3, 2, 2]).unsqueeze(1)
    assert torch.allclose(run("tree_progress", batch, whiten=False), sizes / (sizes + 1) * dr_grpo)


def unbalanced_tree():
    """root → X (→ X0 → {X00 r=1, X01 r=0}, X1 r=1), Y (→ Y0 r=0, Y1 r=0.5); segments of 1 to 3 tokens."""
    paths = [[(0, 2), (2, 3), (4, 2)], [(0, 2), (2, 3), (5, 1)], [(0, 2), (3, 3)], [(1, 1), (6, 2)],
             [(1, 1), (7, 3)]]
    width = max(sum(n for _, n in p) for p in paths)
    nodes = torch.full((len(paths), width), -1)
    mask = torch.zeros(len(paths), width)
    for row, path in enumerate(paths):
        ids = [node for node, n in path for _ in range(n)]
        nodes[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    tr = outcome_to_token_rewards(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5]), mask)
    return tr, torch.zeros(len(paths), dtype=torch.long), mask, nodes


@pytest.mark.parametrize("name, knobs", [("tree_segment", {}), ("tree_segment", {"node_value": "child_mean"}),
                                         ("tree_segment", {"sibling_norm": True}), ("treerl", {}),
                                         ("tree_progress", {}), ("tree_progress", {"whiten": False})])
def test_a_shared_node_gets_one_advantage_in_every_leaf(name, knobs):
    batch = unbalanced_tree()
    adv, nodes = run(name, batch, **knobs), batch[3]
    for node in torch.unique(nodes[nodes >= 0]):
        values = adv[nodes == node]
        assert torch.allclose(values, values[0].expand_as(values)), f"node {int(node)}"
    assert adv[nodes == 0].abs().max() > 0  # the shared node X carries credit


def test_the_subgroup_baseline_differs_between_leaves_of_a_shared_node():
    adv, nodes = run("tree_subgroup"), spec_tree()[3]
    assert adv[0, 0] != adv[1, 0] and nodes[0, 0] == nodes[1, 0]  # node A in the leaves A1 and A2


def test_eta_makes_a_shared_node_depend_on_the_leaf_depth():
    batch = unbalanced_tree()
    adv = run("tree_segment", batch, eta=0.5)
    # node X under leaves of depth 3 (rows 0, 1) and 2 (row 2): V(X) − η^D·V(root)
    values, root = node_values(read_forest(batch[3], batch[1]), batch[0].sum(1))
    assert adv[0, 0].item() == pytest.approx(values[0].item() - 0.5 ** 3 * root.item())
    assert adv[2, 0].item() == pytest.approx(values[0].item() - 0.5 ** 2 * root.item())


@pytest.mark.parametrize("name", TREE_ESTIMATORS)
def test_tree_nodes_are_required(name):
    tr, g, mask, _ = spec_tree()
    with pytest.raises(ValueError, match="per-sample input 'tree_nodes'"):
        ADVANTAGES.get(name)(tr, g, mask)


def test_unknown_knob_values_are_named():
    with pytest.raises(ValueError, match="node_value must be one of"):
        run("tree_segment", node_value="leaves")
    with pytest.raises(ValueError, match="weighted_value_style must be one of"):
        run("treerl", weighted_value_style="log")


# --- the `tree_nodes` input ------------------------------------------------------------------------

SPEC_LEAVES = [(["A", "A.0"], 1.0), (["A", "A.1"], 0.0), (["B", "B.0"], 0.0), (["B", "B.1"], 0.0),
               (["B", "B.2"], 1.0)]
NODE_TOKENS = {"A": [10, 11, 12, 13], "B": [20, 21, 22, 23]}


def tree_sample(leaf, prompt=(1, 2), loss_mask=None):
    """A leaf of the spec's tree as a sample: the shared first segment's tokens, then its own four."""
    (first, second), reward = leaf
    own = [30 + 4 * SPEC_LEAVES.index(leaf) + j for j in range(4)]
    completion = NODE_TOKENS[first] + own
    return Sample(list(prompt), completion, [-1.0] * 8, reward=reward, loss_mask=loss_mask,
                  info={"tree": {"nodes": [first, second], "ends": [4, 8]}})


def batch_of(groups, **algo):
    cfg = build_config({"algo": algo})
    return to_batch(InputContext(cfg, groups, frozenset({"tree_nodes"}), step=1), 0)


def test_tree_nodes_follow_the_completion_mask():
    """Prompts of 2 and 3 tokens: node numbers sit exactly on the completion positions, environment tokens
    included, -1 on the prompt and padding."""
    env = [1, 1, 0, 0, 1, 1, 1, 1]
    samples = [tree_sample(SPEC_LEAVES[0]), tree_sample(SPEC_LEAVES[1], prompt=(1, 2, 3), loss_mask=env)]
    batch = batch_of([Group("q", {}, samples)])
    nodes = batch.extras["tree_nodes"]
    assert nodes.shape == batch.completion_mask.shape == (2, 10)
    assert nodes[0].tolist() == [-1, 0, 0, 0, 0, 1, 1, 1, 1, -1]
    assert nodes[1].tolist() == [-1, -1, 0, 0, 0, 0, 2, 2, 2, 2]
    assert batch.completion_mask[1].tolist() == [0, 0] + [float(m) for m in env]
    for row in range(2):  # the token each position predicts is its node's token
        start = len(samples[row].prompt_ids) - 1
        assert batch.input_ids[row, start + 1: start + 5].tolist() == NODE_TOKENS["A"]


def test_tree_nodes_are_numbered_per_prompt_and_flat_samples_are_one_node():
    flat = Sample([1, 2], [5, 6, 7], [-1.0] * 3, reward=1.0)
    other = Sample([1, 2], [5, 6], [-1.0] * 2, reward=0.0, info={"tree": {"nodes": ["A"], "ends": [2]}})
    groups = [Group("q", {}, [tree_sample(leaf) for leaf in SPEC_LEAVES[:2]]), Group("r", {}, [other, flat])]
    nodes = batch_of(groups).extras["tree_nodes"]
    assert nodes[0, 1].item() == nodes[1, 1].item() == 0  # "A" of prompt q, shared by its two leaves
    assert nodes[2, 1:3].tolist() == [3, 3]  # "A" of prompt r is another node
    assert nodes[3, 1:4].tolist() == [4, 4, 4] and nodes[3, 4].item() == -1


@pytest.mark.parametrize("tree, error", [
    ({"nodes": ["A", "A.0"], "ends": [4]}, "one end per node"),
    ({"nodes": ["A", "A.0"], "ends": [5, 4]}, "must not decrease"),
    ({"nodes": ["A", "A.0"], "ends": [4, 7]}, "finish at the completion's 8 tokens"),
])
def test_a_malformed_tree_is_refused(tree, error):
    sample = tree_sample(SPEC_LEAVES[0])
    sample.info["tree"] = tree
    with pytest.raises(ValueError, match=error):
        batch_of([Group("q", {}, [sample])])


def test_an_empty_segment_has_no_tokens_and_so_no_node():
    sample = tree_sample(SPEC_LEAVES[0])
    sample.info["tree"] = {"nodes": ["A", "A.0", "A.0.0"], "ends": [4, 4, 8]}
    nodes = batch_of([Group("q", {}, [sample])]).extras["tree_nodes"]
    assert nodes[0].tolist() == [-1] + [0] * 4 + [1] * 4  # "A.0.0" follows "A" directly


def test_a_shared_node_with_different_tokens_is_refused():
    a, b = tree_sample(SPEC_LEAVES[0]), tree_sample(SPEC_LEAVES[1])
    b.completion_ids[0] = 99
    with pytest.raises(ValueError, match="node 'A' holds different tokens"):
        batch_of([Group("q", {}, [a, b])])


def test_the_algorithm_asks_for_tree_nodes_and_gets_the_spec_advantages():
    cfg = AlgoConfig(advantage="tree_segment")
    algo = Algorithm(cfg, max_new_tokens=8)
    assert "tree_nodes" in requested_inputs(algo)
    samples = [tree_sample(leaf) for leaf in SPEC_LEAVES]
    ctx = InputContext(build_config({"algo": {"advantage": "tree_segment"}}), [Group("q", {}, samples)],
                       requested_inputs(algo), step=1)
    batch = to_batch(ctx, 0)
    algo.prepare(batch)
    expected = [[0.1, 0.5], [0.1, -0.5], [-0.0667, -0.3333], [-0.0667, -0.3333], [-0.0667, 0.6667]]
    close(batch.advantages[:, [1, 5]], expected)
    torch.testing.assert_close(batch.advantages[:, 1:], run("tree_segment"))  # position 0 predicts a prompt token
    assert (batch.advantages[:, 0] == 0).all()


@pytest.mark.parametrize("name", ["tree_segment", "tree_subgroup"])
def test_a_training_step_on_flat_rollouts(tmp_path, name):
    """The loop asks for `tree_nodes`, the provider fills it from samples without trees, the step runs."""
    steps, _ = train_tiny(toy_run_config(tmp_path, 1, algo={"advantage": name}))
    assert [r["step"] for r in steps] == [1] and math.isfinite(steps[0]["reward/mean"])


def test_tree_rollouts_train_with_a_tree_estimator(tmp_path):
    """The tree controller's leaves carry `info["tree"]`; the estimator reads their paths in a real step."""
    rollout = {"controller": "tree", "group_size": 4,
               "controller_params": {"segment_tokens": 2, "divergence": 2, "depth": 2, "prefix_dedup": True}}
    steps, _ = train_tiny(toy_run_config(tmp_path, 1, rollout=rollout, algo={"advantage": "treerl"}))
    assert [r["step"] for r in steps] == [1] and steps[0]["rollout/tree_token_share"] < 1  # shared segments
    assert steps[0]["advantage/abs_mean"] > 0
