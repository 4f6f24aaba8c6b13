"""`process_reward_model`: a trained process reward model's step scores as a reward (docs/rewards/process_reward_model.md).

The model is a token-classification directory (an lmrl `prm` stage's export, or any
`AutoModelForTokenClassification` with classes (bad, good)). The reply is split into steps on the separator
the model was trained with (`models.steps.split_steps`) and encoded as its training rows were
(`models.steps.step_ids`: the question as the prompt, each step followed by the separator), so each step is
scored on the tokens it was trained on: P(good) at the step's last token. `tokens="sample"` scores the
sample's own ids instead (prompt and completion as the policy has them): a step ends at each occurrence of
the separator's ids in the completion, and at the completion's end (the separator's ids appended when it
does not end with them). The per-step scores go to `sample.info["prm"]`; the reward is their aggregate:
`min` (default; a trace is as good as its worst step), `last`, `mean` or `prod`. A reply without a step
scores 0.0 with no step scores.
"""
from __future__ import annotations

import math
import sys
import threading

from lmrl.algos.process_reward import good_probability
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

AGGREGATES = {"min": min, "last": lambda xs: xs[-1], "mean": lambda xs: sum(xs) / len(xs), "prod": math.prod}


def aggregate_steps(scores: list[float], how: str = "min") -> float:
    """The reward of a trace from its steps' P(good): `min`, `last`, `mean` or `prod`; 0.0 without steps."""
    if how not in AGGREGATES:
        raise ValueError(f"process_reward_model aggregate must be one of {sorted(AGGREGATES)}, got {how!r}")
    return float(AGGREGATES[how](scores)) if scores else 0.0


def separator_ends(completion: list[int], separator: list[int]) -> list[int]:
    """The index of the last token of each occurrence of `separator` in `completion`, left to right."""
    n, ends, i = len(separator), [], 0
    while i + n <= len(completion):
        if completion[i: i + n] == separator:
            ends.append(i + n - 1)
            i += n
        else:
            i += 1
    return ends


@REWARD_FNS.register("process_reward_model", "a process reward model's P(good) at each step of the reply, "
                     "aggregated (min, last, mean, prod); the step scores in info['prm']")
class ProcessRewardScore:
    """`AutoModelForTokenClassification` loaded once from `path`, scoring `batch_size` samples per forward on
    right-padded rows with their attention mask, behind a lock (one model shared by the reward threads)."""

    def __init__(self, path: str, separator: str = "\n", aggregate: str = "min", tokens: str = "text",
                 prompt_field: str = "question", max_length: int = 2048, device: str = "cpu", batch_size: int = 16):
        import torch
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        aggregate_steps([], aggregate)
        if tokens not in ("text", "sample"):
            raise ValueError(f"process_reward_model tokens must be 'text' or 'sample', got {tokens!r}")
        if batch_size < 1:
            raise ValueError(f"process_reward_model batch_size must be at least 1, got {batch_size}")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32).to(device).eval()
        if self.model.config.num_labels != 2:
            raise ValueError(f"process_reward_model {path} has {self.model.config.num_labels} labels; a process "
                             "reward model has 2 (bad, good)")
        from lmrl.models.steps import separator_ids  # lmrl.models loads transformers; the registry must not

        self.separator, self.sep_ids = separator, separator_ids(self.tokenizer, separator)
        self.aggregate, self.tokens, self.prompt_field = aggregate, tokens, prompt_field
        self.max_length, self.device, self.batch_size = max_length, device, batch_size
        self.lock = threading.Lock()
        self.warned_cut = False  # the first reply whose steps were cut is shown

    def encode(self, sample: Sample) -> tuple[list[int], list[int]]:
        """(token ids, the step ends' positions in them) of a sample, cut to `max_length` (keeping the start)."""
        if self.tokens == "sample":
            completion = list(sample.completion_ids)
            if self.tokenizer.eos_token_id is not None and completion[-1:] == [self.tokenizer.eos_token_id]:
                completion = completion[:-1]
            if completion and completion[-len(self.sep_ids):] != self.sep_ids:
                completion += self.sep_ids
            prompt, ends = list(sample.prompt_ids), separator_ends(completion, self.sep_ids)
        else:
            if self.prompt_field not in sample.row:
                raise KeyError(f"process_reward_model reads the prompt from the row field {self.prompt_field!r}, "
                               f"which this row lacks (fields: {', '.join(sorted(sample.row)) or 'none'}); set "
                               "prompt_field")
            from lmrl.models.steps import split_steps, step_ids

            encoded = step_ids(self.tokenizer, str(sample.row[self.prompt_field]),
                               split_steps(sample.text, self.separator), self.separator)
            prompt, completion, ends = encoded.prompt_ids, encoded.completion_ids, encoded.ends
        ids = (prompt + completion)[: self.max_length]
        kept = [len(prompt) + e for e in ends if len(prompt) + e < len(ids)]
        if len(kept) < len(ends) and not self.warned_cut:
            self.warned_cut = True
            print(f"process_reward_model: a reply's last {len(ends) - len(kept)} of {len(ends)} steps lie past "
                  f"max_length={self.max_length} tokens and are not scored (sample.info['prm_steps_cut'] counts "
                  "them); raise max_length", file=sys.stderr)
        sample.info["prm_steps_cut"] = len(ends) - len(kept)
        return ids, kept

    def __call__(self, sample: Sample) -> float:
        return self.score_batch([sample])[0]

    def score_batch(self, samples: list[Sample]) -> list[float]:
        """Each sample's aggregate reward; its step scores in `info["prm"]`."""
        encoded = [self.encode(s) for s in samples]
        steps: list[list[float]] = []
        for start in range(0, len(encoded), self.batch_size):
            steps += self._forward(encoded[start: start + self.batch_size])
        for sample, scores in zip(samples, steps):
            sample.info["prm"] = scores
        return [aggregate_steps(scores, self.aggregate) for scores in steps]

    def _forward(self, rows: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        import torch

        width = max(max(len(ids) for ids, _ in rows), 1)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, _) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        with self.lock, torch.no_grad():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        good = good_probability(logits).cpu()
        return [[float(good[i, e]) for e in ends] for i, (_, ends) in enumerate(rows)]
