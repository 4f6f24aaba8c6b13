"""The reward model's score head: the learner's score of each row's last token equals transformers'
`LlamaForSequenceClassification` logits (plain rows and shared-prompt packing, right-padded rows of
different lengths), its gradient reaches the trunk and the head, a term reading "score" gets the head
built, trained and checkpointed, `lmrl export` writes a sequence-classification directory (LoRA merged)
that scores as the learner does, and the `reward_model` component scores those exports batched."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaForSequenceClassification

from conftest import make_tokenizer, save_tiny_model, toy_run_config
from lmrl import cli
from lmrl.algos import Algorithm
from lmrl.algos.terms import TERMS
from lmrl.config import AlgoConfig, TermConfig, TrainerConfig
from lmrl.learners import Learner, load_checkpoint, save_checkpoint
from lmrl.learners.checkpoint import saved_module
from lmrl.loading import build_config
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.models.checkpoint_dirs import list_checkpoints
from lmrl.models.lora import export_merged
from lmrl.rewards import RewardScorer
from lmrl.rewards.shaped import RewardModelScore
from lmrl.types import Group, Sample, collate


@TERMS.register("score_to_one", "test term: each row's (score - 1)^2", inputs={"score"}, denominator="sequences")
def score_to_one(inputs, mask):
    per_row = (inputs.extras["score"] - 1.0) ** 2
    return per_row, {"score_to_one": float(per_row.detach().mean())}


def pair_batch():
    """Three prompts, each with a chosen and a rejected reply of different lengths, right-padded with 0
    (real tokens are 4..15): rows 0-1, 2-3 and 4-5 share a prompt."""
    g = torch.Generator().manual_seed(3)
    samples, index = [], []
    for grp, (a, b) in enumerate(((2, 5), (4, 1), (3, 3))):
        prompt = torch.randint(4, 16, (2 + grp,), generator=g).tolist()
        for length in (a, b):
            comp = torch.randint(4, 16, (length,), generator=g).tolist()
            samples.append(Sample(prompt, comp, [-1.0] * length, reward=float(length % 2)))
            index.append(grp)
    return collate(samples, index, pad_id=0)


def model():
    return tiny_llama(vocab_size=16, hidden=32, layers=2, heads=4, seed=0)


def transformers_classifier(learner: Learner, pad_token_id: int) -> LlamaForSequenceClassification:
    """transformers' sequence classifier with the learner's trunk and score head, built independently."""
    config = copy.deepcopy(learner.model.config)
    config.num_labels, config.pad_token_id = 1, pad_token_id
    hf = LlamaForSequenceClassification(config)
    hf.model.load_state_dict(learner.model.model.state_dict())
    with torch.no_grad():
        hf.score.weight.copy_(learner.score_head.weight)
    return hf.eval()


@pytest.mark.parametrize("share_prompt, budget", [(False, 10_000), (True, 10_000), (True, 12)])
def test_scores_equal_transformers_sequence_classification_logits(share_prompt, budget):
    learner = Learner(model(), TrainerConfig(share_prompt=share_prompt, micro_batch_tokens=budget, bf16=False),
                      score_head=True)
    batch = pair_batch()
    lengths = batch.attention_mask.sum(1).tolist()
    assert lengths == [4, 7, 7, 4, 7, 7] and batch.input_ids.shape[1] == 7  # right-padded, different lengths
    scores = learner.model_outputs(batch, {"score"})["score"]
    with torch.no_grad():
        want = transformers_classifier(learner, 0)(input_ids=batch.input_ids,
                                                    attention_mask=batch.attention_mask).logits[:, 0]
    assert scores.shape == (6,)
    assert torch.allclose(scores, want, atol=1e-5)
    assert len({round(float(x), 4) for x in scores}) == 6  # every row scored at its own last token


def test_the_head_is_initialised_as_transformers_does_from_the_seed():
    heads = [Learner(model(), TrainerConfig(bf16=False, seed=s), score_head=True).score_head for s in (1, 1, 2)]
    assert heads[0].bias is None and heads[0].weight.shape == (1, 32)
    assert torch.equal(heads[0].weight, heads[1].weight) and not torch.equal(heads[0].weight, heads[2].weight)
    std = model().config.initializer_range
    assert std == 0.02 and 0.5 * std < float(heads[0].weight.detach().std()) < 1.5 * std
    plain = Learner(model(), TrainerConfig(bf16=False))
    assert plain.score_head is None and "score_head" not in plain.modules()
    with pytest.raises(ValueError, match="no score head"):
        plain.model_outputs(pair_batch(), {"score"})


@pytest.mark.parametrize("share_prompt", [False, True])
def test_the_gradient_reaches_the_trunk_and_the_head_as_in_transformers(share_prompt):
    learner = Learner(model(), TrainerConfig(share_prompt=share_prompt, bf16=False), score_head=True)
    hf = transformers_classifier(learner, 0)
    batch = pair_batch()
    weights = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    score = learner.forward_logprobs(learner.model, batch, with_entropy=False, outputs={"score"})["score"]
    (score * weights).sum().backward()
    (hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0] * weights).sum().backward()
    q_proj = learner.model.model.layers[0].self_attn.q_proj.weight
    assert learner.score_head.weight.grad.abs().sum() > 0 and q_proj.grad.abs().sum() > 0
    assert torch.allclose(learner.score_head.weight.grad, hf.score.weight.grad, atol=1e-5)
    assert torch.allclose(q_proj.grad, hf.model.layers[0].self_attn.q_proj.weight.grad, atol=1e-5)


def test_a_term_reading_the_score_makes_the_learner_train_a_head_at_the_policy_lr(tmp_path):
    algo = Algorithm(AlgoConfig(terms=[TermConfig(name="score_to_one", coef=1.0)]), max_new_tokens=6)
    assert algo.needs == {"score"} and algo.score_labels == 1
    assert not Algorithm(AlgoConfig(), max_new_tokens=6).score_labels
    learner = Learner(model(), TrainerConfig(bf16=False, lr=1e-2, max_grad_norm=None), score_head=algo.score_labels)
    assert learner.optimizer.param_groups[-1]["lr"] == 1e-2
    batch = pair_batch()
    algo.prepare(batch)
    before = learner.score_head.weight.detach().clone()
    first = learner.model_outputs(batch, {"score"})["score"]
    learner.update(batch, algo)
    after = learner.model_outputs(batch, {"score"})["score"]
    assert not torch.equal(before, learner.score_head.weight)
    assert float(((after - 1) ** 2).mean()) < float(((first - 1) ** 2).mean())
    path = save_checkpoint(tmp_path, 1, learner.model, make_tokenizer(), learner.optimizer, learner.scheduler,
                           {"step": 1}, modules=learner.modules())
    other = Learner(model(), TrainerConfig(bf16=False, seed=5), score_head=True)
    load_checkpoint(path, other.model, other.optimizer, other.scheduler, modules=other.modules())
    assert torch.equal(other.score_head.weight, learner.score_head.weight)
    assert torch.equal(other.model_outputs(batch, {"score"})["score"], after)


def scored_batch(rm: RewardModelScore, pairs: list[tuple[str, str]]):
    """The (question, reply) pairs as the reward model encodes them, as one right-padded Batch."""
    samples = []
    for question, reply in pairs:
        ids = rm.encode(question, reply)
        samples.append(Sample(ids[:3], ids[3:], [-1.0] * (len(ids) - 3), reward=0.0))
    return collate(samples, list(range(len(samples))), pad_id=rm.pad_id)


def text_sample(question: str, reply: str) -> Sample:
    return Sample([], [], [], text=reply, row={"question": question})


PAIRS = [("say 7", "answer: 7"), ("say 7", "no"), ("what is 2+2?", "it is 4, i think"), ("q", "")]


@pytest.mark.parametrize("lora", [False, True])
def test_a_trained_rm_exports_to_a_sequence_classifier_that_scores_as_the_learner(tmp_path, lora):
    base = save_tiny_model(tmp_path / "base")
    cfg = toy_run_config(tmp_path, 2, model={"path": str(base), **({"lora": {"r": 4, "alpha": 8}} if lora else {})},
                         algo={"terms": [{"name": "score_to_one", "coef": 1.0}]}, run={"checkpoint_every": 1})
    stages = build_stages(cfg, tokenizer=make_tokenizer())
    initial = stages.learner.score_head.weight.detach().clone()
    result = train(cfg, stages=stages)
    assert not torch.equal(initial, stages.learner.score_head.weight)
    checkpoint = list_checkpoints(result.run_dir / "checkpoints")[-1]
    assert torch.equal(saved_module(checkpoint, "score_head")["weight"], stages.learner.score_head.weight.cpu())
    out = tmp_path / "rm"
    assert cli.main(["export", str(result.run_dir), "--merge", str(out)]) == 0
    exported = AutoModelForSequenceClassification.from_pretrained(out)
    assert exported.config.architectures == ["LlamaForSequenceClassification"]
    assert exported.config.num_labels == 1 and exported.config.pad_token_id == make_tokenizer().pad_token_id
    assert not hasattr(exported, "peft_config") and AutoTokenizer.from_pretrained(out).pad_token == "<pad>"
    rm = RewardModelScore(path=str(out))
    batch = scored_batch(rm, PAIRS)
    want = stages.learner.model_outputs(batch, {"score"})["score"]
    got = rm.score_batch([text_sample(q, r) for q, r in PAIRS])
    assert got == pytest.approx(want.tolist(), abs=1e-5)
    with torch.no_grad():
        padded = exported(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0]
    assert padded.tolist() == pytest.approx(want.tolist(), abs=1e-5)
    untrained = export_merged(base, str(base), None, tmp_path / "base_rm", score_weight=stages.learner.score_head.weight)
    moved = torch.tensor(RewardModelScore(path=str(untrained)).score_batch([text_sample(q, r) for q, r in PAIRS]))
    assert (moved - want).abs().max() > 1e-3  # the trunk trained (for LoRA: its merged adapters count)


def test_a_tokenizer_without_a_pad_token_exports_and_scores_batched(tmp_path):
    source = tmp_path / "policy"
    tok = make_tokenizer()
    tok.pad_token = None
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(source)
    tok.save_pretrained(source)
    learner = Learner(tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), TrainerConfig(bf16=False),
                      score_head=True)
    out = export_merged(source, str(source), None, tmp_path / "rm", score_weight=learner.score_head.weight)
    # padded with another special token than EOS, which ends the rows scored: pooling stops at the row's last token
    assert AutoModelForSequenceClassification.from_pretrained(out).config.pad_token_id == tok.bos_token_id
    rm = RewardModelScore(path=str(out), batch_size=3)
    assert rm.pad_id == tok.bos_token_id != tok.eos_token_id and rm.batch_size == 3
    want = learner.model_outputs(scored_batch(rm, PAIRS), {"score"})["score"]
    assert rm.score_batch([text_sample(q, r) for q, r in PAIRS]) == pytest.approx(want.tolist(), abs=1e-5)
    assert rm(text_sample(*PAIRS[2])) == pytest.approx(float(want[2]), abs=1e-5)  # one sample, one call


def test_the_scorer_scores_a_groups_samples_in_one_batched_call(tmp_path):
    source = save_tiny_model(tmp_path / "policy")
    learner = Learner(tiny_llama(len(make_tokenizer()), hidden=32, layers=2, heads=4, seed=0),
                      TrainerConfig(bf16=False), score_head=True)
    out = export_merged(source, str(source), None, tmp_path / "rm", score_weight=learner.score_head.weight)
    cfg = build_config({"reward": {"components": [{"name": "reward_model", "params": {"path": str(out)}}],
                                   "accuracy_component": "reward_model"}})
    scorer = RewardScorer(cfg.reward)
    rm = scorer.components[0].instance
    calls = []
    forward = rm._forward
    rm._forward = lambda rows: calls.append(len(rows)) or forward(rows)
    groups = [Group("a", {}, [text_sample(q, r) for q, r in PAIRS[:3]]), Group("b", {}, [text_sample(*PAIRS[3])])]
    scorer.score(groups)
    assert calls == [3, 1]  # one forward per group (and its accuracy scored once)
    want = learner.model_outputs(scored_batch(rm, PAIRS), {"score"})["score"].tolist()
    assert [s.rewards["reward_model"] for g in groups for s in g.samples] == pytest.approx(want, abs=1e-5)
