"""f-divergence estimators and closed-form optimal policies against docs/methods/f_divergence.md."""
import math

import pytest
import torch

from lmrl.algos.divergences import DIVERGENCES, optimal_policy
from lmrl.algos.kl import k1, k3

F = {  # the generators themselves, to check the estimators against exact divergences
    "reverse_kl": lambda u: u * torch.log(u),
    "forward_kl": lambda u: -torch.log(u),
    "chi2": lambda u: (u - 1) ** 2,
}


def test_registered_names():
    assert DIVERGENCES.names() == ["chi2", "forward_kl", "reverse_kl"]


def test_kl_optimal_policy_spec_value():
    pi, _ = optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 1.0, "reverse_kl")
    assert pi.tolist() == pytest.approx([0.7311, 0.2689], abs=1e-4)


def test_chi2_optimal_policy_spec_value():
    pi, lam = optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 1.0, "chi2")
    assert lam.item() == pytest.approx(0.5, abs=1e-6)
    assert pi.tolist() == pytest.approx([0.625, 0.375], abs=1e-4)


def test_forward_kl_optimal_policy_closed_form():
    # π = π₀ / (η(λ − r)); Σ = 1 gives λ² − 2λ + 0.5 = 0, λ = 1 + √0.5
    pi, lam = optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 1.0, "forward_kl")
    assert lam.item() == pytest.approx(1 + math.sqrt(0.5), abs=1e-6)
    assert pi.tolist() == pytest.approx([0.5 / math.sqrt(0.5), 0.5 / (1 + math.sqrt(0.5))], abs=1e-6)


@pytest.mark.parametrize("kind", sorted(F))
def test_optimal_policy_maximises_the_objective(kind):
    gen = torch.Generator().manual_seed(0)
    pi0 = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), 0)
    r, eta = torch.randn(5, generator=gen, dtype=torch.float64), 2.0

    def objective(pi):
        return (pi * r).sum() - (pi0 * F[kind](pi / pi0)).sum() / eta

    pi, _ = optimal_policy(pi0, r, eta, kind)
    assert pi.sum().item() == pytest.approx(1.0, abs=1e-9)
    for _ in range(20):
        other = torch.softmax(torch.log(pi) + 0.1 * torch.randn(5, generator=gen, dtype=torch.float64), 0)
        assert objective(pi) >= objective(other) - 1e-12


def test_optimal_policy_batched_and_zero_support():
    pi0 = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    r = torch.tensor([[1.0, 0.0, 5.0], [0.0, 1.0, 2.0]])
    for kind in F:
        pi, lam = optimal_policy(pi0, r, 1.0, kind)
        assert lam.shape == (2, 1)
        assert pi.sum(-1).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
        assert pi[0, 2].item() == 0.0
    pi, _ = optimal_policy(pi0, r, 1.0, "reverse_kl")
    assert pi[1].tolist() == pytest.approx(torch.softmax(torch.log(pi0[1]) + r[1], 0).tolist(), abs=1e-6)


def test_optimal_policy_rejects_nonpositive_eta():
    with pytest.raises(ValueError):
        optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), 0.0, "chi2")


def test_chi2_clips_actions_at_zero():
    pi, _ = optimal_policy(torch.tensor([0.5, 0.5]), torch.tensor([10.0, 0.0]), 1.0, "chi2")
    assert pi.tolist() == pytest.approx([1.0, 0.0], abs=1e-9)


def test_reverse_kl_estimators_are_k1_and_k3():
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    rkl = DIVERGENCES.get("reverse_kl")
    assert torch.allclose(rkl(logp, ref, low_variance=False), k1(logp, ref))
    assert torch.allclose(rkl(logp, ref), k3(logp, ref))


@pytest.mark.parametrize("kind", sorted(F))
@pytest.mark.parametrize("low_variance", [False, True])
def test_estimators_are_unbiased(kind, low_variance):
    gen = torch.Generator().manual_seed(1)
    pi = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    pi0 = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    per_action = DIVERGENCES.get(kind)(torch.log(pi), torch.log(pi0), low_variance=low_variance, clamp=None)
    exact = (pi0 * F[kind](pi / pi0)).sum()
    assert (pi * per_action).sum().item() == pytest.approx(exact.item(), rel=1e-9)
    if low_variance:
        assert (per_action >= 0).all()


def test_estimators_vanish_at_equal_policies_and_clamp():
    logp = torch.tensor([[-1.0, -3.0]])
    for kind in F:
        assert DIVERGENCES.get(kind)(logp, logp).abs().max().item() == 0.0
        assert DIVERGENCES.get(kind)(torch.tensor([0.0]), torch.tensor([-50.0])).item() <= 10.0


F = {"reverse_kl": lambda u: u * torch.log(u), "forward_kl": lambda u: -torch.log(u), "chi2": lambda u: (u - 1) ** 2}


@pytest.mark.parametrize("kind", sorted(F))
def test_regulariser_gradient_is_the_exact_gradient_of_the_divergence(kind):
    """E_{a~π}[∇ regulariser(a)] over all four actions equals ∇ Σ π₀ f(π/π₀); without the
    score-function term it would not (for reverse KL the plain term's expected gradient is 0)."""
    from lmrl.algos.kl import KL_ESTIMATORS

    theta = torch.tensor([0.3, -0.5, 1.1, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.4, -0.2, 0.1], dtype=torch.float64), 0)
    logp = torch.log_softmax(theta, 0)
    exact = (ref.exp() * F[kind](torch.exp(logp - ref))).sum()
    (want,) = torch.autograd.grad(exact, theta)
    reg = KL_ESTIMATORS.get(f"f_{kind}")
    logp = torch.log_softmax(theta, 0)
    values = reg(logp, ref)
    (got,) = torch.autograd.grad((logp.exp().detach() * values).sum(), theta)
    assert torch.allclose(got, want, atol=1e-10)
    assert float((logp.exp() * values).sum()) == pytest.approx(float(exact), rel=1e-9)  # value: unbiased D_f
    plain = DIVERGENCES.get(kind)
    logp = torch.log_softmax(theta, 0)
    (pathwise,) = torch.autograd.grad((logp.exp().detach() * plain(logp, ref)).sum(), theta)
    assert not torch.allclose(pathwise, want, atol=1e-3)
