"""Clipped-ratio losses (PPO clip, GSPO, pg, HTPO, Policy Split), aggregation, KL estimators and the
overlong penalty against docs/methods/{ppo,gspo,htpo,policy_split,dapo}.md and hand computations, plus
the knob contract every loss keeps with the Algorithm."""
import math

import pytest
import torch

from algo_helpers import adv, logs, loss_inputs, token_inputs
from algo_helpers import run_loss as run
from lmrl.algos import AGGREGATIONS, AggScale, KL_ESTIMATORS, LOSSES, LossInputs
from lmrl.stats import overlong_penalty


def inputs(log_ratio, adv, mask=None):
    lr = torch.tensor([log_ratio], dtype=torch.float)
    logp = torch.zeros_like(lr, requires_grad=True)
    a = torch.full_like(lr, adv) if isinstance(adv, (int, float)) else torch.tensor([adv], dtype=torch.float)
    return logp, LossInputs(logp=logp, old_logp=-lr, advantages=a, mask=torch.ones_like(lr) if mask is None else mask)


NAMES = [
    "htpo", "ppo_clip_tis", "ppo_clip_mis_token", "ppo_clip_mis_seq", "ppo_clip_tis_seq", "trust_region_masking",
    "cispo", "sapo",
]
SPEC_ENTROPY = [0.1, 0.5, 2.0, 0.3, 1.5]  # docs/methods/htpo.md: only token 3 (index 2) is high-entropy


def htpo_inputs(rho, adv, acc, group_acc):
    """One sequence with the entropies of the check in docs/methods/htpo.md [0.1, 0.5, 2.0, 0.3, 1.5]."""
    return token_inputs(logs([rho]), [adv], entropy=[SPEC_ENTROPY], acc=[acc], group_acc=[group_acc])


def test_ppo_clip_positive_advantage_clips_high_ratio():
    logp, x = inputs([math.log(1.5), math.log(1.1), math.log(0.5)], 1.0)
    loss, m = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.28)
    assert loss[0].tolist() == pytest.approx([-1.28, -1.1, -0.5], abs=1e-5)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.1, -0.5], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(1 / 3)


def test_ppo_clip_negative_advantage_clips_low_ratio():
    _, x = inputs([math.log(0.5), math.log(1.5)], -1.0)
    loss, _ = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.28)
    assert loss[0].tolist() == pytest.approx([0.8, 1.5], abs=1e-5)


def test_dual_clip_caps_negative_advantage_loss():
    _, x = inputs([math.log(5.0), math.log(2.0)], -1.0)
    loss, m = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0], abs=1e-5)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_dual_clip_leaves_positive_advantages_alone():
    _, x = inputs([math.log(5.0)], 1.0)
    loss, _ = LOSSES.get("ppo_clip")(x, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(-1.2)


def test_gspo_spec_value():
    logp, x = inputs([0.1, -0.1, 0.3], 1.0)
    loss, _ = LOSSES.get("gspo")(x, eps_low=3e-4, eps_high=4e-4)
    assert loss.mean().item() == pytest.approx(-1.0004, abs=1e-6)
    loss.sum().backward()
    assert torch.all(logp.grad == 0)  # clipped: no gradient


def test_gspo_uses_one_ratio_per_sequence():
    logp, x = inputs([0.001, -0.001, 0.0], 1.0)
    loss, m = LOSSES.get("gspo")(x, eps_low=0.2, eps_high=0.2)
    assert m["ratio_mean"] == pytest.approx(1.0)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -1.0, -1.0], abs=1e-5)


def test_pg_is_reinforce_on_policy():
    logp, x = inputs([0.0, 0.0], [2.0, -1.0])
    loss, _ = LOSSES.get("pg")(x)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-2.0, 1.0])


def test_aggregations_spec_value():
    loss = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    scale = AggScale.of(mask, horizon=4)
    assert AGGREGATIONS.get("seq_mean_token_sum_norm")(loss, mask, scale).item() == pytest.approx(1.5)
    assert AGGREGATIONS.get("token_mean")(loss, mask, scale).item() == pytest.approx(1.0)
    loss2 = torch.tensor([[2.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert AGGREGATIONS.get("token_mean")(loss2, mask, scale).item() == pytest.approx(8 / 6)
    assert AGGREGATIONS.get("seq_mean_token_mean")(loss2, mask, scale).item() == pytest.approx(1.5)


def test_aggregation_is_additive_over_micro_batches():
    loss = torch.rand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    for name in AGGREGATIONS.names():
        fn = AGGREGATIONS.get(name)
        scale = AggScale.of(mask, horizon=5)
        whole = fn(loss, mask, scale)
        parts = fn(loss[:2], mask[:2], scale) + fn(loss[2:], mask[2:], scale)
        assert whole.item() == pytest.approx(parts.item(), rel=1e-6), name


def test_kl_estimators():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, -1.0])
    assert KL_ESTIMATORS.get("k1")(logp, ref).tolist() == pytest.approx([0.5, 0.0])
    assert KL_ESTIMATORS.get("k2")(logp, ref).tolist() == pytest.approx([0.125, 0.0])
    assert KL_ESTIMATORS.get("k3")(logp, ref).tolist() == pytest.approx([math.exp(-0.5) + 0.5 - 1, 0.0])
    assert KL_ESTIMATORS.get("k3")(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0  # clamped


def test_dapo_overlong_spec_value():
    pen = overlong_penalty(torch.tensor([18432, 16384, 20480, 100]), max_len=20480, buffer=4096)
    assert pen.tolist() == pytest.approx([-0.5, 0.0, -1.0, 0.0])


def test_htpo_spec_correct_hard_case():
    logp, x = htpo_inputs([1.0, 1.1, 1.5, 1.3, 0.7], 1.0, acc=1.0, group_acc=0.25)
    loss, grad, m = run("htpo", x, logp)
    assert loss[0].tolist() == pytest.approx([-1.0, -1.1, 1.28, -1.28, -0.7], abs=1e-5)
    assert loss.mean().item() == pytest.approx(-0.56, abs=1e-5)
    assert grad[0].tolist() == pytest.approx([-1.0, -1.1, 1.28, 0.0, -0.7], abs=1e-5)
    assert m["htpo/high_entropy_frac"] == pytest.approx(0.2)
    assert m["htpo/hard_frac"] == 1.0


@pytest.mark.parametrize("group_acc", [0.25, 0.75])  # hard ∧ wrong and easy ∧ wrong share the rule
def test_htpo_spec_wrong_case(group_acc):
    logp, x = htpo_inputs([1.0, 0.9, 0.7, 1.3, 0.75], -1.0, acc=0.0, group_acc=group_acc)
    loss, grad, _ = run("htpo", x, logp)
    assert loss[0].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.8], abs=1e-5)
    assert loss.mean().item() == pytest.approx(0.64, abs=1e-5)
    # token 3: d/dlogp (0.8·A·r_id) = −0.8, so descent raises its probability; token 5 is clipped
    assert grad[0].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.0], abs=1e-5)


def test_htpo_hard_correct_low_ratio_branch_has_the_flagged_positive_sign():
    logp, x = htpo_inputs([1.0, 1.0, 0.5, 1.0, 1.0], 1.0, acc=1.0, group_acc=0.0)
    loss, grad, _ = run("htpo", x, logp)
    assert loss[0, 2].item() == pytest.approx(2.0)  # +sg[1/ρ]·A·r_id = 1/0.5
    assert grad[0, 2].item() == pytest.approx(2.0)  # positive: descent lowers a correct token's p


def test_htpo_easy_correct_clips_high_tokens_and_zeroes_the_top_q2():
    ent = [[0.1, 0.2, 0.3, 3.0, 0.4, 0.5, 0.6, 2.5, 0.7, 0.8]]  # n=10 → k=2: tokens 3 and 7 are high
    rho = [[1.0, 1.0, 1.0, 1.5, 1.0, 1.0, 1.0, 1.5, 1.0, 1.0]]
    logp, x = token_inputs(logs(rho), [1.0], entropy=ent, acc=[1.0], group_acc=[0.75])
    loss, grad, m = run("htpo", x, logp)
    expected = [-1.0] * 10
    expected[3], expected[7] = 0.0, -1.28  # top-1 high token zeroed (k' = max(⌊0.02·2⌋, 1)); other clipped
    assert loss[0].tolist() == pytest.approx(expected, abs=1e-5)
    grad_expected = [-1.0] * 10
    grad_expected[3] = grad_expected[7] = 0.0
    assert grad[0].tolist() == pytest.approx(grad_expected, abs=1e-5)
    assert m["htpo/zeroed_frac"] == pytest.approx(0.1)


def test_htpo_difficulty_threshold_is_strict():
    # group accuracy exactly τ is easy: the single high token is then both clipped and zeroed (top q2)
    logp, x = htpo_inputs([1.0, 1.1, 1.5, 1.3, 0.7], 1.0, acc=1.0, group_acc=0.6)
    loss, _, m = run("htpo", x, logp)
    assert loss[0, 2].item() == 0.0
    assert m["htpo/hard_frac"] == 0.0


def test_htpo_low_side_clip_out_zeroes_k_minus_one_tokens():
    ent = [[0.9, 0.2, 0.7, 5.0, 0.3, 0.8, 0.4, 4.0, 0.6, 0.5]]  # high: 3, 7; low: 8 tokens
    logp, x = token_inputs([[0.0] * 10], [1.0], entropy=ent, acc=[1.0], group_acc=[0.0])
    loss, _, _ = run("htpo", x, logp, htpo_q1=0.25)  # k' = 2 → only the smallest (token 1) is zeroed
    assert [i for i, v in enumerate(loss[0].tolist()) if v == 0.0] == [1]
    logp, x = token_inputs([[0.0] * 10], [1.0], entropy=ent, acc=[1.0], group_acc=[0.0])
    loss, _, _ = run("htpo", x, logp)  # default q1 = 0.006 → k' = 1 → nothing zeroed (the code's off-by-one)
    assert (loss != 0).all()


def test_htpo_dual_clip_caps_every_negative_advantage_cell():
    rho = [1.0, 15.0, 20.0, 1.0, 1.0]  # token 2 (high, wrong, ρ not low) and token 1 (low) exceed c
    logp, x = htpo_inputs(rho, -1.0, acc=0.0, group_acc=0.25)
    loss, _, _ = run("htpo", x, logp)
    assert loss[0, 1:3].tolist() == pytest.approx([10.0, 10.0], abs=1e-4)
    logp, x = htpo_inputs(rho, -1.0, acc=0.0, group_acc=0.25)
    loss, _, _ = run("htpo", x, logp, dual_clip=None)
    assert loss[0, 1:3].tolist() == pytest.approx([15.0, 20.0], abs=1e-4)


def test_htpo_rows_are_independent_and_padding_is_ignored():
    rho = [[1.0, 1.1, 1.5, 1.3, 0.7, 3.0, 3.0], [1.0, 0.9, 0.7, 1.3, 0.75, 3.0, 3.0]]
    ent = [SPEC_ENTROPY + [100.0, 100.0]] * 2  # padding entropies would be "high" if counted
    mask = [[1.0] * 5 + [0.0, 0.0]] * 2
    logp, x = token_inputs(logs(rho), [1.0, -1.0], mask=mask, entropy=ent, acc=[1.0, 0.0], group_acc=[0.25, 0.25])
    loss, grad, m = run("htpo", x, logp)
    assert loss[0, :5].tolist() == pytest.approx([-1.0, -1.1, 1.28, -1.28, -0.7], abs=1e-5)
    assert loss[1, :5].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.8], abs=1e-5)
    assert grad[1, :5].tolist() == pytest.approx([1.0, 0.9, -0.8, 1.3, 0.0], abs=1e-5)
    assert m["htpo/high_entropy_frac"] == pytest.approx(0.2)


@pytest.mark.parametrize("name", NAMES)
def test_contract_with_the_algorithm_knobs(name):
    torch.manual_seed(0)
    b, t = 4, 6
    logp = (torch.randn(b, t) * 0.1 - 1.0).requires_grad_()
    mask = torch.ones(b, t)
    mask[1, 4:] = 0
    extras = {"acc": torch.tensor([1.0, 0.0, 1.0, 0.0]), "group_acc": torch.tensor([0.5, 0.5, 0.75, 0.75]),
              "rollout_logp": logp.detach() + 0.05 * torch.randn(b, t)}
    x = LossInputs(logp=logp, old_logp=logp.detach() + 0.05 * torch.randn(b, t),
                   advantages=torch.randn(b, 1).expand(b, t), mask=mask, entropy=torch.rand(b, t),
                   extras=extras)
    loss, metrics = LOSSES.get(name)(x, eps_low=0.2, eps_high=0.28, dual_clip=None)
    assert loss.shape == (b, t) and torch.isfinite(loss).all()
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    (loss * mask).sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert name in LOSSES and LOSSES.describe(name)


def test_policy_split_spec_pooled_advantages():
    # normal-mode rewards [1, 0] and high-entropy-mode rewards [1, 1] share the prompt's group
    out = adv("grpo", [1, 0, 1, 1], [0, 0, 0, 0])
    assert out[:, 0].tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], abs=1e-5)


def test_policy_split_spec_entropy_term_on_high_entropy_rows_only():
    lp, ent, x = loss_inputs([[-1.0], [-1.0]], [0.0, 0.0], entropy=[[2.0], [2.0]], prompt_variant=[0.0, 1.0])
    loss, m = LOSSES.get("policy_split")(x, split_beta=0.01)
    assert loss[:, 0].tolist() == pytest.approx([0.0, -0.02])
    loss.sum().backward()
    assert ent.grad[:, 0].tolist() == pytest.approx([0.0, -0.01])
    assert m["split/high_entropy_rows"] == 0.5
    assert m["split/high_mode_entropy"] == pytest.approx(2.0)


def test_policy_split_keeps_the_ppo_clip_on_every_row():
    lp, _, x = loss_inputs([[0.0, 0.0]], [1.0], entropy=[[1.0, 3.0]], old_logp=[[0.0, -0.5]], prompt_variant=[1.0])
    loss, m = LOSSES.get("policy_split")(x, eps_low=0.2, eps_high=0.2, split_beta=0.1)
    # token 2: ρ = e^0.5 = 1.65 is clipped at 1.2
    assert loss[0].tolist() == pytest.approx([-1.0 - 0.1, -1.2 - 0.3], abs=1e-5)
    assert m["clip_frac"] == 0.5


def test_policy_split_inputs_prompt_and_config_check():
    fn, spec = LOSSES.get("policy_split"), LOSSES.spec("policy_split")
    assert spec.needs_entropy and spec.requires == {"prompt_variant"}
    _, _, x = loss_inputs([[0.0]], [1.0])
    with pytest.raises(ValueError, match="entropy"):
        fn(x)
    _, _, x = loss_inputs([[0.0]], [1.0], entropy=[[1.0]])
    with pytest.raises(ValueError, match="prompt_variant"):
        fn(x)
