"""Demonstrations: reference completions from the task data added to the rollout groups.

`task.demonstration` is a template over the task row's fields (e.g. "{solution}", or
"Answer: {answer}"); its text, tokenised once and ended with EOS, becomes a Sample that was not
sampled by the engine (its behaviour log-probs are the current policy's, filled by the loop before
the update, so its importance ratio starts at 1). It is scored by the run's reward like any sample
and flagged `info["demonstration"]`. Two ways to use it (`data.demonstrations`):

- `group`: every kept group gets the demonstration as one more member, so group-relative
  advantages compare the samples against it (GFT's group of the demonstration and model samples);
- `rescue`: a group in which no sample succeeded gets it as a separate row, left out of the
  advantage estimation (advantage 0, never pooled by `algo.group_by`) and trained only by the
  supervised term `algo.demo_nll_coef` (Mutual RL's SGT rescue set, with the reference solution
  standing in for a peer's success);
- `peers`: every group gets the completions another policy wrote for the prompt, from the row field
  `task.peer_rollouts` (a list of {"text": ..., "logprob": the writer's log-probability of it}),
  as more members (Mutual RL's PRP). Their behaviour log-prob is the writer's: its total is spread
  evenly over the tokens here, so a sequence-level rollout correction (`ppo_clip_tis_seq`) weighs
  each by π_self(y)/π_peer(y), truncated; per-token ratios do not exist across tokenizers.

Demonstrations are scored alone, so the run's reward must be per sample (no group components, and
a per-sample aggregation); the config check says so.

The text is data, not a rollout: tokenising it is the same as tokenising a prompt.
"""
from __future__ import annotations

import string

from lmrl.types import Group, Sample


# `Batch.row_extras["demonstration"]` values: 0 sampled row, 1 group member (`group`), 2 rescue row,
# 3 another policy's rollout (`peers`, its behaviour log-probs come with it)
DEMO_CODES = {"group": 1.0, "rescue": 2.0, "peers": 3.0}
ON_POLICY_CODES = (1.0, 2.0)  # the loop fills these rows' behaviour log-probs with the current policy's


def template_fields(template: str) -> set[str]:
    """The row fields a demonstration template reads ("{a[0]}" and "{a.b}" read the field a)."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


def completion_ids(tokenizer, text: str, eos_id: int | None) -> list[int]:
    """A text not sampled here, tokenised once (it is data, like a prompt) and ended with EOS."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids + [eos_id] if eos_id is not None else ids


def demonstration_sample(tokenizer, row: dict, template: str, eos_id: int | None, mode: str = "group") -> Sample:
    text = template.format(**row)
    ids = completion_ids(tokenizer, text, eos_id)
    return Sample(prompt_ids=list(row["prompt_ids"]), completion_ids=ids, behaviour_logprobs=[0.0] * len(ids),
                  info={"text": text, "row": row, "demonstration": mode})


def peer_samples(tokenizer, row: dict, field: str, eos_id: int | None) -> list[Sample]:
    """The row's peer rollouts as samples whose behaviour log-probs sum to the writer's log-prob."""
    out = []
    for i, peer in enumerate(row[field]):
        if not isinstance(peer, dict) or not isinstance(peer.get("text"), str) or "logprob" not in peer:
            raise ValueError(f"task row {row.get('uid')}: {field}[{i}] must be {{'text': str, 'logprob': float}}, "
                             f"got {peer!r}")
        ids = completion_ids(tokenizer, peer["text"], eos_id)
        per_token = float(peer["logprob"]) / len(ids)
        out.append(Sample(prompt_ids=list(row["prompt_ids"]), completion_ids=ids, behaviour_logprobs=[per_token] * len(ids),
                          info={"text": peer["text"], "row": row, "demonstration": "peers"}))
    return out


def succeeded(group: Group, accuracy_component: str) -> bool:
    return any(x.excluded is None and (x.rewards.get(accuracy_component) or 0.0) >= 1.0 for x in group.samples)


def add_demonstrations(groups: list[Group], mode: str, source: str, tokenizer, scorer, accuracy_component: str,
                       eos_id: int | None) -> tuple[list[Group], dict[str, float]]:
    """The groups with demonstrations added (see the module docstring) and how many were added.

    `source` is the template (`group`, `rescue`) or the row field of the peer rollouts (`peers`)."""
    out, added = [], 0
    for group in groups:
        if mode == "rescue" and succeeded(group, accuracy_component):
            out.append(group)
            continue
        extra = (peer_samples(tokenizer, group.row, source, eos_id) if mode == "peers"
                 else [demonstration_sample(tokenizer, group.row, source, eos_id, mode)])
        demo = Group(uid=f"{group.uid}#demo", row=group.row, samples=extra)
        scorer.score([demo])
        added += len(extra)
        if mode in ("group", "peers"):
            out.append(Group(uid=group.uid, row=group.row, samples=group.samples + demo.samples))
        else:
            out += [group, demo]
    return out, {"data/demonstrations": float(added)}
