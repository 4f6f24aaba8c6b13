"""The sharded learner: 2 gloo ranks update a tiny Llama exactly as 1 process does on the whole batch.

All cases run in one spawn of 2 ranks (module fixture); the reference is the one-process learner in
this process. The ranks add up their gradients in another order than one process accumulating its
micro-batches, so results differ by rounding, and AdamW magnifies rounding where an element's
gradient is itself near rounding size: its step lr·g/(|g|+ε) then depends on that noise. Hence the
cases run in float64 (rounding ~1e-16 ≪ ε = 1e-8): weights must agree to rtol 1e-6 (they do to
~1e-12; the value head stays float32, ~1e-7). One float32 case checks the gradient to 1e-5 of its
norm (seen: 7e-7) and weights to 1e-3·lr (seen: 1.4e-7 = 1.4e-4·lr). The two ranks agree bitwise.
"""
import pytest
import torch

from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.dist import Parallel, assign_groups, spawn_local
from lmrl.learners import Learner
from lmrl.models import tiny_llama
from lmrl.types import Sample, collate

VOCAB = 16
TRAINER = dict(mini_batches=2, micro_batch_tokens=24, lr=1e-3, max_grad_norm=0.5, bf16=False, seed=0)
CASES = {
    "token_mean": dict(sizes=[4, 4, 4, 4], algo=dict(aggregation="token_mean")),
    "seq_mean": dict(sizes=[4, 4, 4, 4], algo=dict(aggregation="seq_mean_token_mean")),
    # odd number of groups of unequal sizes, one of them inert (equal rewards), two epochs (old log-probs)
    "odd_groups": dict(sizes=[3, 5, 4], flat=[1], algo=dict(aggregation="token_mean"), trainer=dict(epochs=2)),
    "one_group": dict(sizes=[6], algo=dict(aggregation="seq_mean_token_sum_norm")),  # rank 1 owns no row
    # a loss that rejects tokens: denominators need old log-probs, each rank computes its own rows'
    "rejection": dict(sizes=[4, 4, 4], algo=dict(loss="ppo_clip_mis_token")),
    "critic": dict(sizes=[4, 4, 4], algo=dict(advantage="gae", critic=True)),
    "nan_on_rank_1": dict(sizes=[4, 4, 4, 4], algo={}, nan_rank=1),  # a non-finite loss on one rank only
    "float32": dict(sizes=[4, 4, 4, 4], algo=dict(aggregation="token_mean"), dtype="float32"),
}


def group_batch(sizes, flat=(), seed=0):
    """Groups sharing a prompt, with varied completion lengths, rewards and behaviour log-probs."""
    g = torch.Generator().manual_seed(seed)
    samples, groups = [], []
    for grp, size in enumerate(sizes):
        prompt = torch.randint(4, VOCAB, (2 + grp % 3,), generator=g).tolist()
        for j in range(size):
            n = 1 + int(torch.randint(0, 6, (1,), generator=g))
            completion = torch.randint(4, VOCAB, (n,), generator=g).tolist()
            behaviour = (-1.5 - 2.5 * torch.rand(n, generator=g)).tolist()
            reward = 1.0 if grp in flat else float((j + grp) % 2)
            samples.append(Sample(prompt, completion, behaviour, reward=reward))
            groups.append(grp)
    return collate(samples, groups, pad_id=0)


def run_case(parallel, case):
    """One update of a fresh tiny Llama on the case's batch: weights, last gradients, metrics."""
    algo = Algorithm(AlgoConfig(**case["algo"]), max_new_tokens=6)
    model = tiny_llama(VOCAB, hidden=32, layers=2, heads=4, seed=0).to(getattr(torch, case.get("dtype", "float64")))
    learner = Learner(model, TrainerConfig(**{**TRAINER, **case.get("trainer", {})}), bf16=False,
                      critic=algo.critic, parallel=parallel)
    batch = group_batch(case["sizes"], case.get("flat", ()))
    if algo.prepare_outputs:
        batch.extras.update(learner.model_outputs(batch, algo.prepare_outputs))
    algo.prepare(batch)
    if "nan_rank" in case:
        ranks = assign_groups(batch.group_index.tolist(), batch.attention_mask.sum(1).tolist(), 2)
        row = ranks.index(case["nan_rank"])
        batch.advantages[row, batch.completion_mask[row] > 0] = float("nan")
    metrics = learner.update(batch, algo)
    trained = [*model.parameters(), *(p for m in learner.modules().values() for p in m.parameters())]
    return [p.detach().clone() for p in trained], [None if p.grad is None else p.grad.clone() for p in trained], metrics


def run_cases(parallel, cases):
    out = {name: run_case(parallel, case) for name, case in cases.items()}
    try:  # ranks that pass different batches are told so
        parallel.shard(group_batch([4, 4], seed=parallel.rank))
        out["mismatch"] = None
    except RuntimeError as e:
        out["mismatch"] = str(e)
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return spawn_local(run_cases, 2, CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_update_like_one_process(two_ranks, name):
    ref_params, ref_grads, ref_metrics = run_case(Parallel(), CASES[name])
    (p0, g0, m0), (p1, g1, m1) = two_ranks[0][name], two_ranks[1][name]
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))  # replicas stay identical
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(g0, g1))
    assert m0 == m1
    float32 = CASES[name].get("dtype") == "float32"
    for mine, ref in zip(p0, ref_params):
        torch.testing.assert_close(mine, ref, rtol=1e-6, atol=1e-3 * TRAINER["lr"] if float32 else 1e-12)
    for mine, ref in zip(g0, ref_grads):  # the last mini-batch's clipped global gradient
        assert (mine is None) == (ref is None)
        if ref is not None:
            assert (mine - ref).norm() <= (1e-5 if float32 else 1e-6) * ref.norm()
    for key in ("grad_norm", "entropy", "mismatch_kl", "inert_rows", "skipped_updates"):
        assert m0[key] == pytest.approx(ref_metrics[key], rel=1e-6, nan_ok=True), key


def test_the_cases_exercise_what_they_claim(two_ranks):
    _, _, token_mean = two_ranks[0]["token_mean"]
    assert token_mean["grad_norm"] > TRAINER["max_grad_norm"]  # the global norm was clipped
    assert two_ranks[0]["odd_groups"][2]["inert_rows"] > 0
    assert two_ranks[0]["rejection"][2]["masked_frac"] > 0  # some tokens left the denominators
    assert two_ranks[0]["nan_on_rank_1"][2]["skipped_updates"] == 1.0  # rank 0's loss was finite, it skipped too
    assert two_ranks[0]["critic"][2]["critic/grad_norm"] > 0


def test_ranks_holding_different_batches_are_refused(two_ranks):
    assert "different batches" in two_ranks[0]["mismatch"] and "different batches" in two_ranks[1]["mismatch"]


def test_groups_stay_whole_and_ranks_balance_tokens():
    groups = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
    tokens = [5, 5, 5, 9, 9, 2, 2, 2, 2, 30]
    ranks = assign_groups(groups, tokens, 2)
    for g in set(groups):
        assert len({r for r, gg in zip(ranks, groups) if gg == g}) == 1
    load = [sum(t for t, r in zip(tokens, ranks) if r == k) for k in (0, 1)]
    assert sorted(load) == [33, 38]  # groups of 30+8 and 18+15 tokens: the best split
    assert assign_groups(groups, tokens, 1) == [0] * len(groups)
    assert set(assign_groups([0], [4], 3)) == {0}
