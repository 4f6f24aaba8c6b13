"""A causal LM and a trained scalar head as one transformers sequence-classification model (a reward model).

A reward model trained by lmrl is the policy's trunk plus the learner's score head, `Linear(hidden, 1,
bias=False)` read at each row's last token. transformers' `*ForSequenceClassification` classes hold
the same trunk (under `base_model_prefix`) and a `score` layer of that shape, and pool the rightmost
token that is not `pad_token_id`, so the exported directory scores right-padded rows as the learner
did (`AutoModelForSequenceClassification.from_pretrained` loads it; `num_labels` is 1).
"""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForSequenceClassification


def pad_token_id_of(tokenizer) -> int | None:
    """The id an exported reward model is right-padded with, where its pooling stops: the tokenizer's pad token
    unless it is the end-of-sequence token (as for SmolLM2), which ends the very rows the model scores; then
    another special token (BOS, UNK), which never ends a row, so the rightmost non-pad token is the row's last."""
    eos = tokenizer.eos_token_id
    candidates = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id]
    return next((i for i in candidates if i is not None and i != eos), eos)


def as_sequence_classifier(causal_lm, score_weight: torch.Tensor, pad_token_id: int | None):
    """A `*ForSequenceClassification` model (num_labels 1) with `causal_lm`'s trunk and `score_weight` [1, H]
    as its `score` head; the LM head is left out. `pad_token_id` goes into its config (where pooling stops)."""
    config = copy.deepcopy(causal_lm.config)
    config.num_labels = 1
    config.pad_token_id = pad_token_id
    config.architectures = None  # save_pretrained writes the sequence-classification class's name
    classifier = AutoModelForSequenceClassification.from_config(config, dtype=causal_lm.dtype)
    head = getattr(classifier, "score", None)
    if not isinstance(head, torch.nn.Linear) or tuple(head.weight.shape) != tuple(score_weight.shape):
        raise ValueError(f"{type(classifier).__name__} has no `score` layer of shape {tuple(score_weight.shape)} "
                         "to take the reward model's head")
    trunk = getattr(classifier, classifier.base_model_prefix)
    trunk.load_state_dict(causal_lm.get_decoder().state_dict())
    with torch.no_grad():
        head.weight.copy_(score_weight.to(head.weight.dtype))
    return classifier.eval()
