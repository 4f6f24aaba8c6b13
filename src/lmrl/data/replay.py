"""Recorded rollouts: the file a run writes (`run.save_rollouts`) and the sample source that replays it.

`RUN/rollouts.jsonl` holds one JSON line per group a step rolled out (the scored samples only): the
task row's own fields (so the file is itself a `jsonl` task: `question`, `answer`, …), `uid` =
"<row uid>@<step>", `row_uid`, `step`, `rollout_prompt_ids` and `rollouts`, one record per sample with
its completion ids, `loss_mask`, behaviour log-probs, reward components, reward, policy version,
finish reason and text. JSON lines, like metrics.jsonl: appended once per step, readable with any
tool, and rewound by byte position when a run resumes (`RunDir.positions`).

A later run trains from it with `task: {name: jsonl, dataset: RUN/rollouts.jsonl}` and
`data.demonstrations: replay`: each kept group's samples are replaced by the recorded ones of its
row (`Origin.REPLAYED`), with their recorded rewards and behaviour log-probs, so the advantages are
recomputed over the recorded group and a loss may weigh each sample by π_θ/μ (REGEN,
docs/methods/regen.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from lmrl.data.demonstrations import SAMPLE_SOURCES, Source, source_params
from lmrl.types import Group, Origin, Sample

SKIPPED_ROW_FIELDS = ("prompt_ids", "variants")  # re-encoded by the run that reads the file


def sample_record(sample: Sample, prompt_ids: list[int]) -> dict:
    """What replaying `sample` needs; its prompt ids only when they differ from the group's."""
    out = {"completion_ids": list(sample.completion_ids), "behaviour_logprobs": list(sample.behaviour_logprobs),
           "loss_mask": sample.loss_mask, "rewards": dict(sample.rewards), "reward": sample.reward,
           "policy_version": list(sample.policy_version), "finish_reason": sample.finish_reason,
           "text": sample.text}
    if sample.prompt_ids != prompt_ids:
        out["prompt_ids"] = list(sample.prompt_ids)
    return out


def rollout_records(step: int, groups: list[Group]) -> list[dict]:
    """One record per group with scored samples: its task row's fields, then the rollouts of `step`."""
    out = []
    for group in groups:
        scored = group.scored
        if not scored:
            continue
        prompt = list(scored[0].prompt_ids)
        row = {k: v for k, v in group.row.items() if k not in SKIPPED_ROW_FIELDS}
        row.update(uid=f"{group.uid}@{step}", row_uid=group.uid, step=step, rollout_prompt_ids=prompt,
                   rollouts=[sample_record(x, prompt) for x in scored])
        out.append(row)
    return out


@dataclass
class ReplayParams:
    field: str = "rollouts"  # row field: the recorded samples
    prompt_field: str = "rollout_prompt_ids"  # row field: the prompt ids they were sampled from

    def row_fields(self) -> set[str]:
        return {self.field, self.prompt_field}


def replayed_samples(row: dict, params: ReplayParams) -> list[Sample]:
    """The row's recorded samples, as they were scored and with the log-probs of the policy that sampled them."""
    prompt = row[params.prompt_field]
    return [Sample(prompt_ids=list(r.get("prompt_ids", prompt)), completion_ids=list(r["completion_ids"]),
                   behaviour_logprobs=[float(v) for v in r["behaviour_logprobs"]],
                   finish_reason=r.get("finish_reason", "stop"), policy_version=list(r.get("policy_version", [])),
                   rewards=dict(r["rewards"]), reward=float(r["reward"]), loss_mask=r.get("loss_mask"),
                   text=r.get("text", ""), row=row, origin=Origin.REPLAYED)
            for r in row[params.field]]


@SAMPLE_SOURCES.register("replay", "REGEN offline data: each kept group's samples are replaced by the recorded "
                         "rollouts of its row (an earlier run's rollouts.jsonl as the task), with their rewards and "
                         "behaviour log-probs", scored_alone=False, params=ReplayParams)
def replay(cfg, tokenizer, scorer) -> Source:
    params: ReplayParams = source_params(cfg)

    def swap(groups: list[Group], generate=None) -> tuple[list[Group], dict[str, float]]:
        out = [Group(uid=g.uid, row=g.row, samples=replayed_samples(g.row, params)) for g in groups]
        samples = [x for g in out for x in g.samples]
        metrics = {"replay/samples": float(len(samples))}
        if samples:
            metrics["replay/reward"] = mean(x.reward for x in samples)
        return out, metrics

    return swap
