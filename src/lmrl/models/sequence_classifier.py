"""A causal LM and a trained score head as one transformers classification model (a reward model).

A reward model trained by lmrl is the policy's trunk plus the learner's score head, `Linear(hidden, 1,
bias=False)` read at each row's last token. transformers' `*ForSequenceClassification` classes hold
the same trunk (under `base_model_prefix`) and a `score` layer of that shape, and pool the rightmost
token that is not `pad_token_id`, so the exported directory scores right-padded rows as the learner
did (`AutoModelForSequenceClassification.from_pretrained` loads it; `num_labels` is 1). A process reward
model's head, `Linear(hidden, 2, bias=False)` read at every token, becomes the `score` layer of the family's
`*ForTokenClassification` (`num_labels` 2, `token_classification_bias` false; classes bad, good).
"""
from __future__ import annotations

import copy

import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification


def pad_token_id_of(tokenizer) -> int | None:
    """The id an exported reward model is right-padded with, where its pooling stops: the tokenizer's pad token
    unless it is the end-of-sequence token (as for SmolLM2), which ends the very rows the model scores; then
    another special token (BOS, UNK), which never ends a row, so the rightmost non-pad token is the row's last."""
    eos = tokenizer.eos_token_id
    candidates = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id]
    return next((i for i in candidates if i is not None and i != eos), eos)


def as_classifier(causal_lm, score_weight: torch.Tensor, pad_token_id: int | None):
    """The classifier of a score head: [1, H] a reward model (`as_sequence_classifier`), [2, H] a process
    reward model's step head (`as_token_classifier`)."""
    if score_weight.shape[0] == 1:
        return as_sequence_classifier(causal_lm, score_weight, pad_token_id)
    return as_token_classifier(causal_lm, score_weight, pad_token_id)


def as_sequence_classifier(causal_lm, score_weight: torch.Tensor, pad_token_id: int | None):
    """A `*ForSequenceClassification` model (num_labels 1) with `causal_lm`'s trunk and `score_weight` [1, H]
    as its `score` head; the LM head is left out. `pad_token_id` goes into its config (where pooling stops)."""
    return _with_head(AutoModelForSequenceClassification, causal_lm, score_weight, pad_token_id)


def as_token_classifier(causal_lm, score_weight: torch.Tensor, pad_token_id: int | None):
    """A `*ForTokenClassification` model (num_labels = the head's rows, no bias) with `causal_lm`'s trunk and
    `score_weight` [C, H] as its `score` layer, read at every token; the LM head is left out."""
    return _with_head(AutoModelForTokenClassification, causal_lm, score_weight, pad_token_id,
                      token_classification_bias=False)


def _with_head(auto_class, causal_lm, score_weight: torch.Tensor, pad_token_id: int | None, **settings):
    config = copy.deepcopy(causal_lm.config)
    config.num_labels = score_weight.shape[0]
    config.pad_token_id = pad_token_id
    config.architectures = None  # save_pretrained writes the classification class's name
    for key, value in settings.items():
        setattr(config, key, value)
    classifier = auto_class.from_config(config, dtype=causal_lm.dtype)
    head = getattr(classifier, "score", None)
    if not isinstance(head, torch.nn.Linear) or tuple(head.weight.shape) != tuple(score_weight.shape):
        raise ValueError(f"{type(classifier).__name__} has no `score` layer of shape {tuple(score_weight.shape)} "
                         "to take the reward model's head")
    trunk = getattr(classifier, classifier.base_model_prefix)
    trunk.load_state_dict(causal_lm.get_decoder().state_dict())
    with torch.no_grad():
        head.weight.copy_(score_weight.to(head.weight.dtype))
    return classifier.eval()
