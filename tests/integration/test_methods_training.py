"""The real loop on a tiny random model with the soft-clipping, controller and entropy-control methods that the
loop can feed (output_reset, gft, acrl with its adaptive band, gepo with its entropy history, pipo
with its replay of the previous batch, the χ² regulariser): reward rises on a toy task, and each method's own
metrics reach the run's metrics file."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.types import Origin


def toy_config(tmp_path, steps, algo, trainer):
    return toy_run_config(tmp_path, steps, algo=algo, trainer=trainer)


def train_toy(tmp_path, algo, trainer, steps=15):
    cfg = toy_config(tmp_path, steps, algo, trainer)
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    return [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


# With one optimiser step per batch logp = logp_roll, where Output Reset's gradient is 0.4× the PPO
# one (Adam makes that the same step); two mini-batches let the second one start past ℓ = 0.
METHODS = [
    ({"loss": "output_reset", "loss_params": {"or_margin": 0.2}}, {"mini_batches": 2}, "or/active_frac"),
    ({"loss": "gft", "loss_params": {"gft_tau": 0.1}}, {}, "gft/coef_mean"),
    ({"loss": "acrl", "loss_params": {"acrl_band": 2.0}}, {}, "acrl/next_band"),
    ({"advantage": "gepo", "advantage_params": {"entropy_decay": 0.9}}, {}, "gepo/entropy_std"),
    ({"advantage": "pipo"}, {}, "replay/grad_norm"),
    ({"kl_estimator": "f_chi2", "kl_coef": 0.05}, {}, "kl"),
    ({"advantage": "hargo"}, {}, "advantage/abs_mean"),
    ({"loss": "ppo_clip_mis_seq"}, {}, "masked_frac"),
]


@pytest.mark.parametrize("algo, trainer, metric", METHODS, ids=[a.get("loss", a.get("advantage", a.get("kl_estimator"))) for a, _, _ in METHODS])
def test_tiny_model_learns_toy_task(tmp_path, algo, trainer, metric):
    rows = [r for r in train_toy(tmp_path, algo, trainer) if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, (algo, rewards)
    assert all(r["skipped_updates"] == 0 for r in rows)
    values = [r[metric] for r in rows if metric in r]
    assert values and all(math.isfinite(v) for v in values)


def test_policy_split_rolls_out_both_modes_in_one_group(tmp_path):
    from lmrl.config import ConfigError
    from lmrl.loops.batching import to_batch
    from lmrl.loops.collect import batch_inputs, collect_groups

    cfg = toy_config(tmp_path, 8, {"preset": "policy_split"}, {})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    seen, kept, _ = collect_groups(stages)
    assert len(kept) == 2 * cfg.rollout.prompts_per_step
    plain, variant = kept[0], kept[1]
    assert (plain.row["prompt_variant"], variant.row["prompt_variant"]) == (0, 1)
    assert variant.row["variant_of"] == plain.row["uid"] and variant.row["question"].startswith(plain.row["question"])
    assert len(variant.samples[0].prompt_ids) > len(plain.samples[0].prompt_ids)
    batch = to_batch(batch_inputs(stages, kept, 1), 0)
    g = cfg.rollout.group_size
    assert batch.group_index[: 2 * g].tolist() == [0] * (2 * g)  # both modes pooled
    assert batch.row_extras["prompt_variant"][: 2 * g].tolist() == [0] * g + [1] * g
    rows = [r for r in train_toy(tmp_path / "run", {"preset": "policy_split"}, {}) if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in rows]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert all(r["split/high_entropy_rows"] > 0 for r in rows if "split/high_entropy_rows" in r)
    with pytest.raises(ConfigError, match="task.prompt_variants"):
        build_stages(toy_config(tmp_path / "bad", 2, {"loss": "policy_split"}, {}), model=stages.model, tokenizer=tok)


@pytest.mark.parametrize("mode, algo", [("rescue", {"demo_nll_coef": 0.5}), ("group", {"loss": "gft"})])
def test_demonstrations_train_in_the_loop(tmp_path, mode, algo):
    """SGT's rescue rows (supervised term) and GFT's demonstration group member: the run trains, demos
    are added, and their behaviour log-probs are the policy's own (not the placeholder zeros)."""
    from lmrl.loops.batching import to_batch
    from lmrl.inputs import provide
    from lmrl.loops.collect import batch_inputs, collect_groups

    cfg = toy_run_config(tmp_path, 12, algo=algo, data={"demonstrations": mode}, task={"demonstration": "{answer}"})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    _, kept, metrics = collect_groups(stages)
    assert metrics["data/demonstrations"] > 0
    inputs = batch_inputs(stages, kept, 1)
    batch = to_batch(inputs, 0)
    provide(batch, inputs, with_learner=True)
    demo_rows = batch.row_extras["demonstration"].nonzero().flatten()
    assert len(demo_rows) == metrics["data/demonstrations"]
    assert (batch.behaviour_logprobs[demo_rows].sum(1) < 0).all()
    rows = [r for r in train(cfg, stages=stages).run_dir.joinpath("metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(r) for r in rows]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    if mode == "rescue":
        assert any("demo_nll" in r for r in rows)


def test_peer_rollouts_train_with_their_sequence_importance_weight(tmp_path):
    """PRP: each prompt's two peer completions ("7", right; "3", wrong) join its group with the peer's
    log-probs; the sequence IS weight of a peer row is min(π_self(y)/π_peer(y), 2) and the run learns."""
    from lmrl.loops.batching import to_batch
    from lmrl.inputs import provide
    from lmrl.loops.collect import batch_inputs, collect_groups

    peers = [{"text": "7", "logprob": -1.0}, {"text": "3", "logprob": -30.0}]
    rows = [{"question": f"q{i % 10} say 7", "answer": "7", "peers": peers} for i in range(64)]
    task = tmp_path / "peers.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = toy_run_config(tmp_path, 12, dataset=task, algo={"preset": "prp"}, task={"peer_rollouts": "peers"})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    _, kept, metrics = collect_groups(stages)
    assert metrics["data/demonstrations"] == 2 * cfg.rollout.prompts_per_step
    inputs = batch_inputs(stages, kept, 1)
    batch = to_batch(inputs, 0)
    provide(batch, inputs, with_learner=True)
    peer_rows = torch.tensor([i for i, x in enumerate(inputs.samples) if x.origin is Origin.PEER])
    assert batch.behaviour_logprobs[peer_rows].sum(1).tolist() == pytest.approx([-1.0, -30.0] * 4, abs=1e-4)
    own = stages.learner.logprobs(batch)[peer_rows].mul(batch.completion_mask[peer_rows]).sum(1)
    weight = torch.exp(own - torch.tensor([-1.0, -30.0] * 4)).clamp(max=2.0)
    assert weight[1::2].tolist() == pytest.approx([2.0] * 4)  # the self policy finds "3" far likelier than e^-30
    rows = [json.loads(r) for r in train(cfg, stages=stages).run_dir.joinpath("metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert all(0 < r["is_weight_mean"] <= 2.0 for r in rows if "is_weight_mean" in r)


def test_peer_file_from_another_model_feeds_prp(tmp_path):
    """`python -m lmrl.task_files peers` writes the recipe's training rows with a saved model's rollouts and
    their summed behaviour log-probs; the file is a task the prp preset trains on."""
    from lmrl.loops.collect import collect_groups
    from lmrl.task_files import main as write_task_file

    tok = make_tokenizer()
    peer_dir = tmp_path / "peer"
    tok.save_pretrained(peer_dir)
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=3).save_pretrained(peer_dir)
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(json.dumps(toy_run_config(tmp_path, 2).model_dump(mode="json")))
    out = tmp_path / "peers.jsonl"
    argv = ["peers", str(recipe), str(out), "--model", str(peer_dir), "--samples", "3", "--rows", "5"]
    assert write_task_file(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(len(r["peer_rollouts"]) == 3 for r in rows)
    assert all(p["logprob"] < 0 and isinstance(p["text"], str) for r in rows for p in r["peer_rollouts"])
    assert not any("prompt_ids" in r for r in rows) and rows[0]["answer"] == "7"
    cfg = toy_run_config(tmp_path / "prp", 1, dataset=out, num_eval=1, algo={"preset": "prp"})
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    _, kept, metrics = collect_groups(stages)
    assert metrics["data/demonstrations"] == 3 * cfg.rollout.prompts_per_step
    assert all(len(g.samples) == cfg.rollout.group_size + 3 for g in kept)


def test_group_filter_keeps_or_drops_a_prompt_with_its_variants(tmp_path):
    """DAPO's filter with prompt variants judges each prompt on its pooled groups: kept groups come
    in (plain, variant) pairs of the same prompt."""
    from lmrl.loops.collect import collect_groups

    cfg = toy_config(tmp_path, 2, {"preset": "policy_split"}, {})
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"group_filter": "nonzero_std"})})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    seen, kept, metrics = collect_groups(stages)
    assert len(kept) % 2 == 0 and kept
    for plain, variant in zip(kept[::2], kept[1::2]):
        assert (plain.row["prompt_variant"], variant.row["prompt_variant"]) == (0, 1)
        assert variant.row["variant_of"] == plain.row["uid"]
        rewards = {x.reward for x in plain.samples + variant.samples}
        assert len(rewards) > 1  # the pooled group has signal (each half alone may not)
