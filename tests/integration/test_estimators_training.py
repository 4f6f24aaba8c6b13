"""The real loop on a tiny random model with the estimators that read per-sample inputs or model outputs:
reward components (gdpo, rvpo, alpo), step and batch entropy (entrocraft), task row fields (xgrpo, prpo),
critic values (ppo, evpo) and hidden states (resrl). Each one trains; the critic runs learn and resume."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.learners.checkpoint import list_checkpoints
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS

DIGITS = [3 + 26, 3 + 26 + 10]  # token ids of '0'..'9' in the test tokenizer (speech tokens for ALPO)

if "has_digit" not in REWARD_FNS:
    REWARD_FNS.register("has_digit", "toy reward for tests")(
        lambda sample, **_: float(any(c.isdigit() for c in sample.text)))


def write_task(path, n=48):
    rows = [{"question": f"q{i % 12} say 7", "answer": "7", "peer_rewards": [0.0, 1.0][: 1 + i % 2],
             "table": i % 12 // 2, "perm_index": i % 2, "question_without_evidence": "say"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def toy_config(tmp_path, steps, algo, components=("contains_7",), **sections):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return toy_run_config(tmp_path, steps, dataset=write_task(tmp_path / "toy.jsonl"), num_eval=4, num_train=44,
                          algo=algo, reward={"components": [{"name": c} for c in components]}, **sections)


def stages_for(cfg, seed=0):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=seed), tokenizer=tok)


def read_metrics(run_dir):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


TWO = ("contains_7", "has_digit")
ESTIMATORS = [
    ({"preset": "gdpo"}, TWO),
    ({"preset": "rvpo", "advantage_params": {"tau": 0.5}}, TWO),
    ({"preset": "entrocraft", "kl_coef": 0.0}, ("contains_7",)),
    ({"preset": "eqlen"}, ("contains_7",)),
    ({"preset": "xgrpo"}, ("contains_7",)),
    ({"preset": "alpo", "advantage_params": {"acoustic_component": "has_digit", "speech_id_range": DIGITS}}, TWO),
    ({"preset": "prpo", "group_by": "table", "advantage_params": {"lam": 0.5}}, ("contains_7",)),
    ({"preset": "p_grpo", "advantage_params": {"ramp_steps": 2}}, ("contains_7",)),
    ({"preset": "cost_aware_grpo"}, ("contains_7",)),
]


@pytest.mark.parametrize("algo,components", ESTIMATORS, ids=lambda a: a["preset"] if isinstance(a, dict) else "")
def test_estimator_with_loop_inputs_trains(tmp_path, algo, components):
    cfg = toy_config(tmp_path, 3, algo, components)
    stages = stages_for(cfg)
    before = [p.detach().clone() for p in stages.model.parameters()]
    result = train(cfg, stages=stages)
    rows = [r for r in read_metrics(result.run_dir) if "reward/mean" in r]
    assert len(rows) == 3
    assert any(r["advantage/abs_mean"] > 0 for r in rows), rows
    assert any(not torch.equal(a, b) for a, b in zip(before, stages.model.parameters()))
    if algo["preset"] in ("gdpo", "rvpo"):  # the column order of the [B, K] components is logged
        logged = [r for r in read_metrics(result.run_dir) if "inputs/reward_components" in r]
        assert logged[0]["inputs/reward_components"] == ",".join(components)


@pytest.mark.parametrize("preset", ["ppo", "evpo", "resrl"])
def test_model_output_methods_learn_the_toy_task(tmp_path, preset):
    cfg = toy_config(tmp_path, 12, {"preset": preset})
    result = train(cfg, stages=stages_for(cfg))
    rows = [r for r in read_metrics(result.run_dir) if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    if preset != "resrl":
        assert all("critic/explained_variance" in r and "critic/value_loss" in r for r in rows)
        assert rows[-1]["critic/values_mean"] != 0.0


def test_ppo_resume_restores_the_value_head(tmp_path):
    full_cfg = toy_config(tmp_path / "a", 4, {"preset": "ppo"})
    full = stages_for(full_cfg)
    train(full_cfg, stages=full)
    half_cfg = toy_config(tmp_path / "b", 2, {"preset": "ppo"}, run={"checkpoint_every": 1})
    first = train(half_cfg, stages=stages_for(half_cfg))
    assert list_checkpoints(first.run_dir / "checkpoints")
    rest_cfg = toy_config(tmp_path / "b", 4, {"preset": "ppo"}, run={"checkpoint_every": 1})
    resumed = stages_for(rest_cfg, seed=5)
    train(rest_cfg, resume=first.run_dir, stages=resumed)
    assert torch.allclose(full.learner.value_head.weight, resumed.learner.value_head.weight, atol=1e-6)
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_resume_restores_method_state(tmp_path):
    """GEPO's entropy history and ACRL's band continue after a resume exactly as without it."""
    algo = {"advantage": "gepo", "loss": "acrl", "loss_params": {"acrl_d_low": 1.0, "acrl_d_high": 1.0}}
    full_cfg = toy_config(tmp_path / "a", 4, algo)
    full = stages_for(full_cfg)
    train(full_cfg, stages=full)
    half_cfg = toy_config(tmp_path / "b", 2, algo, run={"checkpoint_every": 1})
    first = train(half_cfg, stages=stages_for(half_cfg))
    rest_cfg = toy_config(tmp_path / "b", 4, algo, run={"checkpoint_every": 1})
    resumed = stages_for(rest_cfg, seed=5)
    train(rest_cfg, resume=first.run_dir, stages=resumed)
    assert full.algorithm.states["loss"].controller.band > 2.0  # the band did move (D < d_low: widened)
    assert resumed.algorithm.states["loss"].controller.band == pytest.approx(full.algorithm.states["loss"].controller.band)
    stats_full, stats_resumed = full.algorithm.states["advantage"].stats, resumed.algorithm.states["advantage"].stats
    assert stats_resumed.mean == pytest.approx(stats_full.mean, rel=1e-5)
    assert stats_resumed.std == pytest.approx(stats_full.std, rel=1e-4)
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
