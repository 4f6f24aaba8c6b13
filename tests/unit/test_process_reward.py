"""The process reward model's parts: the `prm` term's values (stages §3.2), the stepwise rows' encoding (TRL's
tokenize_row: labels on the separators only, last step only, lengths), bad rows refused, the reward's
aggregates and the step split."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tokenizer
from lmrl.algos.losses import LossInputs
from lmrl.algos.process_reward import GOOD, prm, step_correct, step_cross_entropy
from lmrl.data.sft import TaskError, detect_format
from lmrl.data.steps import encode_steps, last_step_only
from lmrl.models.steps import split_steps, step_ids
from lmrl.rewards.process_reward import aggregate_steps, separator_ends

# stages §3.2: logits given as (good, bad); the head's classes are (bad, good), so they are reversed here
LOGITS = torch.tensor([[0.0, 2.0], [1.0, 0.0], [1.0, 1.0]])


def term_value(labels: list[float]) -> tuple[float, dict]:
    """The `prm` term on one row whose three positions are the three step ends."""
    logits = LOGITS.unsqueeze(0)
    mask = torch.ones(1, 3)
    inputs = LossInputs(logp=torch.zeros(1, 3), old_logp=torch.zeros(1, 3), advantages=torch.zeros(1, 3), mask=mask,
                        extras={"token_scores": logits, "step_labels": torch.tensor([labels])})
    loss, metrics = prm(inputs, mask)
    return float((loss * mask).sum() / mask.sum()), metrics


def test_good_is_class_one_as_in_trls_labels():
    assert GOOD == 1


def test_hard_labels_cross_entropy_and_accuracy():
    value, metrics = term_value([1.0, 0.0, 1.0])  # good, bad, good
    assert value == pytest.approx(0.3778, abs=1e-4)
    assert metrics["prm/loss"] == pytest.approx(0.3778, abs=1e-4)
    assert metrics["prm/step_accuracy"] == 1.0  # the tie [1, 1] predicts good


def test_soft_labels_cross_entropy_against_p_and_one_minus_p():
    value, _ = term_value([0.75, 0.0, 1.0])
    assert value == pytest.approx(0.5444, abs=1e-4)


def test_hard_labels_equal_torch_cross_entropy():
    labels = torch.tensor([1, 0, 1])
    want = torch.nn.functional.cross_entropy(LOGITS, labels, reduction="none")
    assert torch.allclose(step_cross_entropy(LOGITS, labels.float()), want, atol=1e-6)
    assert step_correct(torch.tensor([[0.0, 1.0]]), torch.tensor([0.0])).item() == 0.0


ROW = {"prompt": "what is 2+3?", "completions": ["2+3=5.", "answer: 5"], "labels": [True, 0.25]}


def test_encoding_puts_each_label_on_its_separator_as_trl_does():
    tok = make_tokenizer()
    x = encode_steps(ROW, tok, max_tokens=1024)
    newline = tok.convert_tokens_to_ids("\n")
    # TRL's tokenize_row: BOS + prompt, then each step + "\n"; the label on the step's last token
    assert x.prompt_ids == [tok.bos_token_id, *tok("what is 2+3?", add_special_tokens=False)["input_ids"]]
    assert x.completion_ids == tok("2+3=5.\nanswer: 5\n", add_special_tokens=False)["input_ids"]
    ends = [i for i, m in enumerate(x.loss_mask) if m]
    assert ends == [6, 16] and all(x.completion_ids[e] == newline for e in ends)
    assert x.info["step_labels"][6] == 1.0 and x.info["step_labels"][16] == 0.25
    assert sum(x.info["step_labels"]) == 1.25 and x.num_generated == 2
    only = last_step_only(x)
    assert [i for i, m in enumerate(only.loss_mask) if m] == [16]


def test_a_multi_token_separator_labels_its_last_token():
    tok = make_tokenizer()
    encoded = step_ids(tok, "q", ["a", "bb"], separator=" ::")
    assert encoded.ends == [3, 8] and len(encoded.completion_ids) == 9


def test_lengths_cut_the_completion_then_the_row():
    tok = make_tokenizer()
    prompt_len = 1 + len("what is 2+3?")
    assert [i for i, m in enumerate(encode_steps(ROW, tok, 1024, max_completion_tokens=10).loss_mask) if m] == [6]
    assert encode_steps(ROW, tok, prompt_len + 6).reason == "had no trained token within max_tokens"
    cut = encode_steps(ROW, tok, prompt_len + 7)
    assert len(cut.completion_ids) == 7 and cut.finish_reason == "length"


@pytest.mark.parametrize("labels, message", [
    ([True], "2 steps in 'completions' but 1 labels"),
    ([True, 1.5], "a step label is 1.5; expected true / false or a number in [0, 1]"),
    ([True, "yes"], "a step label is 'yes'"),
    ([True, -0.1], "a step label is -0.1"),
])
def test_bad_rows_are_refused_naming_the_row(labels, message):
    with pytest.raises(TaskError, match=message.replace("[", r"\[").replace("]", r"\]")):
        encode_steps({**ROW, "labels": labels}, make_tokenizer(), 1024, where="data.jsonl:3")


def test_stepwise_rows_are_their_own_format(tmp_path):
    assert detect_format([ROW]) == "stepwise"
    assert detect_format([json.loads(json.dumps(ROW))]) == "stepwise"


def test_aggregates_of_step_scores():
    scores = [0.9, 0.5, 0.8]
    assert aggregate_steps(scores, "min") == 0.5
    assert aggregate_steps(scores, "last") == 0.8
    assert aggregate_steps(scores, "mean") == pytest.approx(0.7333, abs=1e-4)
    assert aggregate_steps(scores, "prod") == pytest.approx(0.36)
    assert aggregate_steps([], "min") == 0.0
    with pytest.raises(ValueError, match="aggregate must be one of"):
        aggregate_steps(scores, "max")


def test_reply_split_and_separator_ends():
    assert split_steps("a=1.\n\nb=2.\nAnswer: 2\n") == ["a=1.", "b=2.", "Answer: 2"]
    assert separator_ends([5, 9, 7, 9, 7, 1, 9, 7], [9, 7]) == [2, 4, 7]


def test_a_step_encodes_alike_in_labelled_rows_and_in_a_scored_reply():
    """The step labels keep a blank line with the step it precedes ("\\nb"); a scored reply's split drops it: both
    encode the step bare, so the reward scores the tokens the model was trained on."""
    tok = make_tokenizer(list("ab7 \n?q"), template=None)
    assert split_steps("a\n\nb\n") == ["a", "b"]
    assert step_ids(tok, "q?", ["a", "\nb"]) == step_ids(tok, "q?", split_steps("a\n\nb\n"))
    assert step_ids(tok, "q?", ["a\n", "b\n\n"]) == step_ids(tok, "q?", ["a", "b"])
