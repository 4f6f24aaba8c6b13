"""The sharded learner (FSDP2 over 2 gloo ranks) updates a tiny Llama as 1 process does on the whole batch,
and its checkpoints resume on 1 and on 2 ranks.

One spawn of 2 ranks runs every case (module fixture), writes a sharded checkpoint after the first of
two updates and resumes it into fresh learners; the reference is the plain one-process learner in
this process, which also resumes that checkpoint. As in
test_data_parallel.py the cases run in float64, where the ranks' other order of summing gradients
(here: reduce-scatter of each micro-batch's gradient) stays ~1e-16 and AdamW's ε hides it: weights
must agree to rtol 1e-6 (seen ~1e-13). The shards are compared gathered (`full_tensor`).
"""
import pytest
import torch
from torch.distributed.tensor import DTensor

from lmrl.algos import Algorithm
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.dist import Parallel, Sharded, assign_groups, spawn_local
from lmrl.learners import Learner
from lmrl.learners.sharded_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from lmrl.models import tiny_llama
from test_data_parallel import TRAINER, group_batch
from conftest import make_tokenizer

CASES = {
    "grpo": dict(sizes=[4, 4, 4, 4], algo=dict(aggregation="token_mean")),
    "gspo": dict(sizes=[4, 4, 4, 4], algo=dict(loss="gspo", aggregation="seq_mean_token_mean", eps_low=3e-4,
                                               eps_high=4e-4)),
    # uneven groups, one inert, two epochs: the ranks' micro-batch counts differ (idle passes)
    "odd_groups": dict(sizes=[3, 5, 4], flat=[1], algo=dict(aggregation="token_mean"), trainer=dict(epochs=2)),
    "one_group": dict(sizes=[6], algo=dict(aggregation="seq_mean_token_sum_norm")),  # rank 1 owns no row
    "critic": dict(sizes=[4, 4, 4], algo=dict(advantage="gae", critic=True)),  # ppo: a replicated value head
    "nan_on_rank_1": dict(sizes=[4, 4, 4, 4], algo={}, nan_rank=1),
    "checkpointing": dict(sizes=[4, 4, 4], algo={}, trainer=dict(gradient_checkpointing=True)),
    # a KL term: the reference is sharded too, its log-probs of each rank's own rows (uneven passes)
    "kl_reference": dict(sizes=[3, 5, 4], algo=dict(kl_coef=0.5)),
}
BF16 = dict(sizes=[4, 4, 4, 4], algo={}, dtype="float32", bf16=True)  # bf16 compute, fp32 master weights


def learner_for(case, parallel):
    algo = Algorithm(AlgoConfig(**case["algo"]), max_new_tokens=6)
    model = tiny_llama(16, hidden=32, layers=2, heads=4, seed=0).to(getattr(torch, case.get("dtype", "float64")))
    learner = Learner(model, TrainerConfig(**{**TRAINER, **case.get("trainer", {})}), bf16=case.get("bf16", False),
                      critic=algo.critic, needs_reference=algo.needs_reference, parallel=parallel)
    return learner, algo


def update(learner, algo, case, seed=0):
    batch = group_batch(case["sizes"], case.get("flat", ()), seed=seed)
    if algo.prepare_outputs:
        batch.extras.update(learner.model_outputs(batch, algo.prepare_outputs))
    algo.prepare(batch)
    if algo.needs_reference:  # after a first update the policy has moved away from the reference
        own = [r for r, mine in enumerate(learner.parallel.shard(batch)) if mine]
        batch.extras["ref_logp"] = learner.logprobs(batch, reference=True, rows=own)
    if "nan_rank" in case:
        ranks = assign_groups(batch.group_index.tolist(), batch.attention_mask.sum(1).tolist(), 2)
        row = ranks.index(case["nan_rank"])
        batch.advantages[row, batch.completion_mask[row] > 0] = float("nan")
    return learner.update(batch, algo)


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def state_of(learner, metrics):
    """Weights, last gradients, AdamW moments (whole tensors) and the update's metrics."""
    params = [*learner.model.parameters(), *(p for m in learner.modules().values() for p in m.parameters())]
    moments = [full(learner.optimizer.state[p]["exp_avg"]).detach().clone() for p in params
               if p in learner.optimizer.state]
    return ([full(p).detach().clone() for p in params], [None if p.grad is None else full(p.grad).clone() for p in params],
            moments, metrics)


def run_cases(parallel, cases, checkpoint_dir, tokenizer, one_process_checkpoint):
    sharded = Sharded()
    out = {}
    for name, case in cases.items():
        learner, algo = learner_for(case, sharded)
        if name == "kl_reference":
            out["reference_sharded"] = all(isinstance(p, DTensor) for p in learner.reference.parameters())
        out[name] = state_of(learner, update(learner, algo, case))
    learner, algo = learner_for(BF16, Sharded(bf16=True))
    out["bf16"] = state_of(learner, update(learner, algo, BF16))
    out["bf16_dtypes"] = {p.dtype for p in learner.model.parameters()} | {
        v.dtype for state in learner.optimizer.state.values() for k, v in state.items() if k != "step"}
    learner, algo = learner_for(CASES["grpo"], sharded)  # two updates, a checkpoint between them
    update(learner, algo, CASES["grpo"])
    state = {"step": 1, "shuffle": learner.shuffle.get_state()}  # what RunState adds (its rng part)
    save_sharded_checkpoint(checkpoint_dir, 1, learner, tokenizer, state, 2, sharded)
    out["second"] = state_of(learner, update(learner, algo, CASES["grpo"], seed=1))
    out["local_elements"] = sum(p.to_local().numel() for p in learner.model.parameters())
    out["resumed"] = resume_cases(parallel, checkpoint_dir / "step-000001")  # a fresh learner on 2 ranks
    out["from_one_process"] = resume_cases(parallel, one_process_checkpoint)
    return out


def resume_cases(parallel, checkpoint):
    sharded = Sharded() if parallel.world_size > 1 else parallel
    learner, algo = learner_for(CASES["grpo"], sharded)
    learner.shuffle.set_state(load_sharded_checkpoint(checkpoint, learner)["shuffle"])
    return state_of(learner, update(learner, algo, CASES["grpo"], seed=1))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    learner, algo = learner_for(CASES["grpo"], Parallel())  # a one-process learner's sharded checkpoint
    update(learner, algo, CASES["grpo"])
    state = {"step": 1, "shuffle": learner.shuffle.get_state()}
    one = save_sharded_checkpoint(root / "one", 1, learner, make_tokenizer(), state, 2, Parallel())
    return spawn_local(run_cases, 2, CASES, root, make_tokenizer(), one), root / "step-000001"


def assert_same(mine, ref, metrics=("grad_norm", "entropy", "mismatch_kl", "inert_rows", "skipped_updates")):
    (params, grads, moments, m), (ref_params, ref_grads, ref_moments, ref_m) = mine, ref
    for a, b in zip(params, ref_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)
    for a, b in zip(grads, ref_grads, strict=True):
        assert (a is None) == (b is None)
        if b is not None:
            assert (a - b).norm() <= 1e-6 * b.norm()
    for a, b in zip(moments, ref_moments, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-14)
    for key in metrics:
        assert m[key] == pytest.approx(ref_m[key], rel=1e-6, nan_ok=True), key


@pytest.mark.parametrize("name", list(CASES))
def test_two_sharded_ranks_update_like_one_process(two_ranks, name):
    ranks, _ = two_ranks
    learner, algo = learner_for(CASES[name], Parallel())
    reference = state_of(learner, update(learner, algo, CASES[name]))
    assert_same(ranks[0][name], reference)
    assert_same(ranks[1][name], ranks[0][name])


def test_bf16_computes_in_bf16_over_fp32_master_weights(two_ranks):
    """FSDP2 casts every weight to bf16 for the forward (norms and embeddings too, which autocast on one process
    keeps in fp32), so the update is not one process's to rounding: the gradient norm agrees to 1e-3 and
    weights to 5 steps of lr (AdamW's sign-like step on elements whose gradient is near zero)."""
    ranks, _ = two_ranks
    learner, algo = learner_for(BF16, Parallel())
    params, _, _, metrics = state_of(learner, update(learner, algo, BF16))
    assert ranks[0]["bf16_dtypes"] == {torch.float32}  # master weights and AdamW moments
    assert ranks[0]["bf16"][3]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-3)
    for mine, ref in zip(ranks[0]["bf16"][0], params, strict=True):
        torch.testing.assert_close(mine, ref, rtol=0, atol=5 * TRAINER["lr"])


def test_the_cases_exercise_what_they_claim(two_ranks):
    ranks, _ = two_ranks
    assert ranks[0]["grpo"][3]["grad_norm"] > TRAINER["max_grad_norm"]  # the global norm was clipped
    assert ranks[0]["odd_groups"][3]["inert_rows"] > 0
    assert ranks[0]["nan_on_rank_1"][3]["skipped_updates"] == 1.0
    assert ranks[0]["critic"][3]["critic/grad_norm"] > 0
    assert ranks[0]["reference_sharded"]
    total = sum(p.numel() for p in tiny_llama(16, hidden=32, layers=2, heads=4).parameters())
    assert ranks[0]["local_elements"] + ranks[1]["local_elements"] == total  # each element on one rank
    assert ranks[0]["local_elements"] <= total / 2 + 32 * 2  # half of each tensor (rounded up per row)


def test_a_sharded_checkpoint_resumes_on_one_process_and_on_two_ranks(two_ranks):
    ranks, checkpoint = two_ranks
    uninterrupted = ranks[0]["second"]
    assert_same(resume_cases(Parallel(), checkpoint), uninterrupted)  # 2 ranks -> 1 process
    assert_same(ranks[0]["resumed"], uninterrupted)  # 2 -> 2
    assert_same(ranks[0]["from_one_process"], uninterrupted)  # 1 -> 2
