"""Numerics where lmrl must agree with verl and TRL: group baselines count the real reward of a row
without trainable tokens, GFT's quantile τ is one value for the whole batch (micro-batching and
streaming cannot change it), and returns of a multi-turn episode flow back across the environment's
observation in every estimator that runs a recursion over tokens. Expected values are hand-computed."""
import math

import pytest
import torch

from lmrl.algos import ADVANTAGES, Algorithm
from lmrl.algos.advantages import discounted_returns, outcome_to_token_rewards
from lmrl.algos.critic import gae_advantages_returns
from lmrl.config import AlgoConfig, ConfigError, TrainerConfig
from lmrl.learners import Learner
from lmrl.loading import load_config
from lmrl.models import tiny_llama
from lmrl.types import Sample, collate

SQRT3 = math.sqrt(3.0)

# --- 1. a row with no trainable token keeps its reward in the group statistics ----------------------


def run(name, rewards, mask, **kw):
    r = torch.tensor(rewards, dtype=torch.float)
    return ADVANTAGES.get(name)(outcome_to_token_rewards(r, mask), torch.zeros(len(rewards), dtype=torch.long),
                                mask, **kw)


def last_row_masked(rows=4, width=3):
    mask = torch.ones(rows, width)
    mask[-1] = 0.0
    return mask


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_equal_rewards_give_zero_advantages_with_a_row_without_tokens(name):
    adv = run(name, [1.0, 1.0, 1.0, 1.0], last_row_masked())
    assert adv.abs().max().item() == 0.0  # was [0.5, 0.5, 0.5, 0] for dr_grpo: the empty row counted as 0


def test_the_empty_rows_reward_keeps_its_place_in_the_row_sum():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    tr = outcome_to_token_rewards(torch.tensor([2.0, 5.0]), mask)
    assert tr.sum(1).tolist() == [2.0, 5.0]
    assert tr[0].tolist() == [0.0, 0.0, 2.0, 0.0]


@pytest.mark.parametrize("name, expected", [
    # rewards [1, 0, 0, 1], row 3 has no token: mean 0.5, unbiased std 1/√3 over all four
    ("grpo", [0.5 * SQRT3, -0.5 * SQRT3, -0.5 * SQRT3]),
    ("dr_grpo", [0.5, -0.5, -0.5]),
    ("rloo", [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3]),  # r_i − mean of the three others
])
def test_group_baseline_over_the_four_real_rewards(name, expected):
    adv = run(name, [1.0, 0.0, 0.0, 1.0], last_row_masked(), **({"eps": 0.0} if name == "grpo" else {}))
    assert adv[:3, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert torch.allclose(adv[:3], adv[:3, :1].expand(3, 3))
    assert adv[3].tolist() == [0.0, 0.0, 0.0]


def test_turn_discounted_counts_the_episode_without_trainable_turns_in_the_first_turns_baseline():
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    r = torch.tensor([1.0, 0.0, 1.0])
    adv = ADVANTAGES.get("turn_discounted")(outcome_to_token_rewards(r, mask), torch.zeros(3, dtype=torch.long),
                                            mask, turn_rewards=torch.zeros(3, 2), gamma=1.0, norm_by_std=False)
    # turn 0: G = [1, 0] and the third episode's 1 → mean 2/3; turn 1: G = [1, 0] of the two that reach it
    assert adv[0].tolist() == pytest.approx([1 / 3, 0.0, 0.5])
    assert adv[1].tolist() == pytest.approx([-2 / 3, 0.0, -0.5])
    assert adv[2].tolist() == [0.0, 0.0, 0.0]


def test_algorithm_prepare_keeps_the_reward_of_a_row_whose_turns_are_all_masked():
    samples = [Sample([5, 6], [7, 8, 9], [-1.0] * 3, reward=1.0) for _ in range(3)]
    samples.append(Sample([5, 6], [7, 8, 9], [0.0] * 3, reward=1.0, loss_mask=[0, 0, 0]))
    batch = collate(samples, [0, 0, 0, 0], pad_id=0)
    Algorithm(AlgoConfig(advantage="dr_grpo"), max_new_tokens=3).prepare(batch)
    assert batch.advantages.abs().max().item() == 0.0


# --- 2. GFT's quantile τ is a statistic of the whole batch ----------------------------------------


def gft_batch(learner):
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        n_prompt, n_comp = 2 + i % 3, 2 + (i * 2) % 5
        samples.append(Sample(torch.randint(4, 16, (n_prompt,), generator=g).tolist(),
                              torch.randint(4, 16, (n_comp,), generator=g).tolist(),
                              [0.0] * n_comp, reward=float(i % 2)))
    batch = collate(samples, [0, 0, 0, 1, 1, 1], pad_id=0)
    batch.behaviour_logprobs = learner.logprobs(batch)  # on-policy: the engine's log-probs are the policy's
    return batch


def gft_update(budget):
    model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
    learner = Learner(model, TrainerConfig(micro_batch_tokens=budget, lr=1e-3, max_grad_norm=None, bf16=False))
    algo = Algorithm(AlgoConfig(loss="gft", loss_params={"gft_tau_quantile": 0.5}), max_new_tokens=6)
    batch = gft_batch(learner)
    algo.prepare(batch)
    metrics = learner.update(batch, algo)
    return [p.grad.clone() for p in model.parameters()], metrics, batch


def test_gft_quantile_tau_does_not_depend_on_micro_batching():
    (whole, m_whole, batch), (micro, m_micro, _) = gft_update(10_000), gft_update(8)
    for a, b in zip(whole, micro):
        assert torch.allclose(a, b, atol=1e-6)
    live = (batch.completion_mask > 0) & (batch.advantages != 0)
    tau = torch.quantile(batch.behaviour_logprobs[live].exp(), 0.5).item()
    assert m_whole["gft/tau"] == pytest.approx(tau, rel=1e-6)
    assert m_micro["gft/tau"] == pytest.approx(tau, rel=1e-6)


def test_streaming_refuses_gft_with_a_quantile_tau():
    stream = ["rollout.max_staleness=1", "rollout.stream_chunks=2", "algo.loss=gft"]
    with pytest.raises(ConfigError, match="gft_tau_quantile.*whole batch"):
        load_config("quickstart", stream + ["algo.loss_params={gft_tau_quantile: 0.5}"])
    assert load_config("quickstart", stream + ["algo.loss_params={gft_tau: 0.1}"]).algo.loss == "gft"


# --- 3. multi-turn returns flow back across an observation ----------------------------------------

# mask [1, 1, 0, 0, 1, 1]: turn 1 = tokens 0-1, an observation at 2-3, turn 2 = tokens 4-5; reward 1 at
# the last token. γ = 0.9 per policy token; the observation neither discounts nor breaks the return.
TWO_TURNS = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
REWARD = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
GAMMA, LAM = 0.9, 0.8
MC_RETURNS = [0.729, 0.81, 0.0, 0.0, 0.9, 1.0]


def test_monte_carlo_returns_of_turn_one_include_the_later_turns_reward():
    assert discounted_returns(REWARD, TWO_TURNS, GAMMA)[0].tolist() == pytest.approx(MC_RETURNS, abs=1e-6)


def test_reinforce_pp_whitens_the_returns_that_flow_across_the_observation():
    adv = ADVANTAGES.get("reinforce_pp")(REWARD, torch.tensor([0]), TWO_TURNS, gamma=GAMMA)
    valid = [0.729, 0.81, 0.9, 1.0]  # mean 0.85975, unbiased std √(0.04086075/3)
    mean, std = 0.85975, math.sqrt(0.04086075 / 3)
    expected = [(v - mean) / std for v in valid]
    assert adv[0, [0, 1, 4, 5]].tolist() == pytest.approx(expected, abs=1e-4)
    assert adv[0, [2, 3]].tolist() == [0.0, 0.0]


def test_gae_returns_across_the_observation():
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8]])  # the observation's values are never read
    adv, returns = gae_advantages_returns(REWARD, values, TWO_TURNS, GAMMA, LAM)
    # δ5 = 1 − 0.8 = 0.2; δ4 = 0.9·0.8 − 0.7 = 0.02, A4 = 0.02 + 0.72·0.2 = 0.164;
    # δ1 = 0.9·0.7 − 0.6 = 0.03 (next value: token 4's), A1 = 0.03 + 0.72·0.164 = 0.14808;
    # δ0 = 0.9·0.6 − 0.5 = 0.04, A0 = 0.04 + 0.72·0.14808 = 0.1466176; R = A + V
    assert adv[0].tolist() == pytest.approx([0.1466176, 0.14808, 0.0, 0.0, 0.164, 0.2], abs=1e-6)
    assert returns[0].tolist() == pytest.approx([0.6466176, 0.74808, 0.0, 0.0, 0.864, 1.0], abs=1e-6)
    # with a zero critic and λ = 1 the λ-returns are the Monte-Carlo returns of reinforce_pp and evpo
    _, mc = gae_advantages_returns(REWARD, torch.zeros_like(values), TWO_TURNS, GAMMA, 1.0)
    assert mc[0].tolist() == pytest.approx(MC_RETURNS, abs=1e-6)


def test_evpo_baseline_branch_uses_the_returns_across_the_observation():
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8]])
    adv = ADVANTAGES.get("evpo")(REWARD, torch.tensor([0]), TWO_TURNS, values=values, gamma=GAMMA, lam=LAM,
                                 ev_threshold=1.0)  # EV ≤ 1 always: the batch-mean baseline branch
    mean = (0.729 + 0.81 + 0.9 + 1.0) / 4  # 0.85975
    expected = [0.729 - mean, 0.81 - mean, 0.0, 0.0, 0.9 - mean, 1.0 - mean]
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-6)
