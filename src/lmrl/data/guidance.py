"""Help on hard prompts: sample sources that roll a prompt out again with something the policy was not shown.

Each runs after the groups are scored and filtered (`data.demonstrations`, knobs in `data.source_params`)
and rolls out the run's own engine (`generate`, see `lmrl.data.demonstrations`) on a prompt extended by
a text: after a blank line, at the end of the question (a chat row: of its last user message).

- `hints` (KnowRL): a group whose accuracy is at most `max_accuracy` is replaced by a group rolled out
  from the prompt plus its knowledge-point hints; the hinted prompt is the one trained (on-policy).
- `guided_replay` (TaoSR-AGRL): a group whose accuracy is below `tau` gets `count` rollouts of the prompt
  plus ground-truth guidance; moved back under the original prompt, they replace its worst members.
- `privileged` (RISE-RL): rubric criteria a prompt keeps missing are spelled out; the privileged
  rollouts that beat the group's mean reward, under the original prompt, form a row group of their own
  that only the `demo_nll` term (`algo.terms`) trains; the source turns itself off once the reward plateaus.

docs/methods/knowrl.md, taosr_agrl.md and rise_rl.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from statistics import mean
from typing import Any, Callable

from lmrl.data.demonstrations import SAMPLE_SOURCES, Generate, source_params, template_fields
from lmrl.envs import encode_prompt
from lmrl.types import Group, Origin, Sample

EXAMPLE_ROLES = ("user", "assistant", "tool")  # a worked exchange's messages (tool: a tool's result)
HINT_TEMPLATE = "## Hint\n{hints}"
CRITERIA_TEMPLATE = "Make sure your reply meets these criteria:\n{criteria}"


def extended_row(row: dict, text: str, tokenizer, system_prompt: str | None, tag: str,
                 examples: list[dict] | None = None) -> dict:
    """`row` with `text` appended to its prompt after a blank line (none when empty) and `examples`
    (chat messages: a worked exchange) put before its first user message, re-encoded, under the uid
    `uid#tag`. An environment builds its episode's prompt from the same row fields."""
    out = {k: v for k, v in row.items() if k != "variants"}
    out.update(uid=f"{row['uid']}#{tag}", question=f"{row['question']}\n\n{text}" if text else row["question"])
    chat = row.get("prompt_messages")
    if chat is not None and text:
        last = max(i for i, m in enumerate(chat) if m["role"] == "user")
        chat = [{**m, "content": f"{m['content']}\n\n{text}"} if i == last else dict(m) for i, m in enumerate(chat)]
    if examples:
        chat = chat if chat is not None else [{"role": "user", "content": out["question"]}]
        first = min(i for i, m in enumerate(chat) if m["role"] == "user")
        chat = [dict(m) for m in chat[:first]] + [dict(m) for m in examples] + [dict(m) for m in chat[first:]]
    if chat is not None:
        out["prompt_messages"] = chat
    out["prompt_ids"] = encode_prompt(tokenizer, out, system_prompt)
    return out


def group_accuracy(group: Group, component: str) -> float | None:
    """Share of the group's scored samples with `component` >= 1 (None when none was scored)."""
    scored = group.scored
    return sum((x.rewards.get(component) or 0.0) >= 1.0 for x in scored) / len(scored) if scored else None


def replayed(sample: Sample, row: dict, prompt_ids: list[int], origin: Origin) -> Sample:
    """A guided rollout moved under the original prompt `prompt_ids`: same completion (an episode keeps its
    environment tokens out of the loss), the policy's log-probs filled later."""
    return Sample(prompt_ids=list(prompt_ids), completion_ids=list(sample.completion_ids),
                  behaviour_logprobs=[0.0] * len(sample.completion_ids), finish_reason=sample.finish_reason,
                  policy_version=list(sample.policy_version), text=sample.text, row=row,
                  info={**sample.info.entries, "guided_prompt": sample.row["question"]}, origin=origin,
                  loss_mask=None if sample.loss_mask is None else list(sample.loss_mask))


def scored_replays(group: Group, rollouts: Group, origin: Origin, scorer) -> list[Sample]:
    """`rollouts` under `group`'s prompt, scored there by the run's reward; the excluded ones dropped.
    The prompt is the group's own (an environment's episodes start from the prompt it built), else the row's."""
    prompt_ids = group.samples[0].prompt_ids if group.samples else group.row["prompt_ids"]
    samples = [replayed(x, group.row, prompt_ids, origin) for x in rollouts.samples]
    scorer.score([Group(uid=rollouts.uid, row=group.row, samples=samples)])
    return [x for x in samples if x.excluded is None]


# --- KnowRL: minimal-sufficient knowledge-point hints ----------------------------------------------


def select_hints(accuracy: dict[tuple[int, ...], float], delta: float) -> tuple[int, ...]:
    """Constrained subset choice: the smallest measured subset whose accuracy is within `delta` of the
    largest subset's (all knowledge points); among equal sizes the most accurate, then the first."""
    full = max(accuracy, key=len)
    fit = [s for s in accuracy if s and accuracy[s] >= accuracy[full] - delta]
    return min(fit, key=lambda s: (len(s), -accuracy[s], s))


def search_hints(count: int, measure: Callable[[list[tuple[int, ...]]], list[float]],
                 delta: float) -> tuple[int, ...]:
    """Constrained Subset Search over `count` knowledge points: `measure` (a list of subsets → their
    accuracies) every subset of size 1, 2, … (each as a whole, so joint removals are judged jointly)
    until one is within `delta` of all of them."""
    full = tuple(range(count))
    accuracy = {full: measure([full])[0]}
    for size in range(1, count):
        subsets = list(combinations(range(count), size))
        accuracy.update(zip(subsets, measure(subsets)))
        chosen = select_hints(accuracy, delta)
        if len(chosen) == size:
            return chosen
    return full


@dataclass
class HintParams:
    field: str = "hints"  # row field: the knowledge points, a list of strings
    selected: str | None = "hint_index"  # row field: indices of the chosen subset (absent: every point)
    max_accuracy: float = 0.0  # a group at or below this accuracy is rolled out again with hints
    template: str = HINT_TEMPLATE  # appended to the prompt; {hints} = the points, one numbered line each

    def row_fields(self) -> set[str]:
        return {self.field}

    def hints(self, row: dict) -> list[str]:
        points = row[self.field]
        chosen = row.get(self.selected) if self.selected else None
        return [points[i] for i in chosen] if chosen is not None else list(points)

    def text(self, hints: list[str]) -> str:
        return self.template.format(hints="\n".join(f"{i}. {h}" for i, h in enumerate(hints, 1)))


@SAMPLE_SOURCES.register("hints", "KnowRL: a failed group is rolled out again from its prompt plus the row's "
                         "knowledge-point hints", scored_alone=False, generates=True, params=HintParams)
class HintedRerolls:
    """KnowRL: failed groups are rolled out again, whole, from the prompt with its chosen hints."""

    def __init__(self, cfg, tokenizer, scorer):
        self.params: HintParams = source_params(cfg)
        self.cfg, self.tokenizer, self.scorer = cfg, tokenizer, scorer

    def __call__(self, groups: list[Group], generate: Generate) -> tuple[list[Group], dict[str, float]]:
        p, component = self.params, self.cfg.reward.accuracy_component
        failed = [i for i, g in enumerate(groups) if p.hints(g.row)
                  and (acc := group_accuracy(g, component)) is not None and acc <= p.max_accuracy]
        rows = [extended_row(groups[i].row, p.text(p.hints(groups[i].row)), self.tokenizer,
                             self.cfg.task.system_prompt, "hint") for i in failed]
        hinted = generate(rows, self.cfg.rollout.group_size) if rows else []
        self.scorer.score(hinted)
        out = list(groups)
        for i, group in zip(failed, hinted):
            out[i] = group
        metrics = {"hints/groups": float(len(failed))}
        accuracies = [a for g in hinted if (a := group_accuracy(g, component)) is not None]
        if accuracies:
            metrics["hints/accuracy"] = mean(accuracies)
        return out, metrics


# --- TaoSR-AGRL: adaptive guided replay ------------------------------------------------------------


@dataclass
class GuidedReplayParams:
    tau: float = 0.25  # a group whose accuracy is below tau gets guided rollouts
    count: int = 2  # guided rollouts per such group, each replacing one of its worst members
    guidance: str = "The correct answer is {answer}."  # appended to the prompt; a template over the row ("": none)
    examples: list[dict] | None = None  # chat messages of a worked exchange shown before the question
    temperature: float | None = None  # the guided rollouts' sampling temperature (None: the run's)

    def row_fields(self) -> set[str]:
        return template_fields(self.guidance)

    def check(self, cfg) -> None:
        if not self.guidance and not self.examples:
            raise ValueError("guided_replay needs guidance text or examples (or both)")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {self.temperature})")
        for m in self.examples or []:
            if not isinstance(m, dict) or m.get("role") not in EXAMPLE_ROLES or not isinstance(m.get("content"), str):
                raise ValueError(f"examples: each message needs a role ({'|'.join(EXAMPLE_ROLES)}) and a content "
                                 f"string (got {m!r})")


def worst_first(samples: list[Sample]) -> list[int]:
    """Indices from the worst sample (excluded, then the lowest reward) up; ties keep their order."""
    return sorted(range(len(samples)), key=lambda i: (samples[i].excluded is None, samples[i].reward or 0.0))


@SAMPLE_SOURCES.register("guided_replay", "TaoSR-AGRL: guided rollouts of a low-accuracy group, scored under the "
                         "original prompt, replace its worst members", generates=True, episodes=True,
                         params=GuidedReplayParams)
class GuidedReplay:
    """TaoSR-AGRL: guided rollouts, scored and trained under the original prompt, replace the worst members."""

    def __init__(self, cfg, tokenizer, scorer):
        self.params: GuidedReplayParams = source_params(cfg)
        self.cfg, self.tokenizer, self.scorer = cfg, tokenizer, scorer

    def __call__(self, groups: list[Group], generate: Generate) -> tuple[list[Group], dict[str, float]]:
        p = self.params
        hard = [i for i, g in enumerate(groups)
                if (acc := group_accuracy(g, self.cfg.reward.accuracy_component)) is not None and acc < p.tau]
        rows = [extended_row(groups[i].row, p.guidance.format(**groups[i].row), self.tokenizer,
                             self.cfg.task.system_prompt, "guided", p.examples) for i in hard]
        out, guided_rewards = list(groups), []
        for i, rollouts in zip(hard, generate(rows, p.count, p.temperature) if rows else []):
            guided = scored_replays(groups[i], rollouts, Origin.GUIDED, self.scorer)
            samples = list(groups[i].samples)
            for slot, sample in zip(worst_first(samples), guided):
                samples[slot] = sample
            out[i] = Group(uid=groups[i].uid, row=groups[i].row, samples=samples)
            guided_rewards += [x.reward for x in guided]
        metrics = {"guided/groups": float(len(hard)), "guided/replaced": float(len(guided_rewards))}
        if guided_rewards:
            metrics["guided/reward"] = mean(guided_rewards)
        return out, metrics


# --- RISE-RL: privileged trajectories from repeatedly missed rubric criteria -------------------------


@dataclass
class PrivilegedParams:
    criteria: dict[str, str] = field(default_factory=dict)  # reward key (component or component/part) -> its text
    hit: float = 1.0  # a sample meets a criterion when its value there is at least this
    min_misses: int = 4  # missed rollouts in a row of visits before a criterion is spelled out
    count: int = 2  # privileged rollouts per guided prompt
    template: str = CRITERIA_TEMPLATE  # appended to the prompt; {criteria} = the missed ones, one "- " line each
    plateau_window: int = 5  # W: off once the mean reward of the last W steps beats the W before by < plateau_tol
    plateau_tol: float = 0.01

    def row_fields(self) -> set[str]:
        return set()

    def check(self, cfg) -> None:
        if not self.criteria:
            raise ValueError("data.source_params.criteria must map reward keys to the texts of their criteria")
        names = [c.name for c in cfg.reward.components]
        unknown = sorted(k for k in self.criteria if not any(k == n or k.startswith(f"{n}/") for n in names))
        if unknown:
            raise ValueError(f"data.source_params.criteria: {unknown} name no reward component (of {names})")


@SAMPLE_SOURCES.register("privileged", "RISE-RL: rollouts of the prompt plus its repeatedly missed rubric "
                         "criteria, kept when they beat the group's mean reward, for the supervised term only",
                         generates=True, supervised=True, in_advantage=False,
                         params=PrivilegedParams)
class PrivilegedTrajectories:
    """RISE-RL: per prompt, misses of each criterion; guided rollouts for the repeatedly missed ones, kept
    when they beat the group's mean reward, as a group outside the advantage estimate."""

    def __init__(self, cfg, tokenizer, scorer):
        self.params: PrivilegedParams = source_params(cfg)
        self.cfg, self.tokenizer, self.scorer = cfg, tokenizer, scorer
        self.misses: dict[str, dict[str, int]] = {}
        self.history: list[float] = []  # the mean reward of the natural rollouts, per step
        self.active = True

    def observe(self, group: Group) -> list[str]:
        """Count the group's misses of each criterion (a visit without one resets it); the criteria now due."""
        counts = self.misses.setdefault(group.uid, {})
        for key in self.params.criteria:
            values = [x.rewards.get(key) for x in group.scored]
            missed = sum(v is not None and v < self.params.hit for v in values)
            counts[key] = (counts.get(key, 0) + missed) if missed else 0
        return [k for k, n in counts.items() if n >= self.params.min_misses]

    def plateaued(self) -> bool:
        w = self.params.plateau_window
        if w == 0 or len(self.history) < 2 * w:
            return False
        return mean(self.history[-w:]) - mean(self.history[-2 * w:-w]) < self.params.plateau_tol

    def __call__(self, groups: list[Group], generate: Generate) -> tuple[list[Group], dict[str, float]]:
        p = self.params
        missed = [self.observe(g) for g in groups]
        natural = [x.reward for g in groups for x in g.scored]
        if natural:
            self.history.append(mean(natural))
        self.active = self.active and not self.plateaued()
        due = [i for i, g in enumerate(groups) if missed[i] and g.scored] if self.active else []
        texts = [p.template.format(criteria="\n".join(f"- {p.criteria[k]}" for k in missed[i])) for i in due]
        rows = [extended_row(groups[i].row, text, self.tokenizer, self.cfg.task.system_prompt, "privileged")
                for i, text in zip(due, texts)]
        extra: dict[int, Group] = {}
        sampled = 0
        for i, rollouts in zip(due, generate(rows, p.count) if rows else []):
            privileged = scored_replays(groups[i], rollouts, Origin.PRIVILEGED, self.scorer)
            sampled += len(privileged)
            bar = mean(x.reward for x in groups[i].scored)
            better = [x for x in privileged if x.reward > bar]
            if better:
                extra[i] = Group(uid=rollouts.uid, row=groups[i].row, samples=better)
        out = [h for i, g in enumerate(groups) for h in ([g, extra[i]] if i in extra else [g])]
        return out, {"privileged/active": float(self.active), "privileged/prompts": float(len(due)),
                     "privileged/sampled": float(sampled),
                     "privileged/kept": float(sum(len(g.samples) for g in extra.values()))}

    def state_dict(self) -> dict[str, Any]:
        return {"misses": self.misses, "history": self.history, "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.misses, self.history, self.active = state["misses"], state["history"], state["active"]
