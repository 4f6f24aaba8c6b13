"""Adaptive samplers: the spec's hand-computed cases, the shared history, knobs, state round trips."""
from __future__ import annotations

import pickle

import pytest
import torch

from lmrl.config import ConfigError
from lmrl.data import SAMPLERS
from lmrl.data.adaptive import CurriculumSampler, HiveSampler, difficulty_ranks, entropy_filter, history_filter
from lmrl.data.heapa import HeapaSampler
from lmrl.data.probe import EntropyProbe
from lmrl.data.prompt_stats import PromptStats
from lmrl.data.rail import ARMS, RailSampler
from lmrl.envs.rail_rollout import LinearBandit
from lmrl.engines import HFEngine, SamplingParams
from lmrl.loading import build_config
from lmrl.models import tiny_llama
from lmrl.types import Group, Sample


def rows(n: int, **fields) -> list[dict]:
    return [{"uid": str(i), "question": f"q{i}", "answer": "7", "prompt_ids": [5, 6 + i % 4],
             **{k: v[i] for k, v in fields.items()}} for i in range(n)]


def sample(reward: float, version: int = 0, excluded: str | None = None, tokens: int = 3) -> Sample:
    return Sample(prompt_ids=[5], completion_ids=[7] * tokens, behaviour_logprobs=[-1.0] * tokens,
                  policy_version=[version] * tokens, rewards={"answer": reward}, reward=reward, excluded=excluded)


def group(row: dict, rewards: list[float], version: int = 0, excluded: int = 0) -> Group:
    samples = [sample(r, version) for r in rewards] + [sample(1.0, version, "reward error")] * excluded
    return Group(uid=row["uid"], row=row, samples=samples)


def stub_probe(entropy: dict[str, float], calls: list | None = None):
    def probe(batch: list[dict], tokens: int) -> list[float]:
        if calls is not None:
            calls.append([r["uid"] for r in batch])
        return [entropy.get(r["uid"], 1.0) for r in batch]
    return probe


def test_prompt_stats_pass_rate_reward_cost_and_clock():
    r = rows(2)
    stats = PromptStats("accuracy", "answer")
    stats.observe([group(r[0], [1.0, 0.0, 0.5, 1.0], version=3)])
    assert stats.p_hat("0") == 0.5 and stats.attempts("0") == 4  # 0.5 is not a pass
    assert stats.cost("0") == 3.0 and stats.last_step("0") == 3 and stats.clock == 3
    assert stats.p_hat("1") is None and stats.p_hat("1", 0.5) == 0.5
    by_reward = PromptStats("reward")
    by_reward.observe([group(r[0], [1.0, 0.0, 0.5, 1.0])])
    assert by_reward.p_hat("0") == 0.625


def test_excluded_samples_say_nothing_about_a_prompt():
    r = rows(2)
    stats = PromptStats()
    stats.observe([group(r[0], [0.0, 0.0], excluded=3), group(r[1], [], excluded=2)])
    assert (stats.p_hat("0"), stats.attempts("0"), stats.cost("0")) == (0.0, 2, 3.0)
    assert stats.p_hat("1") is None


def test_hive_spec_case_band_then_entropy():
    """Spec §2.1: p̂ = [0.0, 0.5, 0.9], band [0.1, 0.9) keeps index 1; its entropy 0.05 < 0.2 drops it."""
    assert history_filter([0.0, 0.5, 0.9], band=(0.1, 0.9)) == [1]
    assert entropy_filter([0.05], 0.2) == [False]
    assert history_filter([0.0, 0.5, 0.9, None], band=None, top_k=1) == [1, 3]  # utility ties at 0.25
    assert history_filter([0.0, 0.5, 0.9, None], band=None, top_k=3) == [1, 2, 3]


def test_hive_sampler_keeps_unseen_and_in_band_prompts_with_enough_entropy():
    r = rows(4)
    hive = HiveSampler(r, seed=0, band=[0.1, 0.9], entropy_threshold=0.2)
    hive.observe([group(r[0], [0.0] * 10), group(r[1], [1.0] * 5 + [0.0] * 5), group(r[2], [1.0] * 9 + [0.0])])
    calls: list = []
    hive.probe = stub_probe({"1": 0.05, "3": 1.0}, calls)
    for _ in range(5):
        assert [x["uid"] for x in hive.next_prompts(1)] == ["3"]  # 0 and 2 out of band, 1 below the threshold
    assert {u for c in calls for u in c} <= {"1", "3"}


def test_hive_without_stage_two_needs_no_probe_and_fills_from_the_pass():
    r = rows(3)
    hive = HiveSampler(r, seed=0, entropy_threshold=0.0)
    assert not hive.needs_probe
    hive.observe([group(x, [0.0] * 4) for x in r])  # every prompt out of band
    assert len(hive.next_prompts(2)) == 2


def test_heapa_spec_case_insert_and_medium_sampling():
    """Spec §2.2: cap 4, low_fraction 0.5; rewards 0.2, 0.6 → low, 0.9 (≥ 0.6) → high, 0.1 → low."""
    r = rows(4)
    heap = HeapaSampler(r, seed=0, capacity=4, low_fraction=0.5)
    first = heap.next_prompts(4)  # all four are cold: drawn first
    assert sorted(x["uid"] for x in first) == ["0", "1", "2", "3"] and not heap.cold
    reward = dict(zip((x["uid"] for x in first), [0.2, 0.6, 0.9, 0.1]))
    heap.observe([group(x, [reward[x["uid"]]]) for x in first])
    assert sorted(-k for k, _, _ in heap.low) == [0.1, 0.2, 0.6]
    assert [reward[r[i]["uid"]] for i in heap.high] == [0.9]
    for _ in range(5):
        assert {reward[x["uid"]] for x in heap.next_prompts(3)} == {0.2, 0.6, 0.1}


def test_heapa_mixed_pops_the_top_of_high_and_evicts_high_first():
    r = rows(4)
    heap = HeapaSampler(r, seed=0, capacity=4, low_fraction=0.5, mode="mixed")
    first = heap.next_prompts(4)
    reward = dict(zip((x["uid"] for x in first), [0.2, 0.6, 0.9, 0.1]))
    heap.observe([group(x, [reward[x["uid"]]]) for x in first])
    drawn = heap.next_prompts(2)
    assert reward[drawn[0]["uid"]] == 0.9 and reward[drawn[1]["uid"]] in {0.2, 0.6, 0.1}
    small = HeapaSampler(rows(5), seed=0, capacity=3)
    assert len(small.cold) == 3 and len(small.archive) == 2  # over capacity: the oldest cold rows go


def test_curriculum_window_widens_when_too_few_qualify():
    r = rows(4)
    cur = CurriculumSampler(r, seed=0, window=[0.4, 0.6], widen=0.1)
    cur.observe([group(r[i], v) for i, v in enumerate([[0.0] * 4, [1.0] + [0.0] * 3, [1.0, 1.0, 0.0, 0.0], [1.0] * 4])])
    assert {x["uid"] for x in cur.next_prompts(1)} == {"2"}
    assert {x["uid"] for x in cur.next_prompts(2)} == {"1", "2"}  # [0.4, 0.6] → [0.2, 0.8] takes p̂ = 0.25


def test_curriculum_schedule_goes_from_easy_to_hard_with_the_policy_version():
    r = rows(6, level=[1, 1, 2, 2, 3, 3])
    assert difficulty_ranks(r, "level") == [0.0, 0.0, 2 / 6, 2 / 6, 4 / 6, 4 / 6]
    cur = CurriculumSampler(r, seed=0, difficulty_field="level", start=0.0, ramp_steps=3)
    seen = {x["uid"] for _ in range(4) for x in cur.next_prompts(2)}
    assert seen == {"0", "1"}
    cur.observe([group(r[0], [1.0], version=1)])  # frontier 1/3: level 2 opens
    assert {x["uid"] for _ in range(4) for x in cur.next_prompts(2)} == {"0", "1", "2", "3"}
    cur.observe([group(r[0], [1.0], version=3)])
    assert len({x["uid"] for _ in range(6) for x in cur.next_prompts(2)}) == 6
    with pytest.raises(ValueError, match="row '0' has no 'nope'"):
        CurriculumSampler(r, difficulty_field="nope")


def test_rail_spec_case_greedy_choice_after_ten_pulls_each():
    """Spec §2.4: two arms with mean gains 0.1 and 0.3 after 10 pulls each: greedy picks arm 2."""
    bandit = LinearBandit(arms=2, dim=1)
    for _ in range(10):
        bandit.update(0, [1.0], 0.1)
        bandit.update(1, [1.0], 0.3)
    assert bandit.choose([1.0], greedy=True) == 1
    assert LinearBandit(2, 1, policy="thompson", seed=0).choose([1.0], allowed=[1]) == 1


def test_rail_learns_in_shadow_then_revisits_prompts_with_signal():
    r = rows(8)
    rail = RailSampler(r, seed=0, shadow_steps=1, alpha=0.0)
    first = rail.next_prompts(8)  # shadow: uniform
    rail.observe([group(x, [1.0, 0.0] if int(x["uid"]) < 4 else [0.0, 0.0], version=0) for x in first])
    for x in rail.next_prompts(8):  # still shadow: a second pass, credited as revisits and retries
        rail.observe([group(x, [1.0, 0.0] if int(x["uid"]) < 4 else [0.0, 0.0], version=1)])
    assert rail.bandit.choose(rail.context, greedy=True) == ARMS.index("revisit")
    assert {x["uid"] for x in rail.next_prompts(3)} <= {"0", "1", "2", "3"}  # live now


def same(x, y) -> bool:
    """Equal states: tensors by value, containers element by element."""
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y)
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
    return x == y


def probed(name: str, r: list[dict]):
    sampler = SAMPLERS.get(name)(r, seed=3)
    if getattr(sampler, "needs_probe", False):
        sampler.probe = stub_probe({str(i): 0.1 for i in range(0, len(r), 3)})
    return sampler


def feed(sampler, n_rounds: int, version: int) -> list[list[str]]:
    drawn = []
    for k in range(n_rounds):
        batch = sampler.next_prompts(4)
        drawn.append([x["uid"] for x in batch])
        sampler.observe([group(x, [float((int(x["uid"]) * 7 + k) % 3 == 0), 0.0, 1.0], version + k) for x in batch])
    return drawn


@pytest.mark.parametrize("name", ["uniform", "hive", "heapa", "curriculum", "rail"])
def test_state_dict_round_trip_draws_the_same_prompts(name):
    r = rows(10, level=[i % 3 for i in range(10)])
    sampler = probed(name, r)
    feed(sampler, 4, 0)
    state = pickle.loads(pickle.dumps(sampler.state_dict()))  # as a checkpoint stores it
    after = feed(sampler, 5, 4)  # the live sampler goes on; the saved state must not follow it
    resumed = probed(name, r)
    resumed.load_state_dict(state)
    assert feed(resumed, 5, 4) == after


@pytest.mark.parametrize("name", ["hive", "heapa", "curriculum", "rail"])
def test_observing_excluded_samples_changes_nothing(name):
    r = rows(6)
    a, b = probed(name, r), probed(name, r)
    for k in range(3):
        batch_a, batch_b = a.next_prompts(3), b.next_prompts(3)
        assert batch_a == batch_b
        a.observe([group(x, [float(k % 2), 0.0], k) for x in batch_a])
        b.observe([group(x, [float(k % 2), 0.0], k, excluded=2) for x in batch_b])
    assert same(a.state_dict(), b.state_dict())


def test_sampler_params_unknown_knobs_and_bad_values_fail_clearly():
    with pytest.raises(ConfigError, match="data.sampler_params: unknown param 'bnad' of sampler 'hive'; "
                                          "did you mean 'band'"):
        build_config({"data": {"sampler": "hive", "sampler_params": {"bnad": [0.1, 0.9]}}})
    with pytest.raises(ConfigError, match="'seed' is passed by the run, not a param of sampler 'heapa'"):
        build_config({"data": {"sampler": "heapa", "sampler_params": {"seed": 3}}})
    with pytest.raises(ConfigError, match=r"unknown param 'band' of sampler 'uniform' \(its params: none\)"):
        build_config({"data": {"sampler_params": {"band": [0.1, 0.9]}}})
    cfg = build_config({"data": {"sampler": "hive", "sampler_params": {"band": [0.9, 0.1]}}})
    from lmrl.data import build_sampler

    with pytest.raises(ConfigError, match=r"data.sampler_params of sampler 'hive': band must be \[low, high\]"):
        build_sampler(cfg, rows(3))
    built = build_sampler(build_config({"data": {"sampler": "curriculum", "sampler_params": {"window": [0.2, 0.8]}},
                                        "reward": {"accuracy_component": "answer"}}), rows(3))
    assert built.window == (0.2, 0.8) and built.stats.accuracy_component == "answer"


def test_entropy_probe_is_the_mean_exact_entropy_over_the_probe_tokens():
    model = tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)
    engine = HFEngine(model, eos_token_ids=[3], pad_token_id=0)
    params = SamplingParams(max_new_tokens=40, temperature=0.7)
    probe = EntropyProbe(engine, model, params, torch.Generator().manual_seed(0), bf16=False)
    r = [{"prompt_ids": [5, 6, 7, 8]}, {"prompt_ids": [9, 10]}]
    got = probe(r, 4)
    tokens = engine.generate([x["prompt_ids"] for x in r], 1, SamplingParams(max_new_tokens=4, temperature=0.7),
                             torch.Generator().manual_seed(0))
    for row, out, h in zip(r, tokens, got):
        seq = row["prompt_ids"] + out[0].token_ids
        logits = model(torch.tensor([seq])).logits[0, len(row["prompt_ids"]) - 1:len(seq) - 1] / 0.7
        exact = torch.distributions.Categorical(logits=logits.detach()).entropy().mean()
        assert h == pytest.approx(float(exact), abs=1e-5)
