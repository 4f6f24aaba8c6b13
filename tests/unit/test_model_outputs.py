"""Per-sample inputs and model outputs: Batch.row_extras, input lookup, the learner's outputs and value
head (exact under packing and micro-batching, checkpointed), and rejected tokens leaving the loss mask."""
from __future__ import annotations

import math

import pytest
import torch

from lmrl.algos import Algorithm
from lmrl.algos.aggregation import AggScale
from lmrl.algos.gather import gather
from lmrl.algos.losses import LossInputs
from lmrl.config import AlgoConfig, TrainerConfig
from lmrl.inputs import InputContext, provide
from lmrl.learners import Learner, load_checkpoint, save_checkpoint
from lmrl.loading import build_config
from lmrl.loops.batching import to_batch
from lmrl.models import tiny_llama
from lmrl.types import Group, Sample, collate


def model():
    return tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)


def shared_prompt_batch(groups: int = 3):
    g = torch.Generator().manual_seed(1)
    samples, index = [], []
    for grp in range(groups):
        prompt = torch.randint(4, 16, (3 + grp,), generator=g).tolist()
        for j in range(4):
            comp = torch.randint(4, 16, (1 + (j * 3 + grp) % 6,), generator=g).tolist()
            samples.append(Sample(prompt, comp, [-1.0] * len(comp), reward=float((j + grp) % 2)))
            index.append(grp)
    return collate(samples, index, pad_id=0)


def test_select_keeps_row_extras_whole_and_trims_token_extras():
    batch = shared_prompt_batch()
    batch.row_extras["reward_components"] = torch.arange(12 * 3, dtype=torch.float).reshape(12, 3)
    batch.extras["per_token"] = torch.ones_like(batch.completion_mask)
    batch.context["step"] = 4
    sub = batch.select([0, 5])
    assert sub.row_extras["reward_components"].tolist() == [[0, 1, 2], [15, 16, 17]]
    assert sub.extras["per_token"].shape == sub.completion_mask.shape
    assert sub.context == {"step": 4}


class TokenEntropy:
    """A learner and algorithm stand-in: the model outputs before `prepare` are token entropies of 2."""

    prepare_outputs, hidden_layer, policy_gradient = {"token_entropy"}, -1, True

    def model_outputs(self, batch, outputs, hidden_layer=-1):
        return {"token_entropy": 2.0 * batch.completion_mask}


def test_providers_fill_aliases_components_speech_and_entropy_and_gather_reads_them():
    rewards = [{"answer": 1.0, "format": 0.2}, {"answer": 0.0, "format": 0.4}, {"answer": 1.0, "format": 0.6},
               {"answer": 0.0, "format": 0.8}]
    samples = [Sample([1, 2], [3 + i, 5, 9], [-1.0] * 3, rewards=r, reward=r["answer"]) for i, r in enumerate(rewards)]
    cfg = build_config({"reward": {"components": [{"name": "answer"}, {"name": "format"}]},
                        "algo": {"advantage_params": {"acoustic_component": "format", "speech_id_range": [4, 10]}}})
    requested = frozenset({"components", "acoustic_rewards", "speech_mask", "step", "entropy"})
    ctx = InputContext(cfg, [Group("g", {}, samples)], requested, step=3, learner=TokenEntropy(),
                       algorithm=TokenEntropy())
    batch = to_batch(ctx, 0)
    provide(batch, ctx, with_learner=True)
    got = gather({"components", "acoustic_rewards", "step", "entropy"}, batch)
    assert got["components"] is batch.row_extras["reward_components"]
    assert got["acoustic_rewards"].tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert got["step"] == 3 and got["entropy"] == pytest.approx(2.0)
    speech = gather({"speech_mask"}, batch)["speech_mask"]
    ids = batch.input_ids[:, 1:]
    assert torch.equal(speech, ((ids >= 4) & (ids < 10)).float() * batch.completion_mask)
    assert speech.sum() == 11  # every generated id lies in [4, 10) but the first row's 3
    with pytest.raises(ValueError, match="peer_rewards"):
        gather({"peer_rewards"}, batch)


def test_to_batch_fills_components_in_config_order_row_fields_and_group_by():
    def group(uid, table, rewards, peers):
        samples = [Sample([1, 2], [3], [-1.0], rewards=r, reward=sum(v or 0 for v in r.values())) for r in rewards]
        return Group(uid, {"table": table, "peer_rewards": peers, "perm_index": int(uid)}, samples)

    groups = [group("0", "t1", [{"format": 0.5, "answer": 1.0}, {"answer": 0.0, "format": None}], [0.3]),
              group("1", "t1", [{"answer": 1.0, "format": 1.0}], [0.1, 0.9]),
              group("2", "t2", [{"answer": 0.0, "format": 0.0}], [])]
    cfg = build_config({"reward": {"components": [{"name": "answer"}, {"name": "format"}]},
                        "algo": {"group_by": "table"}})
    batch = to_batch(InputContext(cfg, groups, frozenset({"peer_rewards", "perm_index"}), step=1), 0)
    comps = batch.row_extras["reward_components"]
    assert comps[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0] and comps[0, 1] == 0.5 and math.isnan(comps[1, 1])
    assert batch.context["reward_component_names"] == ["answer", "format"]
    assert batch.extras["acc"].tolist() == [1.0, 0.0, 1.0, 0.0] and batch.extras["group_acc"].tolist()[:2] == [0.5, 0.5]
    peers = batch.row_extras["peer_rewards"]
    assert peers.shape == (4, 2) and peers[2].tolist() == pytest.approx([0.1, 0.9]) and math.isnan(peers[0, 1])
    assert batch.row_extras["perm_index"].tolist() == [0, 0, 1, 2]
    assert batch.group_index.tolist() == [0, 0, 0, 1]  # prompts 0 and 1 share table t1


def test_outputs_are_exact_under_shared_prompt_packing_and_micro_batching():
    results = []
    for share, budget in ((False, 10_000), (True, 30)):
        learner = Learner(model(), TrainerConfig(share_prompt=share, micro_batch_tokens=budget, bf16=False),
                          critic=True)
        torch.nn.init.normal_(learner.value_head.weight, generator=torch.Generator().manual_seed(0))
        results.append(learner.model_outputs(shared_prompt_batch(), {"values", "hidden", "token_entropy"}))
        results.append(learner.model_outputs(shared_prompt_batch(), {"hidden"}, hidden_layer=-2))
    for key in ("values", "hidden", "token_entropy"):
        assert torch.allclose(results[0][key], results[2][key], atol=1e-5)
    assert torch.allclose(results[1]["hidden"], results[3]["hidden"], atol=1e-5)
    assert not torch.allclose(results[0]["hidden"], results[1]["hidden"])
    batch = shared_prompt_batch()
    assert results[0]["hidden"].shape == batch.completion_mask.shape + (32,)
    assert (results[0]["values"] * (1 - batch.completion_mask)).abs().sum() == 0  # generated positions only


def test_hidden_states_match_a_plain_forward():
    m = model()
    learner = Learner(m, TrainerConfig(bf16=False))
    batch = shared_prompt_batch(groups=1)
    hidden = learner.model_outputs(batch, {"hidden"})["hidden"]
    row = 2
    length = int(batch.attention_mask[row].sum())
    with torch.no_grad():
        full = m.get_decoder()(input_ids=batch.input_ids[row: row + 1, :length]).last_hidden_state[0]
    positions = torch.nonzero(batch.completion_mask[row]).squeeze(1)
    assert torch.allclose(hidden[row, positions], full[positions], atol=1e-5)


def test_value_head_is_trained_and_restored_from_a_checkpoint(tmp_path, tokenizer):
    m = tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=0)
    learner = Learner(m, TrainerConfig(bf16=False, lr=1e-3), critic=True, critic_lr=0.1)
    assert learner.optimizer.param_groups[1]["lr"] == 0.1
    algo = Algorithm(AlgoConfig(advantage="gae", critic=True), max_new_tokens=6)
    batch = shared_prompt_batch()
    batch.extras.update(learner.model_outputs(batch, algo.prepare_outputs))
    assert batch.extras["values"].abs().sum() == 0  # zero-initialised head
    algo.prepare(batch)
    metrics = learner.update(batch, algo)
    assert learner.value_head.weight.abs().sum() > 0 and metrics["critic/grad_norm"] > 0
    path = save_checkpoint(tmp_path, 1, m, tokenizer, learner.optimizer, learner.scheduler, {"step": 1},
                           modules=learner.modules())
    other = Learner(tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=1),
                    TrainerConfig(bf16=False), critic=True)
    load_checkpoint(path, other.model, other.optimizer, other.scheduler, modules=other.modules())
    assert torch.equal(other.value_head.weight, learner.value_head.weight)
    plain = Learner(tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=1),
                    TrainerConfig(bf16=False))
    with pytest.raises(ValueError):
        plain.model_outputs(batch, {"values"})


# --- rejected tokens leave the loss mask -----------------------------------------------------------


def _rejection_inputs():
    """Two rows of 2 tokens; row 1's rollout log-probs are far off, so TRM rejects the sequence."""
    mask = torch.ones(2, 2)
    logp = torch.zeros(2, 2, requires_grad=True)
    rollout = torch.tensor([[0.0, 0.0], [0.0, -5.0]])
    return LossInputs(logp, logp.detach(), torch.ones(2, 2), mask, extras={"rollout_logp": rollout})


@pytest.mark.parametrize("mode,denominator", [("drop", 2.0), ("keep", 4.0)])
def test_rejected_tokens_leave_the_token_mean_denominator_by_default(mode, denominator):
    algo = Algorithm(AlgoConfig(loss="trust_region_masking", rejected_tokens=mode), max_new_tokens=2)
    x = _rejection_inputs()
    batch = shared_prompt_batch(groups=1).select([0, 1])
    batch.completion_mask = x.mask
    batch.extras.update(old_logp=x.old_logp, rollout_logp=x.extras["rollout_logp"])
    scale = algo.scale(algo.aggregation_mask(batch))
    assert scale.num_tokens == denominator
    loss, _ = algo.objective(x, scale)
    assert float(loss.detach()) == pytest.approx(-2.0 / denominator)  # two kept tokens of loss −A·ρ = −1


def test_rejected_sequences_leave_the_sequence_count():
    algo = Algorithm(AlgoConfig(loss="ppo_clip_mis_seq", aggregation="seq_mean_token_mean"), max_new_tokens=2)
    x = _rejection_inputs()
    mask = algo.aggregation_mask(type("B", (), {"completion_mask": x.mask, "extras": {
        "old_logp": x.old_logp, "rollout_logp": x.extras["rollout_logp"]}})())
    assert mask.tolist() == [[1, 1], [0, 0]]
    assert AggScale.of(mask).num_seqs == 1


def test_drop_mode_update_is_exact_under_micro_batching():
    """Same gradient with one micro-batch or many: the denominators count kept tokens of the whole batch."""
    results = []
    for budget, mode in ((10_000, "drop"), (12, "drop"), (12, "keep")):
        m = model()
        learner = Learner(m, TrainerConfig(micro_batch_tokens=budget, lr=1e-2, max_grad_norm=None, bf16=False,
                                           share_prompt=False))
        algo = Algorithm(AlgoConfig(loss="trust_region_masking", rejected_tokens=mode,
                                    loss_params={"trm_criteria": "token_k1", "trm_threshold": 1.5}), max_new_tokens=6)
        batch = shared_prompt_batch()
        g = torch.Generator().manual_seed(3)
        batch.behaviour_logprobs = learner.logprobs(batch) + torch.randn(batch.completion_mask.shape, generator=g)
        algo.prepare(batch)
        learner.update(batch, algo)
        if mode == "drop":
            kept = algo.aggregation_mask(batch).sum()
            assert 0 < kept < batch.completion_mask.sum()
        results.append([p.grad.clone() for p in m.parameters()])
    for a, b, c in zip(*results):
        assert torch.allclose(a, b, atol=1e-6)
    ratio = float(batch.completion_mask.sum() / kept)  # "keep" divides by every token instead
    assert all(torch.allclose(a, c * ratio, atol=1e-6) for a, c in zip(results[0], results[2]))


def test_pmi_is_the_log_prob_gap_between_the_prompt_with_and_without_evidence(tokenizer):
    from lmrl.envs import encode_prompt
    from lmrl.inputs.pmi import pmi

    m = tiny_llama(vocab_size=len(tokenizer), hidden=32, layers=2, heads=4, seed=0)
    learner = Learner(m, TrainerConfig(bf16=False))
    rows = [{"question": "the answer is 7. say it", "question_without_evidence": "say it"}] * 2
    prompt = encode_prompt(tokenizer, rows[0], None)
    completions = [tokenizer("7 ok")["input_ids"], tokenizer("seven")["input_ids"]]
    batch = collate([Sample(prompt, c, [0.0] * len(c), reward=0.0) for c in completions], [0, 0], pad_id=0)
    got = pmi(batch, rows, learner, tokenizer, None, "question_without_evidence")
    bare = encode_prompt(tokenizer, {"question": "say it"}, None)
    for r, comp in enumerate(completions):
        def completion_logp(p):
            ids = torch.tensor([p + comp])
            with torch.no_grad():
                logits = m(input_ids=ids).logits[0, len(p) - 1: -1].log_softmax(-1)
            return logits.gather(1, torch.tensor(comp).unsqueeze(1)).squeeze(1)
        expected = completion_logp(prompt) - completion_logp(bare)
        assert torch.allclose(got[r][batch.completion_mask[r] > 0], expected, atol=1e-5)


def test_optional_inputs_reach_the_estimator_p_grpo_ramp():
    """P-GRPO's `step` is not required but is passed when the batch carries it: λ = step / ramp_steps."""
    batch = shared_prompt_batch(groups=1)
    batch.extras["pmi"] = torch.randn(batch.completion_mask.shape, generator=torch.Generator().manual_seed(0))
    Algorithm(AlgoConfig(), 6).prepare(batch)
    grpo = batch.advantages.clone()
    shifts = []
    for step in (1, 2):
        batch.context["step"] = step
        Algorithm(AlgoConfig(advantage="p_grpo", advantage_params={"ramp_steps": 2}), 6).prepare(batch)
        shifts.append(batch.advantages - grpo)
    assert shifts[1].abs().sum() > 0
    assert torch.allclose(shifts[0], 0.5 * shifts[1], atol=1e-6)


def test_task_fields_an_estimator_reads_must_be_in_every_training_row():
    from lmrl.config import ConfigError
    from lmrl.loading import build_config
    from lmrl.validation import check_row_fields

    cfg = build_config({"algo": {"preset": "xgrpo"}})
    check_row_fields(cfg, [{"peer_rewards": [1.0]}])
    with pytest.raises(ConfigError, match="'peer_rewards'.*1 of 2"):
        check_row_fields(cfg, [{"peer_rewards": [1.0]}, {}])
    with pytest.raises(ConfigError, match="'table'"):
        check_row_fields(build_config({"algo": {"group_by": "table"}}), [{}])
