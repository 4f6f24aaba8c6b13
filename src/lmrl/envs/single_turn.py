"""The single-turn environment: a row becomes chat-templated prompt ids; one completion ends it.

`rollout` also dispatches to the multi-turn episode runner when the run names an environment."""
from __future__ import annotations

from typing import Any


def prompt_messages(row: dict[str, Any], system_prompt: str | None) -> list[dict[str, Any]]:
    """The chat messages of a row's prompt.

    A text row (`question`) becomes one user message, after `system_prompt` as a system message. A
    chat row (`prompt_messages`, a validated list from the task loader) is used as given; `system_prompt`
    is put in front only when the chat has no system message of its own.
    """
    chat = row.get("prompt_messages")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if chat is not None:
        messages = [dict(m) for m in chat]
        return messages if any(m["role"] == "system" for m in messages) else system + messages
    return system + [{"role": "user", "content": row["question"]}]


def encode_prompt(tokenizer, row: dict[str, Any], system_prompt: str | None) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant header."""
    messages = prompt_messages(row, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    text = "\n".join(m["content"] for m in messages) + "\n"
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def encode_rows(tokenizer, rows: list[dict[str, Any]], system_prompt: str | None,
                max_prompt_tokens: int) -> tuple[list[dict[str, Any]], int]:
    """Attach `prompt_ids` to each row; rows over the prompt budget are dropped and counted."""
    kept, dropped = [], 0
    for row in rows:
        ids = encode_prompt(tokenizer, row, system_prompt)
        if len(ids) > max_prompt_tokens:
            dropped += 1
            continue
        kept.append({**row, "prompt_ids": ids})
    return kept, dropped


def expand_prompts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows to roll out for sampled prompts: each row followed by its prompt variants
    (`add_prompt_variants`), in that order."""
    return [v for r in rows for v in (r, *r.get("variants", ()))]


def prompt_families(rows: list[dict[str, Any]], groups: list) -> list[list]:
    """The groups of `expand_prompts(rows)`'s rollout, one list per prompt (itself, then its variants)."""
    out, start = [], 0
    for row in rows:
        size = 1 + len(row.get("variants", ()))
        out.append(groups[start: start + size])
        start += size
    return out


def pooled(groups: list):
    """One prompt's groups (itself and its variants) as a single group, for the group filter."""
    from lmrl.types import Group

    if len(groups) == 1:
        return groups[0]
    return Group(uid=groups[0].uid, row=groups[0].row, samples=[x for g in groups for x in g.samples])


def add_prompt_variants(tokenizer, rows: list[dict[str, Any]], instructions: list[str],
                        system_prompt: str | None) -> list[dict[str, Any]]:
    """Rows that also roll out with each instruction appended to the question (after a blank line).

    For a chat row the instruction is appended to its last user message, which the question mirrors.

    Every row gets `prompt_variant` 0 and `variant_of` = its uid; its `variants` are full rows
    (`prompt_variant` i = 1, 2, …, their own `prompt_ids`) that `expand_prompts` expands at rollout.
    """
    out = []
    for row in rows:
        base = {**row, "prompt_variant": 0, "variant_of": row["uid"]}
        variants = []
        for i, instruction in enumerate(instructions, start=1):
            v = {**base, "uid": f"{row['uid']}#v{i}", "prompt_variant": i,
                 "question": f"{row['question']}\n\n{instruction}"}
            if row.get("prompt_messages") is not None:
                v["prompt_messages"] = _append_to_last_user(row["prompt_messages"], instruction)
            v["prompt_ids"] = encode_prompt(tokenizer, v, system_prompt)
            variants.append(v)
        out.append({**base, "variants": variants})
    return out


def _append_to_last_user(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return [{**m, "content": f"{m['content']}\n\n{instruction}"} if i == last else dict(m)
            for i, m in enumerate(messages)]


def rollout(engine, tokenizer, rows: list[dict[str, Any]], n: int, params, generator=None, env=None,
            controller=None) -> list:
    """Generate `n` completions per row (one batched engine call, or the rollout `controller`'s calls:
    `envs.controllers`) and wrap them as Groups of Samples.

    With an `env` config naming an environment (`EnvConfig.name`), each row is instead played as `n`
    multi-turn episodes (`lmrl.envs.episodes`, turn rounds batched across episodes)."""
    from lmrl.types import Group, Sample

    if env is not None and env.name is not None:
        from lmrl.envs.environment import build_env
        from lmrl.envs.episodes import Limits, run_episodes

        limits = Limits(env.max_turns, env.max_episode_tokens, env.step_timeout_s, env.concurrency)
        return run_episodes(engine, tokenizer, rows, n, params, build_env(env.name, env.params), limits, generator)
    prompts = [r["prompt_ids"] for r in rows]
    completions = (controller.complete(engine, prompts, n, params, generator) if controller is not None
                   else engine.generate(prompts, n, params, generator))
    groups = []
    for row, outs in zip(rows, completions):
        samples = []
        for c in outs:
            text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            samples.append(Sample(prompt_ids=list(row["prompt_ids"]), completion_ids=c.token_ids,
                                  behaviour_logprobs=c.logprobs, finish_reason=c.finish_reason,
                                  policy_version=c.policy_version, text=text, row=row,
                                  loss_mask=getattr(c, "loss_mask", None), info=dict(getattr(c, "info", {}))))
        group = Group(uid=row["uid"], row=row, samples=samples)
        group.value_groups = value_groups(tokenizer, group, outs)
        groups.append(group)
    return groups


def value_groups(tokenizer, group, completions) -> list:
    """The value-only groups of a group's completions (`Completion.value_rollouts`): one per continued prefix,
    each continuation a Sample with no loss (loss mask 0) whose info["value_of"] names the prefix."""
    from lmrl.types import Group, Sample

    out = []
    for i, (sample, c) in enumerate(zip(group.samples, completions)):
        rollouts = getattr(c, "value_rollouts", None) or {}
        if not rollouts:
            continue
        key = f"{group.uid}#{i}"
        sample.info.setdefault("steps", {})["key"] = key
        for end, continued in sorted(rollouts.items()):
            samples = [Sample(prompt_ids=list(group.row["prompt_ids"]), completion_ids=v.token_ids,
                              behaviour_logprobs=v.logprobs, finish_reason=v.finish_reason,
                              policy_version=v.policy_version, row=group.row,
                              text=tokenizer.decode(v.token_ids, skip_special_tokens=True),
                              loss_mask=[0] * len(v.token_ids), info={"value_of": {"key": key, "end": end}})
                       for v in continued]
            out.append(Group(uid=f"{key}@{end}", row=group.row, samples=samples))
    return out
