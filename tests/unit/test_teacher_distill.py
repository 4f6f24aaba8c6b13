"""Distillation from a privileged-context teacher (HindSearch's hindsight critiques): who gets a critique,
which tokens are distilled, the teacher's log-probs, and the objective's term."""
import math

import pytest
import torch

from lmrl.algos import AggScale, Algorithm, LossInputs
from lmrl.algos.teacher import distill_mask
from lmrl.config import AlgoConfig, ConfigError, TrainerConfig
from lmrl.envs.chat import encode_opening, observation_ids
from lmrl.learners.policy import Learner
from lmrl.inputs.teacher import teacher_inputs
from lmrl.inputs import requested_inputs
from lmrl.loading import build_config
from lmrl.models import tiny_llama
from lmrl.rewards.hindsight_critique import HindsightCritique
from lmrl.rewards.judge_client import JudgeError
from lmrl.types import Sample, collate

from conftest import make_tokenizer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "21*3"}}</tool_call>'


class CountingJudge:
    """Records each critique request and answers with a fixed critique."""

    def __init__(self):
        self.prompts = []

    def chat(self, messages, **_):
        self.prompts.append(messages[-1]["content"])
        return "you should have multiplied first"


def episode(tok, question, replies, answer_reward):
    """A hand-made tool-use episode: replies (policy, loss mask 1) with a tool result after each but the last.
    Returns the sample and where each reply's tokens lie in the completion: (start, length, reply)."""
    opening = [{"role": "system", "content": "use tools"}, {"role": "user", "content": question}]
    ids, mask, messages, turns = [], [], [dict(m) for m in opening], []
    for k, reply in enumerate(replies):
        turn = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        turns.append((len(ids), len(turn), reply))
        ids, mask = ids + turn, mask + [1] * len(turn)
        messages.append({"role": "assistant", "content": reply})
        if k < len(replies) - 1:
            obs = [{"role": "tool", "content": "63"}]
            env = observation_ids(tok, obs, turn[-1])
            ids, mask = ids + env, mask + [0] * len(env)
            messages += obs
    sample = Sample(encode_opening(tok, opening), ids, [-1.0 if m else 0.0 for m in mask], loss_mask=mask,
                    rewards={"answer": answer_reward, "env": 0.0}, reward=answer_reward,
                    text=replies[-1],
                    info={"messages": messages, "turns": len(replies), "turn_lengths": [t[1] for t in turns]})
    return sample, turns


def setup():
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    cfg = build_config({"task": {"system_prompt": None}, "algo": {"terms": [{"name": "distill", "coef": 0.1}]}})
    return tok, model, cfg, Learner(model, TrainerConfig(bf16=False))


def test_three_failed_of_eight_get_three_critiques_and_only_their_tool_call_turns_are_distilled():
    tok, _, cfg, learner = setup()
    plans = [([CALL, "answer: 63"], 0.0), (["answer: 60"], 0.0), ([CALL, CALL, "answer: 62"], 0.0)]
    plans += [([CALL, "answer: 63"], 1.0)] * 3 + [(["answer: 63"], 1.0)] * 2
    built = [episode(tok, "what is 21 times 3?", replies, r) for replies, r in plans]
    samples = [s for s, _ in built]
    rows = [{"question": "what is 21 times 3?", "answer": "63"}] * 8
    batch = collate(samples, [0] * 8, pad_id=0)
    judge = CountingJudge()
    teacher_inputs(batch, samples, rows, learner, tok, cfg, HindsightCritique(judge=judge), "tool_calls")
    assert len(judge.prompts) == 3  # one critique per failed sample, none for the 5 successes
    assert all("Correct answer: 63" in p and "[assistant] <tool_call>" in p and "[tool] 63" in p
               for p in (judge.prompts[0], judge.prompts[2]))
    assert batch.row_extras["has_teacher"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    mask = batch.extras["teacher_mask"]
    for r, (s, turns) in enumerate(built):
        expected = torch.zeros_like(mask[r])
        for start, length, reply in turns:
            if r < 3 and reply == CALL:
                at = len(s.prompt_ids) - 1 + start
                expected[at:at + length] = 1
        assert torch.equal(mask[r], expected), r
    assert mask[1].sum() == 0 and 0 < mask[0].sum() < mask[2].sum()  # no tool call; one; two
    assert (mask[batch.completion_mask == 0] == 0).all()  # environment tokens (and padding) never
    assert (batch.extras["teacher_logp"][3:] == 0).all()


def test_teacher_logprobs_equal_a_direct_forward_of_the_teacher_prompt_and_completion():
    tok, model, cfg, learner = setup()
    multi, _ = episode(tok, "what is 21 times 3?", [CALL, "answer: 60"], 0.0)
    single = Sample(encode_opening(tok, [{"role": "user", "content": "say 7"}]),
                    tok("8", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], [-1.0, -1.0],
                    rewards={"answer": 0.0}, reward=0.0, text="8")
    samples = [multi, single]
    rows = [{"question": "what is 21 times 3?", "answer": "63"}, {"question": "say 7", "answer": "7"}]
    batch = collate(samples, [0, 1], pad_id=0)
    teacher_inputs(batch, samples, rows, learner, tok, cfg, HindsightCritique(judge=CountingJudge()), "all")
    hint = "\n\nHindsight: you should have multiplied first"
    openings = [[{"role": "system", "content": "use tools"}, {"role": "user", "content": "what is 21 times 3?" + hint}],
                [{"role": "user", "content": "say 7" + hint}]]
    for r, (s, opening) in enumerate(zip(samples, openings)):
        prompt = list(tok.apply_chat_template(opening, add_generation_prompt=True, tokenize=True, return_dict=True)
                      ["input_ids"])
        ids = torch.tensor([prompt + s.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        policy = torch.tensor(s.loss_mask or [1] * len(s.completion_ids), dtype=torch.bool)
        start = len(s.prompt_ids) - 1
        got = batch.extras["teacher_logp"][r, start:start + len(s.completion_ids)][policy]
        assert torch.allclose(got, logp[len(prompt) - 1:][policy], atol=1e-5)
        assert not torch.allclose(got, learner.logprobs(batch)[r, start:start + len(s.completion_ids)][policy])
        assert torch.equal(batch.extras["teacher_mask"][r], batch.completion_mask[r])  # tokens: all


def toy_inputs(teacher_mask):
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    x = LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.zeros(1, 2), mask=torch.ones(1, 2),
                   extras={"teacher_logp": torch.tensor([[-1.5, -1.0]]), "teacher_mask": torch.tensor([teacher_mask])})
    return logp, x


def distilling(estimator="k1", coef=0.1):
    entry = {"name": "distill", "coef": coef, "params": {"estimator": estimator,
                                                          "context_params": {"judge": CountingJudge()}}}
    return Algorithm(AlgoConfig(terms=[entry]), max_new_tokens=2)


def test_k1_distillation_gradient_moves_student_toward_teacher_on_masked_tokens_only():
    # token 0: log π = -1.0 above the teacher's -1.5; token 1: -2.0 below -1.0. Token mean over 2 tokens:
    # loss = 0.1 · (0.5 + (-1.0)) / 2 = -0.025; ∂/∂log π = 0.1 · (log π - log π_T) / 2 = [0.025, -0.05]
    logp, x = toy_inputs([1.0, 1.0])
    loss, m = distilling().objective(x, AggScale.of(x.mask))
    loss.backward()
    assert loss.item() == pytest.approx(-0.025) and m["distill/kl"] == pytest.approx(-0.25)
    assert logp.grad[0].tolist() == pytest.approx([0.025, -0.05])  # descent: token 0 down, token 1 up
    logp, x = toy_inputs([1.0, 0.0])
    loss, m = distilling().objective(x, AggScale.of(x.mask))
    loss.backward()
    assert loss.item() == pytest.approx(0.025) and m["distill/kl"] == pytest.approx(0.5)
    assert logp.grad[0].tolist() == pytest.approx([0.025, 0.0])


def test_k3_distillation_pulls_toward_teacher_too():
    logp, x = toy_inputs([1.0, 1.0])
    distilling("k3").objective(x, AggScale.of(x.mask))[0].backward()
    # ∂k3/∂log π = 1 - π_T/π: [1 - e^-0.5, 1 - e^1] · 0.1 / 2
    assert logp.grad[0].tolist() == pytest.approx([0.05 * (1 - math.exp(-0.5)), 0.05 * (1 - math.e)])


def test_coef_zero_leaves_the_objective_and_the_inputs_unchanged():
    _, x = toy_inputs([1.0, 1.0])
    x.advantages = torch.tensor([[1.0, -0.5]])
    plain = Algorithm(AlgoConfig(), max_new_tokens=2)
    off = Algorithm(AlgoConfig(terms=[{"name": "distill", "coef": 0.0, "params": {"estimator": "k3",
                                                                                  "tokens": "tool_calls"}}]),
                    max_new_tokens=2)
    (a, ma), (b, mb) = plain.objective(x, AggScale.of(x.mask)), off.objective(x, AggScale.of(x.mask))
    assert a.item() == b.item() and ma == mb and "distill/kl" not in mb
    assert off.built == {} and requested_inputs(off) == requested_inputs(plain)
    assert {"teacher_logp", "teacher_mask"} <= requested_inputs(distilling())


def test_distilled_rows_are_never_skipped_as_inert():
    samples = [Sample([1, 2], [5, 6], [-0.5, -0.5], reward=0.0) for _ in range(2)]
    b = collate(samples, [0, 0], pad_id=0)
    b.advantages = torch.zeros_like(b.completion_mask)
    b.extras["teacher_mask"] = b.completion_mask * torch.tensor([[1.0], [0.0]])
    assert Algorithm(AlgoConfig(), 2).inert_rows(b).tolist() == [True, True]
    assert distilling().inert_rows(b).tolist() == [False, True]


def test_single_turn_tool_calls_selects_the_whole_completion_only_with_a_call():
    with_call = Sample([1], [5, 6, 7], [0.0] * 3, text="x " + CALL)
    without = Sample([1], [5, 6], [0.0] * 2, text="answer: 7")
    assert distill_mask(with_call, "tool_calls") == [1, 1, 1] and distill_mask(without, "tool_calls") == [0, 0]


def test_unknown_teacher_settings_are_refused_with_the_nearest_name():
    with pytest.raises(ConfigError, match=r"algo.terms\[0\] \(distill\): context: unknown teacher context "
                                          r"'hindsight'.*hindsight_critique"):
        build_config({"algo": {"terms": [{"name": "distill", "coef": 0.1, "params": {"context": "hindsight"}}]}})
    with pytest.raises(ConfigError, match=r"\(distill\): estimator must be one of \['k1', 'k3'\]"):
        build_config({"algo": {"terms": [{"name": "distill", "params": {"estimator": "k2"}}]}})
    with pytest.raises(ConfigError, match=r"\(distill\): tokens must be one of"):
        build_config({"algo": {"terms": [{"name": "distill", "params": {"tokens": "calls"}}]}})
    with pytest.raises(ConfigError, match=r"\(distill\): context_params: unknown param 'judg'"):
        build_config({"algo": {"terms": [{"name": "distill", "params": {"context_params": {"judg": {}}}}]}})


def test_a_failed_judge_call_leaves_its_sample_without_a_teacher():
    class Flaky(CountingJudge):
        def chat(self, messages, **kw):
            if len(self.prompts) == 0:
                self.prompts.append("failed")
                raise JudgeError("endpoint down")
            return super().chat(messages, **kw)

    samples = [Sample([1], [5], [0.0], rewards={"answer": 0.0}, text="x") for _ in range(2)]
    context = HindsightCritique(judge=Flaky(), concurrency=1)
    assert context(samples, [{"question": "q", "answer": "7"}] * 2, [False, False]) == [
        None, "Hindsight: you should have multiplied first"]
