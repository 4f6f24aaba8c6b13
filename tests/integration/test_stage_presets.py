"""The stage presets end to end on a tiny model, from dataset files as users write them: `algo.preset=sft` trains
the assistant's tokens of chat rows only, `algo.preset=dpo` starts at log 2 and prefers the chosen replies, and
a bad dataset fails before any model loads."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama


def chats(path, n=12):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i % 5}"},
                          {"role": "assistant", "content": "a7"}, {"role": "user", "content": "again"},
                          {"role": "assistant", "content": "77"}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def preferences(path, n=12):
    rows = [{"prompt": [{"role": "user", "content": f"q{i % 5} say 7"}], "chosen": [{"role": "assistant", "content": "7"}],
             "rejected": [{"role": "assistant", "content": f"{i % 3}x"}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(cfg):
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    result = train(cfg, stages=stages)
    return [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()], stages


def test_sft_trains_the_assistant_tokens_only(tmp_path):
    cfg = toy_run_config(tmp_path, 10, algo={"preset": "sft"}, trainer={"lr": 1e-2},
                         batches={"dataset": str(chats(tmp_path / "chats.jsonl")), "size": 4, "num_eval": 2},
                         eval={"at_start": True, "at_end": True, "num_prompts": 2})
    rows, stages = run(cfg)
    sample = stages.offline.train[0].samples[0]
    tok = stages.tokenizer
    trained = [t for t, m in zip(sample.completion_ids, sample.loss_mask) if m]
    assert tok.decode(trained) == "a7<|im_end|>77<|im_end|>"  # both assistant turns, their end-of-turn tokens
    steps = [r for r in rows if "nll" in r]
    assert steps[0]["data/trained_tokens"] == 4 * 6
    assert steps[-1]["nll"] < 0.5 * steps[0]["nll"]
    evals = [r for r in rows if "eval/loss" in r]
    assert len(evals) == 2 and evals[-1]["eval/loss"] < evals[0]["eval/loss"]


def test_dpo_starts_at_log_2_and_prefers_the_chosen_replies(tmp_path):
    cfg = toy_run_config(tmp_path, 8, algo={"preset": "dpo"}, trainer={"lr": 1e-2},
                         batches={"dataset": str(preferences(tmp_path / "pairs.jsonl")), "size": 4})
    rows, stages = run(cfg)
    assert stages.learner.needs_reference
    chosen, rejected = stages.offline.train[0].samples
    assert chosen.prompt_ids == rejected.prompt_ids
    steps = [r for r in rows if "pref/loss" in r]
    assert steps[0]["pref/loss"] == pytest.approx(0.693147, abs=1e-5)
    assert steps[-1]["pref/loss"] < 0.3 and steps[-1]["pref/reward_accuracy"] == 1.0


def test_a_dataset_in_another_format_fails_before_the_model_loads(tmp_path):
    cfg = toy_run_config(tmp_path, 1, algo={"preset": "dpo"},
                         batches={"dataset": str(chats(tmp_path / "chats.jsonl"))})
    with pytest.raises(ConfigError, match="messages format; batches.source=pairs reads preference"):
        build_stages(cfg, model=object(), tokenizer=make_tokenizer())
    with pytest.raises(ConfigError, match=r"reads the row labels \['chosen', 'pair'\].*use batches.source="
                                          "online_pairs or pairs or rollout_pairs"):
        toy_run_config(tmp_path, 1, algo={"terms": [{"name": "dpo"}]})


def test_sources_refuse_settings_their_batches_would_ignore(tmp_path):
    """Each refusal names the setting: read from the source's and the term's declarations."""
    pairs = {"dataset": str(preferences(tmp_path / "pairs.jsonl"))}
    chat = {"source": "sft", "dataset": str(chats(tmp_path / "chats.jsonl"))}
    cases = [
        ({"algo": {"terms": [{"name": "kto"}]}, "batches": pairs | {"source": "pairs"}}, r"\['desirable'\]"),
        ({"algo": {"terms": [{"name": "dpo"}, {"name": "nll"}]}, "batches": pairs | {"source": "pairs"}},
         "imitate both replies"),
        ({"algo": {"terms": [{"name": "teacher_kl", "params": {"model": str(tmp_path)}}]}, "batches": chat},
         "policy's own samples only"),
        ({"algo": {"preset": "sft", "kl_coef": 0.1, "kl_in_reward": True}, "batches": chat}, "algo.kl_in_reward"),
        ({"algo": {"preset": "sft", "advantage": "rloo"}, "batches": chat}, "algo.advantage"),
        ({"algo": {"preset": "sft"}, "batches": chat, "data": {"group_filter": "nonzero_std"}}, "data.group_filter"),
        ({"algo": {"preset": "online_dpo", "group_by": "answer"}}, "algo.group_by"),
        ({"algo": {"preset": "online_dpo", "critic": True, "advantage": "gae"}}, "algo"),
        ({"algo": {"terms": [{"name": "kto"}]}, "batches": {"source": "unpaired", "dataset": "x.jsonl", "size": 1}},
         "batches.size >= 2"),
    ]
    for sections, match in cases:
        with pytest.raises(ConfigError, match=match):
            toy_run_config(tmp_path, 1, **sections)


def test_a_preset_stage_dry_runs_from_the_command_line(tmp_path):
    data = chats(tmp_path / "chats.jsonl")
    out = subprocess.run([sys.executable, "-m", "lmrl.cli", "train", "quickstart", "algo.preset=sft",
                          f"batches.dataset={data}", "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "source: sft" in out.stdout and "name: nll" in out.stdout


def test_the_tasks_own_demonstrations_are_a_cold_start(tmp_path):
    """SFT on the task rows' reference answers, prompts as rollouts see them: held-out accuracy goes to 1."""
    cfg = toy_run_config(tmp_path, 12, algo={"preset": "sft"}, trainer={"lr": 1e-2},
                         task={"demonstration": "{answer}"},
                         batches={"source": "demonstrations", "size": 8, "num_eval": 4},
                         eval={"at_start": True, "at_end": True, "num_prompts": 8, "temperature": 0.2})
    rows, stages = run(cfg)
    x = stages.offline.train[0].samples[0]
    assert x.prompt_ids == stages.offline.train[0].row["prompt_ids"]
    assert stages.tokenizer.decode(x.completion_ids) == "7<|im_end|>"
    evals = [r for r in rows if "eval/accuracy" in r]
    assert evals[0]["eval/accuracy"] < 0.5 and evals[-1]["eval/accuracy"] == 1.0
    losses = [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert losses[-1] < 0.1 * losses[0]


def test_reference_log_probs_of_a_pair_are_computed_once(tmp_path):
    """Three epochs over six pairs: the reference scores each of the twelve rows once, and the cached values are
    those a fresh reference pass gives."""
    cfg = toy_run_config(tmp_path, 9, algo={"preset": "dpo"}, trainer={"lr": 1e-2},
                         batches={"dataset": str(preferences(tmp_path / "pairs.jsonl", n=6)), "size": 2})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    scored, logprobs = [], stages.learner.logprobs

    def counting(batch, reference=False, rows=None, model=None):
        if reference:
            scored.append(batch.num_rows if rows is None else len(rows))
        return logprobs(batch, reference=reference, rows=rows, model=model)
    stages.learner.logprobs = counting
    train(cfg, stages=stages)
    assert sum(scored) == 12
    from lmrl.inputs import provide
    from lmrl.loops.batching import to_batch
    from lmrl.loops.collect import batch_inputs

    inputs = batch_inputs(stages, stages.offline.train[:3], 1)
    batch = to_batch(inputs, stages.engine.pad_token_id)
    provide(batch, inputs, with_learner=True)
    assert torch.allclose(batch.extras["ref_logp"], logprobs(batch, reference=True), atol=1e-6)


def test_online_dpo_pairs_the_policys_own_rollouts(tmp_path):
    """Each kept group becomes [best, worst] by reward; the pair's DPO loss starts at log 2 and falls, and the
    reward the pairs were ranked by rises."""
    cfg = toy_run_config(tmp_path, 12, algo={"preset": "online_dpo"}, trainer={"lr": 1e-2})
    rows, stages = run(cfg)
    steps = [r for r in rows if "pref/loss" in r]
    assert steps[0]["pref/loss"] == pytest.approx(0.693147, abs=1e-4)
    assert all(r["data/pairs"] >= 1 for r in steps)
    assert sum(r["reward/mean"] for r in steps[-3:]) > sum(r["reward/mean"] for r in steps[:3])
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        toy_run_config(tmp_path, 1, algo={"preset": "online_dpo"}, rollout={"group_size": 1})


def test_dpo_with_lora_takes_the_base_as_its_reference(tmp_path):
    """A LoRA stage keeps no copy of the model: the reference is the base with its adapters disabled, so the
    first step's DPO loss is log 2 and only the adapters move."""
    cfg = toy_run_config(tmp_path, 6, algo={"preset": "dpo"}, trainer={"lr": 1e-2},
                         model={"lora": {"r": 4, "alpha": 8}},
                         batches={"dataset": str(preferences(tmp_path / "pairs.jsonl")), "size": 4})
    rows, stages = run(cfg)
    assert stages.learner.reference is None  # the peft model with its adapters disabled
    steps = [r for r in rows if "pref/loss" in r]
    assert steps[0]["pref/loss"] == pytest.approx(0.693147, abs=1e-5) and steps[-1]["pref/loss"] < 0.6
    base = [p for n, p in stages.model.named_parameters() if "lora" not in n]
    assert base and not any(p.requires_grad for p in base)
