"""Per-task advantages of a mixture (docs/mixtures.md): GRPO's `task_std`, REINFORCE++'s `whiten_per_task`, the
`task_index` input, and the per-task metrics (zero-variance groups, share of Σ|A|), each by hand."""
import pytest
import torch

from lmrl.algos.advantages import ADVANTAGES, grpo, reinforce_pp, reinforce_pp_baseline
from lmrl.algos.algorithm import task_advantage_shares
from lmrl.data.mixture import zero_variance_share
from lmrl.inputs import InputContext
from lmrl.inputs.batch_fields import task_index
from lmrl.types import Batch, Group, Sample


def one_token(rewards):
    """Rewards on one generated token each: [B, 1] token rewards and mask."""
    return torch.tensor(rewards).unsqueeze(1), torch.ones(len(rewards), 1)


def test_task_std_divides_by_the_std_of_the_task_s_rewards_spec_case():
    # code groups [0.5, 0.5, 0.5, 1.0] and [0, 0.2, 0.2, 0.2]: the task's unbiased std over the 8 rewards is
    # 0.3091 (mean 0.3875, Σ(r - mean)² = 0.66875, / 7); group means 0.625 and 0.15
    # math group [1, 0, 0, 1], a task of its own: std 0.5774, mean 0.5 -> ±0.866
    rewards, mask = one_token([0.5, 0.5, 0.5, 1.0, 0.0, 0.2, 0.2, 0.2, 1, 0, 0, 1])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    tasks = torch.tensor([0] * 8 + [1] * 4)
    adv = grpo(rewards, groups, mask, task_std=True, task_index=tasks)[:, 0]
    assert adv.tolist() == pytest.approx([-0.4044, -0.4044, -0.4044, 1.2132, -0.4853, 0.1618, 0.1618, 0.1618,
                                          0.866, -0.866, -0.866, 0.866], abs=1e-4)
    # by the group std instead, the second code group's small spread is blown up to ±1.5
    assert grpo(rewards, groups, mask)[4:8, 0].tolist() == pytest.approx([-1.5, 0.5, 0.5, 0.5], abs=1e-4)
    # without a task index the batch is one task: all 12 rewards, mean 0.425, Σ(r - mean)² = 1.7025, std
    # sqrt(1.7025 / 11) = 0.39341 -> 0.375 / 0.39341 = 0.9532
    assert grpo(rewards, groups, mask, task_std=True)[3, 0] == pytest.approx(0.9532, abs=1e-4)


def test_task_std_reads_the_batch_so_it_is_not_group_local():
    spec = ADVANTAGES.spec("grpo")
    assert spec.is_group_local({}) and not spec.is_group_local({"task_std": True})
    assert not ADVANTAGES.spec("reinforce_pp").is_group_local({})


def test_whiten_per_task_whitens_each_task_apart():
    # task a [1, 0]: mean 0.5, unbiased std 0.7071 -> ±0.7071; task b [0.5, 0.3, 0.1]: mean 0.3, std 0.2 -> 1, 0, -1
    rewards, mask = one_token([1.0, 0.0, 0.5, 0.3, 0.1])
    tasks = torch.tensor([0, 0, 1, 1, 1])
    groups = torch.arange(5)
    expected = [0.7071, -0.7071, 1.0, 0.0, -1.0]
    assert reinforce_pp(rewards, groups, mask, whiten_per_task=True, task_index=tasks)[:, 0].tolist() == \
        pytest.approx(expected, abs=1e-4)
    # over the whole batch instead: mean 0.38, Σ(r - mean)² = 0.628, std sqrt(0.628 / 4) = 0.39623 -> task b's
    # best reply gets 0.12 / 0.39623 = 0.3029, not 1
    assert reinforce_pp(rewards, groups, mask)[2, 0] == pytest.approx(0.3029, abs=1e-4)
    # with a group-mean baseline, groups of one keep their reward (mean 0): the same values
    assert reinforce_pp_baseline(rewards, groups, mask, whiten_per_task=True, task_index=tasks)[:, 0].tolist() == \
        pytest.approx(expected, abs=1e-4)
    # a task index of one task is the batch's whitening
    assert torch.allclose(reinforce_pp(rewards, groups, mask, whiten_per_task=True, task_index=torch.zeros(5).long()),
                          reinforce_pp(rewards, groups, mask))


def sample(reward):
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text="x", row={})
    s.reward = reward
    return s


def test_the_task_index_input_names_each_row_s_task():
    groups = [Group("m/1", {"task": "math"}, [sample(1.0), sample(0.0)]),
              Group("c/1", {"task": "code"}, [sample(0.5)])]
    batch = Batch(input_ids=torch.zeros(3, 2).long(), attention_mask=torch.ones(3, 2), completion_mask=torch.ones(3, 2),
                  behaviour_logprobs=torch.zeros(3, 2), sequence_rewards=torch.zeros(3), group_index=torch.arange(3))
    task_index(batch, InputContext(None, groups))
    assert batch.context["task_names"] == ["code", "math"] and batch.row_extras["task_index"].tolist() == [1, 1, 0]
    task_index(batch, InputContext(None, [Group("1", {}, [sample(1.0)])]))  # a run of one task
    assert batch.context["task_names"] == [] and batch.row_extras["task_index"].tolist() == [0]


def test_each_task_s_share_of_the_policy_gradient_and_of_groups_without_contrast():
    batch = Batch(input_ids=torch.zeros(3, 2).long(), attention_mask=torch.ones(3, 2),
                  completion_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),
                  behaviour_logprobs=torch.zeros(3, 2), sequence_rewards=torch.zeros(3), group_index=torch.arange(3))
    batch.advantages = torch.tensor([[0.5, 0.5], [-1.0, 9.0], [2.0, -2.0]])  # the 9 is off the mask
    batch.row_extras["task_index"] = torch.tensor([0, 0, 1])
    batch.context["task_names"] = ["code", "math"]
    # code: |0.5| + |0.5| + |-1| = 2, math: 4, total 6
    assert task_advantage_shares(batch) == pytest.approx({"task/code/advantage_share": 1 / 3,
                                                          "task/math/advantage_share": 2 / 3})
    batch.context["task_names"] = ["code"]
    assert task_advantage_shares(batch) == {}
    flat = Group("a", {}, [sample(0.5), sample(0.5)])
    mixed = Group("b", {}, [sample(1.0), sample(0.0)])
    errored = Group("c", {}, [sample(None)])
    assert zero_variance_share([flat, mixed, errored]) == 0.5  # 1 of the 2 groups with a reward
