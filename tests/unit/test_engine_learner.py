"""The hf engine and the learner on a tiny random model: log-probs agree, micro-batching is exact."""
import pytest
import torch

from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.data import UniformSampler
from lmrl.engines import HFEngine, SamplingParams
from lmrl.engines.hf import filter_logits
from lmrl.learners import Learner, fill_budget
from lmrl.models import tiny_llama
from lmrl.types import Sample, collate


@pytest.fixture
def model():
    return tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)


def full_forward_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def test_engine_logprobs_match_a_full_forward_with_padding_and_eos(model):
    engine = HFEngine(model, eos_token_ids=[3], pad_token_id=0)
    prompts = [[5, 6, 7, 8], [9, 10]]
    out = engine.generate(prompts, 4, SamplingParams(max_new_tokens=12), torch.Generator().manual_seed(0))
    reasons = set()
    for prompt, group in zip(prompts, out):
        assert len(group) == 4
        for c in group:
            reasons.add(c.finish_reason)
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == 3)
            assert 3 not in c.token_ids[:-1]
            assert c.logprobs == pytest.approx(full_forward_logprobs(model, prompt, c.token_ids), abs=1e-4)
    assert reasons == {"stop", "length"}  # both early exit and truncation happened


def test_engine_is_reproducible_with_a_seeded_generator(model):
    engine = HFEngine(model, eos_token_ids=[3], pad_token_id=0)
    params = SamplingParams(max_new_tokens=8)
    a = engine.generate([[5, 6]], 3, params, torch.Generator().manual_seed(1))
    b = engine.generate([[5, 6]], 3, params, torch.Generator().manual_seed(1))
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]
    greedy = engine.generate([[5, 6]], 2, SamplingParams(max_new_tokens=8, greedy=True))
    assert greedy[0][0].token_ids == greedy[0][1].token_ids


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, 0, 0.7)[0])
    assert kept.tolist() == [True, True, False, False]


def test_fill_budget():
    batches = fill_budget([10, 3, 7, 3, 9], budget=20)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    lengths = [10, 3, 7, 3, 9]
    assert all(len(b) * max(lengths[i] for i in b) <= 20 or len(b) == 1 for b in batches)


def make_batch():
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        n_prompt, n_comp = 2 + i % 3, 1 + (i * 2) % 5
        samples.append(Sample(prompt_ids=torch.randint(4, 16, (n_prompt,), generator=g).tolist(),
                              completion_ids=torch.randint(4, 16, (n_comp,), generator=g).tolist(),
                              behaviour_logprobs=[-1.0] * n_comp, reward=float(i % 2)))
    return collate(samples, [0, 0, 0, 1, 1, 1], pad_id=0)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batching_gives_the_same_gradient(aggregation):
    grads = []
    for budget in (10_000, 8):
        model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
        algo = Algorithm(AlgoConfig(aggregation=aggregation), max_new_tokens=5)
        learner = Learner(model, TrainerConfig(micro_batch_tokens=budget, lr=1e-3, max_grad_norm=None, bf16=False))
        batch = make_batch()
        algo.prepare(batch)
        learner.update(batch, algo)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_learner_logprobs_match_full_forward():
    model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
    learner = Learner(model, TrainerConfig(micro_batch_tokens=12, bf16=False))
    batch = make_batch()
    logp = learner.logprobs(batch)
    for row in range(batch.num_rows):
        n = int(batch.attention_mask[row].sum())
        full = torch.log_softmax(model(batch.input_ids[row: row + 1, :n]).logits[0], -1)
        for t in torch.nonzero(batch.completion_mask[row]).squeeze(1).tolist():
            assert logp[row, t].item() == pytest.approx(full[t, batch.input_ids[row, t + 1]].item(), abs=1e-5)


def test_non_finite_loss_skips_the_update():
    model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    algo = Algorithm(AlgoConfig(), max_new_tokens=5)
    learner = Learner(model, TrainerConfig(bf16=False))
    batch = make_batch()
    algo.prepare(batch)
    batch.advantages[0, batch.completion_mask[0] > 0] = float("nan")
    metrics = learner.update(batch, algo)
    assert metrics["skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_uniform_sampler_state_round_trip():
    rows = [{"uid": str(i)} for i in range(5)]
    a = UniformSampler(rows, seed=3)
    a.next_prompts(7)
    b = UniformSampler(rows, seed=99)
    b.load_state_dict(a.state_dict())
    assert a.next_prompts(6) == b.next_prompts(6)
    assert sorted(r["uid"] for r in UniformSampler(rows, seed=0).next_prompts(5)) == ["0", "1", "2", "3", "4"]


def shared_prompt_batch():
    g = torch.Generator().manual_seed(1)
    samples, groups = [], []
    for grp in range(3):
        prompt = torch.randint(4, 16, (3 + grp,), generator=g).tolist()
        for j in range(4):
            comp = torch.randint(4, 16, (1 + (j * 3 + grp) % 6,), generator=g).tolist()
            samples.append(Sample(prompt, comp, [-1.0] * len(comp), reward=float((j + grp) % 2)))
            groups.append(grp)
    return collate(samples, groups, pad_id=0)


def test_shared_prompt_packing_is_exact():
    results = []
    for share in (False, True):
        model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
        learner = Learner(model, TrainerConfig(share_prompt=share, micro_batch_tokens=30, lr=1e-3,
                                               max_grad_norm=None, bf16=False))
        batch = shared_prompt_batch()
        logp = learner.logprobs(batch)
        algo = Algorithm(AlgoConfig(), max_new_tokens=6)
        algo.prepare(batch)
        learner.update(batch, algo)
        results.append((logp, [p.grad.clone() for p in model.parameters()]))
    (lp_a, grads_a), (lp_b, grads_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5)
    assert (lp_a != 0).sum() == shared_prompt_batch().completion_mask.sum()
    for a, b in zip(grads_a, grads_b):  # Adam's first step is ~lr·sign(g): compare gradients
        assert torch.allclose(a, b, atol=1e-6)


def test_packing_shares_each_prompt_once():
    from lmrl.learners.packing import pack, prompt_units

    batch = shared_prompt_batch()
    units = prompt_units(batch)
    assert [len(u) for u in units] == [4, 4, 4]
    packed = pack(batch, units, pad_id=0)
    unpacked_tokens = int(batch.attention_mask.sum())
    assert sum(packed.lengths) == unpacked_tokens - sum(3 * (3 + g) for g in range(3))


def test_inverse_cdf_sampling_follows_the_distribution_and_skips_zero_mass():
    from lmrl.engines.hf import inverse_cdf_sample

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2]]).repeat(20000, 1)
    draws = inverse_cdf_sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[0] == 0 and freq[2] == 0
    assert freq[[1, 3, 4]].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.015)


@pytest.mark.parametrize("mini_batches,epochs", [(1, 1), (2, 2)])
def test_inert_rows_are_skipped_without_changing_the_update(monkeypatch, mini_batches, epochs):
    """A group with equal rewards has zero advantages: skipping its rows leaves the update unchanged."""
    def batch_with_a_flat_group():
        batch = shared_prompt_batch()
        batch.sequence_rewards[batch.group_index == 1] = 1.0  # group 1: all rewards equal
        return batch

    results = []
    for skip in (False, True):
        model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
        learner = Learner(model, TrainerConfig(micro_batch_tokens=30, lr=1e-2, max_grad_norm=None, bf16=False,
                                               mini_batches=mini_batches, epochs=epochs))
        algo = Algorithm(AlgoConfig(), max_new_tokens=6)
        if not skip:
            monkeypatch.setattr(algo, "inert_rows", lambda b: torch.zeros(b.num_rows, dtype=torch.bool))
        batch = batch_with_a_flat_group()
        algo.prepare(batch)
        forwards = []
        monkeypatch.setattr(learner, "forward_logprobs",
                            lambda m, b, **kw: forwards.append(b.num_rows) or Learner.forward_logprobs(learner, m, b, **kw))
        metrics = learner.update(batch, algo)
        results.append(([p.detach().clone() for p in model.parameters()] + [p.grad.clone() for p in model.parameters()],
                        sum(forwards), metrics))
    (params_all, rows_all, _), (params_skip, rows_skip, metrics) = results
    assert metrics["inert_rows"] == pytest.approx(4 / 12)
    assert rows_skip < rows_all
    for a, b in zip(params_all, params_skip):  # weights and the last mini-batch's gradients
        assert torch.allclose(a, b, atol=1e-6)


def test_no_rows_are_inert_with_an_entropy_bonus_or_kl_loss():
    batch = shared_prompt_batch()
    batch.sequence_rewards.fill_(1.0)
    for cfg in (AlgoConfig(entropy_coef=0.01), AlgoConfig(kl_coef=0.1)):
        algo = Algorithm(cfg, max_new_tokens=6)
        algo.prepare(batch) if cfg.kl_coef == 0 else setattr(batch, "advantages", torch.zeros_like(batch.completion_mask))
        assert not algo.inert_rows(batch).any()
    algo = Algorithm(AlgoConfig(), max_new_tokens=6)
    algo.prepare(batch)
    assert algo.inert_rows(batch).all()
