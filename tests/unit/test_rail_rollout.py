"""RAIL's in-rollout interventions: plain rollouts while in shadow, then the bandit's arm per prompt; a resample
keeps the worst completion's prefix exactly (out of the loss) and samples exact suffixes; each group's arm is
credited with its signal minus the plain groups' mean (hand-computed); the bandit's state survives a resume."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tokenizer, run_tiny, toy_run_config
from lmrl.engines.base import SamplingParams
from lmrl.engines.hf import HFEngine
from lmrl.envs.rail_rollout import ARM_NAMES, RailInterventions
from lmrl.models import tiny_llama
from lmrl.types import Group, Sample


@pytest.fixture(scope="module")
def engine_and_prompt():
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).eval()
    return model, HFEngine(model, [tok.eos_token_id], tok.pad_token_id), tok("say 7", add_special_tokens=False)["input_ids"]


def scored(prompt, completions, rewards):
    samples = [Sample(prompt_ids=prompt, completion_ids=c.token_ids, behaviour_logprobs=c.logprobs, reward=r,
                      policy_version=c.policy_version, info=c.info) for c, r in zip(completions, rewards)]
    return Group("g", {}, samples)


def test_shadow_then_resample_from_the_worst_prefix_exactly(engine_and_prompt):
    model, engine, prompt = engine_and_prompt
    rail = RailInterventions(arms=["none", "resample"], shadow_steps=1, prefix_share=0.5)
    params, gen = SamplingParams(max_new_tokens=8), torch.Generator().manual_seed(0)
    first = rail.complete(engine, [prompt], 4, params, gen)[0]
    assert {c.info["rail"]["arm"] for c in first} == {"none"} and first[0].info["rail"]["context"] == [1.0, 0, 0, 0]
    rail.observe([scored(prompt, first, [1.0, 0.0, 1.0, 1.0])])  # completion 1 is the worst
    assert rail.context(prompt) == [1.0, 0.75, 0.0, 1.0]
    rail.bandit.b[ARM_NAMES.index("resample")] += 10.0  # make the bandit prefer the resample
    second = rail.complete(engine, [prompt], 4, params, gen)[0]
    worst, k = first[1], max(1, min(len(first[1].token_ids) - 1, len(first[1].token_ids) // 2))
    for c in second:
        assert c.info["rail"]["arm"] == "resample" and c.info["metrics"]["rail/arm_resample"] == 1.0
        assert c.token_ids[:k] == worst.token_ids[:k] and c.logprobs[:k] == worst.logprobs[:k]
        assert c.loss_mask == [0] * k + [1] * (len(c.token_ids) - k) and len(c.token_ids) <= 8
        with torch.no_grad():  # the suffix's log-probs are the model's own given the prompt and the prefix
            logp = torch.log_softmax(model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1], -1)
        want = logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs[k:]), want[k:], atol=1e-5, rtol=1e-5)


def test_each_groups_arm_is_credited_with_its_signal_against_the_plain_groups(engine_and_prompt):
    _, engine, prompt = engine_and_prompt
    rail = RailInterventions(shadow_steps=0)
    plain = rail.complete(engine, [prompt], 2, SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(1))[0]
    arm = plain[0].info["rail"]["arm"]
    rail.observe([scored(prompt, plain, [0.0, 1.0])])  # std 0.5, no baseline yet: reward 0.5 at context [1,0,0,0]
    assert float(rail.bandit.b[ARM_NAMES.index(arm)][0]) == pytest.approx(0.5)
    assert rail.baseline == ([0.5, 1] if arm == "none" else [0.0, 0])
    rail.baseline = [0.5, 1]
    branch = [type(c)(c.token_ids, c.logprobs, c.finish_reason, c.policy_version,
                      info={"rail": {"arm": "branch", "context": [1.0, 0.5, 0.0, 1.0]}}) for c in plain]
    before = rail.bandit.b[ARM_NAMES.index("branch")].clone()
    rail.observe([scored(prompt, branch, [1.0, 1.0])])  # std 0 against the baseline 0.5: reward -0.5
    torch.testing.assert_close(rail.bandit.b[ARM_NAMES.index("branch")] - before,
                               -0.5 * torch.tensor([1.0, 0.5, 0.0, 1.0], dtype=torch.float64))


def rail_config(tmp_path, steps):
    return toy_run_config(tmp_path, steps, rollout={"controller": "rail", "group_size": 4,
                                                    "controller_params": {"shadow_steps": 1, "branch_tokens": 2}},
                          run={"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False,
                               "checkpoint_every": 2})


def run(cfg, resume=None):
    return [r for r in run_tiny(cfg, resume)[0] if "reward/mean" in r]


def test_rail_trains_and_a_resumed_run_chooses_as_the_straight_one(tmp_path):
    from lmrl.loading import load_run_config

    straight = run(rail_config(tmp_path / "a", 4))
    assert straight[0]["rail/arm_none"] == 1.0  # in shadow
    assert any(r["rail/arm_none"] < 1.0 for r in straight[1:])  # a seen prompt may be resampled or branched
    run(rail_config(tmp_path / "b", 2))
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed = run(load_run_config(run_dir, ["trainer.steps=4"]), resume=run_dir)
    keys = ("rail/arm_none", "rail/arm_resample", "rail/arm_branch", "reward/mean", "loss")
    assert [r[k] for r in resumed if r["step"] > 2 for k in keys] == \
        pytest.approx([r[k] for r in straight if r["step"] > 2 for k in keys], rel=1e-5)
