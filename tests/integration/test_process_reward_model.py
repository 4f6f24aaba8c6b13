"""A process reward model end to end on the tiny model: the learner's per-token step head equals transformers'
`LlamaForTokenClassification` logits (rows packed or not), a `steps` + `prm` run lowers the loss and is exported
by `lmrl export` and the pipeline's `export_final` as a token classifier whose loss on TRL's encoding of the
rows (labels on the separators, -100 elsewhere: PRMTrainer's loss) equals the term's, and the
`process_reward_model` component scores replies with it."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForTokenClassification, LlamaForTokenClassification

from conftest import make_tokenizer, toy_run_config
from lmrl import cli
from lmrl.algos.process_reward import step_cross_entropy
from lmrl.config import TrainerConfig
from lmrl.data.steps import encode_steps
from lmrl.learners import Learner
from lmrl.loops import build_stages, train
from lmrl.loops.pipeline import export_final
from lmrl.models import tiny_llama
from lmrl.rewards.process_reward import ProcessRewardScore
from lmrl.types import Sample, collate


def stepwise_rows(n: int = 24) -> list[dict]:
    """Sums of two digits in two steps; every other row's steps are wrong, its total replaced by 'no' (an easy
    pattern for a tiny model); half the rows carry soft labels."""
    rows = []
    for i in range(n):
        a, b = i % 7 + 1, i % 3 + 2
        wrong = i % 2
        total = "no" if wrong else a + b
        rows.append({"prompt": f"what is {a}+{b}?", "completions": [f"{a}+{b}={total}.", f"answer: {total}"],
                     "labels": [not wrong, not wrong] if i % 4 < 2 else [0.0 if wrong else 1.0, 0.25 if wrong else 0.75]})
    return rows


def model():
    return tiny_llama(len(make_tokenizer()), hidden=32, layers=2, heads=4, seed=0)


def transformers_token_classifier(learner: Learner) -> LlamaForTokenClassification:
    config = copy.deepcopy(learner.model.config)
    config.num_labels, config.token_classification_bias = 2, False
    hf = LlamaForTokenClassification(config)
    hf.model.load_state_dict(learner.model.model.state_dict())
    with torch.no_grad():
        hf.score.weight.copy_(learner.score_head.weight)
    return hf.eval()


def encoded_batch(rows: list[dict]):
    tok = make_tokenizer()
    samples = [encode_steps(r, tok, 1024) for r in rows]
    return samples, collate(samples, list(range(len(samples))), pad_id=0)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_token_scores_equal_transformers_token_classification_logits(share_prompt):
    learner = Learner(model(), TrainerConfig(share_prompt=share_prompt, bf16=False), score_head=2)
    assert tuple(learner.score_head.weight.shape) == (2, 32)
    samples, batch = encoded_batch(stepwise_rows(4))
    scores = learner.model_outputs(batch, {"token_scores"})["token_scores"]
    with torch.no_grad():
        want = transformers_token_classifier(learner)(input_ids=batch.input_ids,
                                                      attention_mask=batch.attention_mask).logits
    mask = batch.completion_mask.bool()  # position t holds token t+1's logits
    assert scores.shape == (4, batch.input_ids.shape[1] - 1, 2)
    assert torch.allclose(scores[mask], want[:, 1:][mask], atol=1e-5)
    assert int(mask.sum()) == 8  # two step ends per row, the last one the row's final token


def test_a_prm_stage_lowers_its_loss_exports_a_token_classifier_equal_to_trls_loss(tmp_path):
    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in stepwise_rows()))
    cfg = toy_run_config(tmp_path, 16, batches={"source": "steps", "dataset": str(data), "size": 8, "num_eval": 4},
                         algo={"preset": "prm"}, trainer={"lr": 3e-3, "seed": 1})
    tok = make_tokenizer()
    stages = build_stages(cfg, model=model(), tokenizer=tok)
    result = train(cfg, stages=stages)
    steps = [r for r in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines())
             if "prm/loss" in r]
    assert len(steps) == 16 and stages.learner.score_head.weight.shape[0] == 2
    assert steps[0]["prm/loss"] == pytest.approx(0.693, abs=0.1)  # a fresh head: P(good) near 1/2
    first, last = (sum(r["prm/loss"] for r in part) / 4 for part in (steps[:4], steps[-4:]))
    assert last < first - 0.1
    assert steps[-1]["prm/step_accuracy"] > 0.8

    out = tmp_path / "prm_export"
    assert cli.main(["export", str(result.run_dir), "--merge", str(out)]) == 0
    hf = AutoModelForTokenClassification.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForTokenClassification" and hf.config.num_labels == 2
    assert hf.score.bias is None

    # PRMTrainer's loss: the model's own CE over the labelled tokens (hard labels) of TRL's encoding
    hard = [r for r in stepwise_rows() if all(isinstance(v, bool) for v in r["labels"])][:6]
    samples, batch = encoded_batch(hard)
    labels = torch.full(batch.input_ids.shape, -100)
    for i, x in enumerate(samples):
        for k, (m, v) in enumerate(zip(x.loss_mask, x.info["step_labels"])):
            if m:
                labels[i, len(x.prompt_ids) + k] = int(v)
    with torch.no_grad():
        trl_loss = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    stages.learner.model.eval()
    scores = stages.learner.model_outputs(batch, {"token_scores"})["token_scores"]
    step_labels = torch.zeros_like(batch.completion_mask)
    for i, x in enumerate(samples):
        step_labels[i, len(x.prompt_ids) - 1: len(x.prompt_ids) - 1 + len(x.completion_ids)] = torch.tensor(
            x.info["step_labels"])
    mask = batch.completion_mask
    ours = (step_cross_entropy(scores, step_labels) * mask).sum() / mask.sum()
    assert float(ours) == pytest.approx(float(trl_loss), abs=1e-5)

    final = export_final(cfg, result.run_dir)  # the pipeline's path: the same token classifier
    assert json.loads((final / "config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]

    reward = ProcessRewardScore(str(out), batch_size=2)
    replies = [("what is 3+2?", "3+2=5.\nanswer: 5"), ("what is 3+2?", "3+2=6.\nanswer: 6\n"),
               ("what is 1+2?", "1+2=3."), ("what is 1+2?", "")]
    got = [Sample([1], [], [], text=text, row={"question": q}) for q, text in replies]
    rewards = reward.score_batch(got)
    assert [len(x.info["prm"]) for x in got] == [2, 2, 1, 0]
    assert all(0.0 <= p <= 1.0 for x in got for p in x.info["prm"])
    assert rewards[:3] == pytest.approx([min(x.info["prm"]) for x in got[:3]]) and rewards[3] == 0.0
    # the reward encodes a reply as the training rows were: its step scores are the head's P(good) there
    row = {"prompt": "what is 3+2?", "completions": ["3+2=5.", "answer: 5"], "labels": [True, True]}
    x = encode_steps(row, tok, 1024)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([x.input_ids])).logits[0]
    ends = [len(x.prompt_ids) + k for k, m in enumerate(x.loss_mask) if m]
    assert got[0].info["prm"] == pytest.approx(torch.softmax(logits[ends], -1)[:, 1].tolist(), abs=1e-6)
    own = Sample(x.prompt_ids, x.completion_ids, [0.0] * len(x.completion_ids), text="", row={})
    last = ProcessRewardScore(str(out), aggregate="last", tokens="sample")
    assert last.score_batch([own]) == pytest.approx([got[0].info["prm"][-1]], abs=1e-6)
    assert own.info["prm"] == pytest.approx(got[0].info["prm"], abs=1e-6)


def test_the_prm_term_needs_a_stepwise_source(tmp_path):
    from lmrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'prm' term reads the row labels \['step_labels'\].*batches.source=steps"):
        toy_run_config(tmp_path, 2, batches={"source": "sft", "dataset": str(tmp_path / "x.jsonl")},
                       algo={"terms": [{"name": "prm"}]})


def test_the_steps_source_holds_rows_out_trains_the_last_step_only_and_names_a_bad_row(tmp_path):
    from lmrl.data.sources import BATCH_SOURCES
    from lmrl.envs.tasks import TaskError

    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in stepwise_rows(6)))
    batches = {"source": "steps", "dataset": str(data), "size": 2, "num_eval": 2,
               "params": {"last_step_only": True}}
    cfg = toy_run_config(tmp_path, 2, batches=batches, algo={"preset": "prm"})
    out = BATCH_SOURCES.get("steps")(cfg, make_tokenizer(), [], [])
    assert (len(out.train), len(out.eval)) == (4, 2)
    assert all(x.num_generated == 1 and x.loss_mask[-1] == 1 for g in out.train for x in g.samples)
    assert all(x.num_generated == 2 for g in out.eval for x in g.samples)  # held-out rows keep every label
    rows = stepwise_rows(3)
    rows[1]["labels"] = [True]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskError, match=r"steps.jsonl:2: 2 steps in 'completions' but 1 labels"):
        BATCH_SOURCES.get("steps")(cfg, make_tokenizer(), [], [])
