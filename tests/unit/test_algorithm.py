"""The Algorithm bundle: reward shaping, KL in the reward or the loss, entropy bonus, group filters."""
import pytest
import torch

from lmrl.algos import AggScale, Algorithm, LossInputs
from lmrl.config import AlgoConfig
from lmrl.data import GROUP_FILTERS
from lmrl.types import Group, Sample, collate


def batch(rewards, comp_lengths, groups):
    samples = [Sample([1, 2], [5] * n, [-0.5] * n, reward=r) for r, n in zip(rewards, comp_lengths)]
    return collate(samples, groups, pad_id=0)


def test_overlong_shaping_changes_rewards_before_advantages():
    b = batch([1.0, 1.0], [2, 4], [0, 0])
    algo = Algorithm(AlgoConfig(advantage="dr_grpo", shaping=[{"name": "overlong", "params": {"buffer": 2}}]), max_new_tokens=4)
    m = algo.prepare(b)
    # expected length 4 - 2 = 2: the 4-token sample is penalised by (4 - 2) / 2 = 1 → rewards [1, 0]
    assert m["overlong_penalty"] == pytest.approx(-0.5)
    valid = b.advantages[b.completion_mask > 0]
    assert sorted(set(valid.tolist())) == pytest.approx([-0.5, 0.5])


def test_kl_in_reward_uses_k1_of_behaviour_and_reference():
    b = batch([1.0, 1.0], [1, 1], [0, 1])
    b.extras["ref_logp"] = torch.full_like(b.behaviour_logprobs, -1.5)  # k1 = -0.5 - (-1.5) = 1
    algo = Algorithm(AlgoConfig(advantage="reinforce_pp", kl_coef=0.1, kl_in_reward=True), max_new_tokens=1)
    m = algo.prepare(b)
    assert m["kl_in_reward"] == pytest.approx(1.0)
    # both sequences get 1 - 0.1 = 0.9: identical returns whiten to zero
    assert torch.allclose(b.advantages, torch.zeros_like(b.advantages), atol=1e-3)


def make_inputs(logp, adv, ref=None, entropy=None):
    logp = torch.tensor([logp], requires_grad=True)
    return logp, LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.tensor([adv]),
                            mask=torch.ones_like(logp), ref_logp=None if ref is None else torch.tensor([ref]),
                            entropy=None if entropy is None else torch.tensor([entropy]))


def test_kl_loss_term_and_entropy_bonus():
    _, x = make_inputs([-1.0, -1.0], [0.0, 0.0], ref=[-1.0, -2.0], entropy=[2.0, 4.0])
    scale = AggScale.of(x.mask)
    base, _ = Algorithm(AlgoConfig(), max_new_tokens=2).objective(x, scale)
    assert base.item() == pytest.approx(0.0)
    kl, m = Algorithm(AlgoConfig(kl_coef=0.5, kl_estimator="k1"), max_new_tokens=2).objective(x, scale)
    assert m["kl"] == pytest.approx(0.5) and kl.item() == pytest.approx(0.25)
    ent, _ = Algorithm(AlgoConfig(entropy_coef=0.1), max_new_tokens=2).objective(x, scale)
    assert ent.item() == pytest.approx(-0.3)


def test_algorithm_needs_reference_only_with_kl():
    assert not Algorithm(AlgoConfig(), max_new_tokens=4).needs_reference
    assert Algorithm(AlgoConfig(kl_coef=0.01), max_new_tokens=4).needs_reference


def test_dynamic_sampling_filter_spec_cases():
    keep = GROUP_FILTERS.get("nonzero_std")

    def group(rewards):
        return Group("u", {}, [Sample([1], [2], [0.0], reward=r) for r in rewards])

    assert not keep(group([1, 1, 1, 1])) and not keep(group([0, 0, 0, 0]))
    assert keep(group([1, 0, 0, 1]))
    assert keep(group([1, None, None, None]))  # one scored sample: kept (size 1)
    assert GROUP_FILTERS.get("none")(group([1, 1]))
