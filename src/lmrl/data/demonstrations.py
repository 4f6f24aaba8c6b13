"""Sample sources: completions the engine did not sample, added to the kept groups (`data.demonstrations`).

`task.demonstration` is a template over the task row's fields (e.g. "{solution}", or
"Answer: {answer}"); its text, tokenised once and ended with EOS, becomes a Sample whose origin
says it was not sampled by the engine: its behaviour log-probs are the current policy's, filled
before the update, so its importance ratio starts at 1. It is scored by the run's reward like any
sample. The sources registered in `SAMPLE_SOURCES`:

- `group`: every kept group gets the demonstration as one more member (`Origin.DEMONSTRATION`), so
  group-relative advantages compare the samples against it (GFT's group of the demonstration and
  model samples);
- `rescue`: a group in which no sample succeeded gets it as a separate row (`Origin.RESCUE`), left
  out of the advantage estimation (advantage 0, never pooled by `algo.group_by`) and trained only by
  the supervised `demo_nll` term (`algo.terms`) (Mutual RL's SGT rescue set, with the reference solution
  standing in for a peer's success);
- `peers`: every group gets the completions another policy wrote for the prompt (`Origin.PEER`),
  from the row field `task.peer_rollouts` (a list of {"text": ..., "logprob": the writer's
  log-probability of it}), as more members (Mutual RL's PRP). Their behaviour log-prob is the
  writer's: its total is spread evenly over the tokens here, so a sequence-level rollout correction
  (`ppo_clip_tis_seq`) weighs each by π_self(y)/π_peer(y), truncated; per-token ratios do not exist
  across tokenizers.

Demonstrations are scored alone, so the run's reward must be per sample (no group components, and
a per-sample aggregation); the config check says so.

A source is called as `source(groups, generate)`: `generate(rows, n, temperature=None)` rolls out
`n` completions of each row with the run's engine (unscored groups; at the run's temperature unless given), for the sources that sample guided or hinted
prompts (`lmrl.data.guidance`). Each registration declares a `SourceSpec`, which the config checks
read. A source object with `state_dict` / `load_state_dict` keeps state between steps.

The text is data, not a rollout: tokenising it is the same as tokenising a prompt.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from lmrl.registry import Registry
from lmrl.types import Group, Origin, Sample



@dataclass(frozen=True)
class SourceSpec:
    """What a sample source needs from the config and the data."""

    template: bool = False  # reads task.demonstration
    scored_alone: bool = True  # scores its samples apart from their group: per-sample rewards only
    generates: bool = False  # rolls out prompts of its own (no group filter; single-turn unless `episodes`)
    episodes: bool = False  # what it generates may be episodes of the run's environment (env.name)
    supervised: bool = False  # its rows train only through a term over demonstration rows (demo_nll)
    in_advantage: bool = True  # its rows enter the advantage estimate (False: trained only by a supervised term)
    # the task setting naming the row field its samples come from (each row must carry it, as a list of
    # {"text": ..., "logprob": ...}); such samples bring only a sequence log-prob, which only a loss that
    # weighs sequences can use
    peer_field: str | None = None
    params: type | None = None  # the record of its knobs (data.source_params); `row_fields()`: the fields it reads
    adds: bool = True  # changes the assembled batch (False only for the rollouts alone)


# A source is built from (cfg, tokenizer, scorer) and maps the kept groups to (groups, metrics).
SAMPLE_SOURCES: Registry = Registry("sample source", declares=SourceSpec)

Generate = Callable[..., list[Group]]  # (rows, n, temperature=None) -> one unscored group of n rollouts per row
Source = Callable[..., tuple[list[Group], dict[str, float]]]  # (groups, generate=None) -> (groups, metrics)
MakeSamples = Callable[[dict], list[Sample]]


def template_fields(template: str) -> set[str]:
    """The row fields a demonstration template reads ("{a[0]}" and "{a.b}" read the field a)."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


def completion_ids(tokenizer, text: str, eos_id: int | None) -> list[int]:
    """A text not sampled here, tokenised once (it is data, like a prompt) and ended with EOS."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids + [eos_id] if eos_id is not None else ids


def demonstration_sample(tokenizer, row: dict, template: str, eos_id: int | None,
                         origin: Origin = Origin.DEMONSTRATION) -> Sample:
    text = template.format(**row)
    ids = completion_ids(tokenizer, text, eos_id)
    return Sample(prompt_ids=list(row["prompt_ids"]), completion_ids=ids, behaviour_logprobs=[0.0] * len(ids),
                  text=text, row=row, origin=origin)


def peer_samples(tokenizer, row: dict, field: str, eos_id: int | None) -> list[Sample]:
    """The row's peer rollouts as samples whose behaviour log-probs sum to the writer's log-prob."""
    out = []
    for i, peer in enumerate(row[field]):
        if not isinstance(peer, dict) or not isinstance(peer.get("text"), str) or "logprob" not in peer:
            raise ValueError(f"task row {row.get('uid')}: {field}[{i}] must be {{'text': str, 'logprob': float}}, "
                             f"got {peer!r}")
        ids = completion_ids(tokenizer, peer["text"], eos_id)
        per_token = float(peer["logprob"]) / len(ids)
        out.append(Sample(prompt_ids=list(row["prompt_ids"]), completion_ids=ids,
                          behaviour_logprobs=[per_token] * len(ids), text=peer["text"], row=row,
                          origin=Origin.PEER))
    return out


def succeeded(group: Group, accuracy_component: str) -> bool:
    return any(x.excluded is None and (x.rewards.get(accuracy_component) or 0.0) >= 1.0 for x in group.samples)


def scored_extra(group: Group, make: MakeSamples, scorer) -> Group:
    """`make(row)`'s samples for the group's prompt, scored alone as a group of their own."""
    extra = Group(uid=f"{group.uid}#demo", row=group.row, samples=make(group.row))
    scorer.score([extra])
    return extra


def as_members(groups: list[Group], make: MakeSamples, scorer) -> tuple[list[Group], dict[str, float]]:
    """Every group with `make(row)`'s samples as more members."""
    out, added = [], 0
    for group in groups:
        extra = scored_extra(group, make, scorer)
        added += len(extra.samples)
        out.append(Group(uid=group.uid, row=group.row, samples=group.samples + extra.samples))
    return out, {"data/demonstrations": float(added)}


def where_failed(groups: list[Group], make: MakeSamples, scorer,
                 accuracy_component: str) -> tuple[list[Group], dict[str, float]]:
    """Every group in which no sample succeeded followed by a group of `make(row)`'s samples."""
    out, added = [], 0
    for group in groups:
        out.append(group)
        if not succeeded(group, accuracy_component):
            extra = scored_extra(group, make, scorer)
            added += len(extra.samples)
            out.append(extra)
    return out, {"data/demonstrations": float(added)}


def sample_source(cfg, tokenizer, scorer) -> Source:
    """The run's sample source, chosen by `data.demonstrations`."""
    return SAMPLE_SOURCES.get(cfg.data.demonstrations)(cfg, tokenizer, scorer)


def source_params(cfg) -> Any:
    """The source's knobs (`data.source_params`) as its declared record; a TypeError names an unknown one."""
    record = SAMPLE_SOURCES.spec(cfg.data.demonstrations).params
    return record(**cfg.data.source_params) if record is not None else None


def source_state(source: Source) -> dict:
    """What a checkpoint saves of the source (empty for a stateless one)."""
    return source.state_dict() if hasattr(source, "state_dict") else {}


def load_source_state(source: Source, state: dict) -> None:
    if state and hasattr(source, "load_state_dict"):
        source.load_state_dict(state)


def _demonstration(cfg, tokenizer, origin: Origin) -> MakeSamples:
    one = partial(demonstration_sample, tokenizer, template=cfg.task.demonstration, eos_id=tokenizer.eos_token_id,
                  origin=origin)
    return lambda row: [one(row)]


@SAMPLE_SOURCES.register("none", "the rollouts only", scored_alone=False, adds=False)
def rollouts_only(cfg, tokenizer, scorer) -> Source:
    return lambda groups, generate=None: (groups, {})


@SAMPLE_SOURCES.register("group", "task.demonstration joins every kept group as one more member (GFT)", template=True)
def demonstration_members(cfg, tokenizer, scorer) -> Source:
    make = _demonstration(cfg, tokenizer, Origin.DEMONSTRATION)
    return lambda groups, generate=None: as_members(groups, make, scorer)


@SAMPLE_SOURCES.register("rescue", "task.demonstration as a row of its own for each group where nothing succeeded, "
                         "outside the advantage estimate (SGT)", template=True, in_advantage=False)
def rescue_rows(cfg, tokenizer, scorer) -> Source:
    make = _demonstration(cfg, tokenizer, Origin.RESCUE)
    return lambda groups, generate=None: where_failed(groups, make, scorer, cfg.reward.accuracy_component)


@SAMPLE_SOURCES.register("peers", "the completions of another policy in task.peer_rollouts join each group (PRP)",
                         peer_field="peer_rollouts")
def peer_members(cfg, tokenizer, scorer) -> Source:
    make = partial(peer_samples, tokenizer, field=cfg.task.peer_rollouts, eos_id=tokenizer.eos_token_id)
    return lambda groups, generate=None: as_members(groups, make, scorer)
