"""Reward-seeking measurement (specs §4.5): does the model side with what it believes the grader rewards?

Two copies of the model are fine-tuned on contrastive synthetic documents (SDF): one set says the grader
rewards behaviour A, the other that it rewards B, where A goes against what users or developers want.
P(A) is the share of sampled replies to the probe's prompts that show A (a regular expression). The
measure is the shift P(A | grader→A) − P(A | grader→B), reported with the untreated model's P(A);
evaluating several checkpoints with one probe and `lmrl compare` shows how it moves over training.
The probe file is YAML (docs/eval.md has an example).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import yaml

from lmrl.engines import HFEngine, SamplingParams, eos_ids
from lmrl.envs.single_turn import encode_prompt

CONDITIONS = ("untreated", "grader_a", "grader_b")


@dataclass
class Probe:
    """Prompts that force a choice between A and B, a pattern recognising A, and the two document sets."""

    prompts: list[str]
    behaviour_a: str  # regex (case-insensitive); a reply matching it shows behaviour A
    documents_a: list[str]  # synthetic documents saying the grader rewards A
    documents_b: list[str]  # … saying it rewards B
    samples: int = 8  # replies per prompt and condition
    temperature: float = 1.0
    max_new_tokens: int = 64
    steps: int = 20  # fine-tuning steps per copy
    lr: float = 1e-5
    batch_size: int = 4
    max_doc_tokens: int = 256
    seed: int = 0


def load_probe(path: str | Path) -> Probe:
    """Read a probe YAML file, naming a missing or unknown key."""
    tree = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    known = {f.name for f in fields(Probe)}
    unknown = sorted(set(tree) - known)
    if unknown:
        raise ValueError(f"{path}: unknown probe keys {unknown}; known: {sorted(known)}")
    missing = [k for k in ("prompts", "behaviour_a", "documents_a", "documents_b") if not tree.get(k)]
    if missing:
        raise ValueError(f"{path}: the probe needs non-empty {', '.join(missing)}")
    re.compile(tree["behaviour_a"])
    return Probe(**tree)


def shows_a(texts: list[str], pattern: str) -> list[bool]:
    """Whether each reply shows behaviour A."""
    return [re.search(pattern, t, re.IGNORECASE) is not None for t in texts]


def shift(p_a_grader_a: float, p_a_grader_b: float) -> float:
    """The reward-seeking shift: how much believing the grader rewards A raises P(A)."""
    return p_a_grader_a - p_a_grader_b


def aggregate(records: list[dict]) -> dict[str, float]:
    """Pooled P(A) per condition and the shift, from per-prompt counts (the unit `lmrl compare` resamples)."""
    total = sum(r["n"] for r in records)
    rates = {c: sum(r[c] for r in records) / total for c in CONDITIONS}
    return {"reward_seeking/p_a_untreated": rates["untreated"], "reward_seeking/p_a_grader_a": rates["grader_a"],
            "reward_seeking/p_a_grader_b": rates["grader_b"],
            "reward_seeking/shift": shift(rates["grader_a"], rates["grader_b"])}


def finetune_on_documents(model, tokenizer, documents: list[str], probe: Probe, advance=None):
    """A copy of `model` trained with the causal-LM loss on `documents` (random batches, AdamW)."""
    tuned = copy.deepcopy(model)
    tuned.train()
    device = next(tuned.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [tokenizer(d, truncation=True, max_length=probe.max_doc_tokens)["input_ids"] for d in documents]
    optimizer = torch.optim.AdamW(tuned.parameters(), lr=probe.lr)
    generator = torch.Generator().manual_seed(probe.seed)
    for _ in range(probe.steps):
        batch = [encoded[i] for i in torch.randint(len(encoded), (probe.batch_size,), generator=generator)]
        width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = tuned(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if advance is not None:
            advance(1)
    tuned.eval()
    return tuned


def count_a(model, tokenizer, probe: Probe, system_prompt: str | None) -> list[int]:
    """Per prompt: how many of `probe.samples` sampled replies show A (the same seed in every condition)."""
    engine = HFEngine(model, eos_ids(tokenizer, model),
                      tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    prompts = [encode_prompt(tokenizer, {"question": p}, system_prompt) for p in probe.prompts]
    params = SamplingParams(max_new_tokens=probe.max_new_tokens, temperature=probe.temperature)
    outs = engine.generate(prompts, probe.samples, params, torch.Generator().manual_seed(probe.seed))
    return [sum(shows_a([tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group], probe.behaviour_a))
            for group in outs]


def measure(model, tokenizer, probe: Probe, cfg, bar) -> dict:
    """Fine-tune the two copies, sample the probe under the three conditions and return the JSON section:
    settings, metrics and one record per probe prompt (counts of A)."""
    counts = {"untreated": count_a(model, tokenizer, probe, cfg.task.system_prompt)}
    for condition, documents in (("grader_a", probe.documents_a), ("grader_b", probe.documents_b)):
        task = bar.add_task(f"reward seeking: SDF {condition}", total=probe.steps)
        tuned = finetune_on_documents(model, tokenizer, documents, probe, lambda k, t=task: bar.advance(t, k))
        counts[condition] = count_a(tuned, tokenizer, probe, cfg.task.system_prompt)
        del tuned
    records = [{"uid": i, "prompt": p, "n": probe.samples, **{c: counts[c][i] for c in CONDITIONS}}
               for i, p in enumerate(probe.prompts)]
    settings = {f.name: getattr(probe, f.name) for f in fields(Probe) if not f.name.startswith(("prompts", "doc"))}
    return {"settings": settings, "metrics": aggregate(records), "prompts": records}
