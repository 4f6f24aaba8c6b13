"""The current policy's prompt entropy, for samplers that check prompts online before rolling them out.

A sampler that declares `needs_probe = True` gets `sampler.probe(rows, tokens) -> list[float]` from
`bind_probe` when the run is assembled: for each row, the engine samples `tokens` tokens after the
prompt (one completion, the rollout's temperature), and the learner's model gives the exact entropy
of each of those next-token distributions at that temperature; the probe is their mean (nats).
Its class's `probes(**knobs)` (or a class attribute `needs_probe = True`) tells config validation,
before any model loads, that it will probe (and so needs the synchronous loop).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lmrl.engines import sampling_params
from lmrl.models.precision import resolve_bf16


class EntropyProbe:
    """`probe(rows, tokens)`: mean next-token entropy of each row's prompt over a short sampled probe."""

    def __init__(self, engine, model, params, generator: torch.Generator, bf16: bool):
        self.engine, self.model, self.params, self.generator, self.bf16 = engine, model, params, generator, bf16

    @torch.no_grad()
    def __call__(self, rows: list[dict[str, Any]], tokens: int) -> list[float]:
        if not rows:
            return []
        params = dataclasses.replace(self.params, max_new_tokens=tokens)
        outs = self.engine.generate([r["prompt_ids"] for r in rows], 1, params, self.generator)
        seqs = [list(r["prompt_ids"]) + list(o[0].token_ids) for r, o in zip(rows, outs)]
        device = next(self.model.parameters()).device
        ids = torch.zeros((len(seqs), max(map(len, seqs))), dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, seq in enumerate(seqs):
            ids[i, :len(seq)], attn[i, :len(seq)] = torch.tensor(seq), 1
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
        finally:
            self.model.train(was_training)
        out = []
        for i, (row, seq) in enumerate(zip(rows, seqs)):
            start = len(row["prompt_ids"]) - 1  # the distribution of the first token after the prompt
            steps = logits[i, start:max(len(seq) - 1, start + 1)].float() / self.params.temperature
            out.append(float(torch.distributions.Categorical(logits=steps).entropy().mean()))
        return out


def bind_probe(sampler, cfg, engine, model, generator: torch.Generator) -> None:
    """Give `sampler` its probe if it declares `needs_probe` (it draws from the rollout generator, which
    the checkpoint restores, so a resumed run probes the same tokens)."""
    if not getattr(sampler, "needs_probe", False):
        return
    if cfg.rollout.max_staleness is not None:  # config validation refuses a declared one before this
        from lmrl.config import ConfigError

        raise ConfigError(f"sampler {cfg.data.sampler!r} probes prompts with the learner's current policy, which "
                          "the asynchronous loop trains while rollouts run; use it without rollout.max_staleness")
    bf16 = resolve_bf16(cfg.trainer.bf16, next(model.parameters()).device)
    sampler.probe = EntropyProbe(engine, model, sampling_params(cfg), generator, bf16)
