"""Batch sources: where each step's batch comes from (`batches.source`, docs/stages/index.md).

`rollouts` is the policy's own rollouts, made by the loop (inline or in the background) and scored by the
reward: the RL step, with advantages and the policy-gradient term. Every other source is an offline
dataset read once, encoded into token ids once (`Sample`s of origin `DATASET`) and trained by the terms
of `algo.terms` alone: `sft` (demonstrations, loss on the assistant's tokens), `pairs` (preference
pairs, one group of [chosen, rejected] each, for DPO-family and reward-model terms) and `unpaired`
(KTO's desirable / undesirable rows), `steps` (stepwise-supervised traces labelled at each step's end, for a
process reward model), `rollout_pairs` (pairs of an earlier run's recorded rollouts, its
best- and worst-rewarded sample of each prompt, token ids as sampled) and `demonstrations` (the task's own rows with their reference
completion, `task.demonstration`: an SFT cold start on the task RL trains next). An entry is a function
`(config, tokenizer, task rows, held-out task rows) -> OfflineData`; its `BatchSourceSpec` says what the
loop and the validation derive from it (`check_batches`, run with the other config checks).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from lmrl.algos.terms import TERMS, active_terms
from lmrl.config import AlgoConfig, BatchesConfig, Config, ConfigError
from lmrl.registry import Registry
from lmrl.data.demonstrations import demonstration_sample
from lmrl.data.replay import ReplayParams, replayed_samples
from lmrl.types import Group, Origin, Sample


ROW_LABELS = frozenset({"chosen", "pair", "desirable", "step_labels"})  # a row's labels, as terms read them
PAIR_LABELS = frozenset({"chosen", "pair"})


@dataclass(frozen=True)
class BatchSourceSpec:
    online: bool = False  # the loop rolls the policy out for it: rewards, advantages, the policy-gradient term
    pairs: bool = False  # each group is a preference pair (chosen, rejected): what pairwise terms compare
    formats: frozenset[str] = frozenset()  # the dataset formats it reads (`batches.format`)
    task_rows: bool = False  # reads the task's rows (not batches.dataset)
    labels: frozenset[str] = frozenset()  # the `ROW_LABELS` its rows carry (a pair source's: chosen, pair)
    completions: bool = False  # each row is a prompt and its completion, which `batches.on_policy` may regenerate
    # (cfg, kept groups, learner, tokenizer) -> (pair groups, metrics): how an online pair source makes its pairs
    # from a step's rollouts with the policy's help; None: each group's best- and worst-rewarded samples
    mines: Callable[..., tuple[list[Group], dict[str, float]]] | None = None

    def __post_init__(self):
        object.__setattr__(self, "formats", frozenset(self.formats))
        object.__setattr__(self, "labels", frozenset(self.labels) | (PAIR_LABELS if self.pairs else frozenset()))

    @property
    def policy_gradient(self) -> bool:
        """Its batches train the policy-gradient loss on rewards: rollouts not made into pairs. Every other
        source is trained by the terms of `algo.terms` alone."""
        return self.online and not self.pairs


@dataclass
class OfflineData:
    """An offline source's encoded rows: the training groups, the held-out ones (the eval loss), and how many
    dataset rows were left out, by reason."""

    train: list[Group]
    eval: list[Group] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> rows, e.g. "had no assistant tokens to train on"
    source: str = ""

    def summary(self) -> str:
        left_out = "; ".join(f"{n} row{'s' if n != 1 else ''} left out: {why}" for why, n in self.dropped.items())
        return (f"{self.source}: {len(self.train)} training rows, {len(self.eval)} held out"
                + (f" ({left_out})" if left_out else ""))


BATCH_SOURCES: Registry = Registry("batch source", declares=BatchSourceSpec)


@BATCH_SOURCES.register("rollouts", "the policy's own rollouts of the task's prompts, scored by the reward (RL)",
                        online=True)
def rollouts(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> None:
    """Made by the step loop itself (`loops.inline`, `loops.background`): there is nothing to read up front."""
    return None


def held_out(groups: list[Group], cfg: BatchesConfig) -> tuple[list[Group], list[Group]]:
    """(training, held-out) groups: `batches.num_eval` of them held out after a shuffle seeded by
    `batches.params.seed`."""
    groups = list(groups)
    random.Random(cfg.params.get("seed", 0)).shuffle(groups)
    return groups[cfg.num_eval:], groups[: cfg.num_eval]


def encoded_groups(cfg: BatchesConfig, tokenizer, formats: frozenset[str], encode=None) -> OfflineData:
    """Read `batches.dataset` (held-out rows: `batches.params.eval_dataset` or `eval_split`), encode every record
    as one group (a pair: [chosen, rejected]), and hold `batches.num_eval` rows out (a seeded shuffle) when no
    held-out source is given. Rows that leave nothing to train are counted by reason (`OfflineData.dropped`).
    `encode`: the records' encoder (default `data.sft.encode_records`, which dispatches on the format)."""
    from lmrl.data.sft import detect_format, encode_records, read_records, skipped_summary

    encode = encode or encode_records

    if cfg.dataset is None:
        raise ValueError(f"batches.source={cfg.source} reads an offline dataset: set batches.dataset")
    dropped: Counter = Counter()
    assistant_only = bool(cfg.params.get("assistant_only", True))

    def groups_of(name: str, key: str, params: dict, prefix: str) -> list[Group]:
        records = read_records(name, params, key=key)
        fmt = detect_format(records, None if cfg.format == "auto" else cfg.format)
        if fmt not in formats:
            raise ValueError(f"{key} {name} is in the {fmt} format; batches.source={cfg.source} reads "
                             f"{', '.join(sorted(formats))}")
        items, skipped = encode(records, fmt, tokenizer, cfg.max_tokens, assistant_only)
        dropped.update(skipped)
        return [Group(f"{prefix}{i}", item[0].row if isinstance(item, tuple) else item.row,
                      list(item) if isinstance(item, tuple) else [item]) for i, item in enumerate(items)]

    train = groups_of(cfg.dataset, "batches.dataset", cfg.params, "row-")
    held_name, held_split = cfg.params.get("eval_dataset"), cfg.params.get("eval_split")
    if held_name is not None or held_split is not None:
        params = {**cfg.params, "split": held_split or cfg.params.get("split", "train")}
        held = groups_of(held_name or cfg.dataset, "batches.params.eval_dataset" if held_name else "batches.dataset",
                         params, "eval-")[: cfg.num_eval or None]
    else:
        train, held = held_out(train, cfg)
    if not train:
        raise ValueError(f"batches.dataset {cfg.dataset}: no row left to train on"
                         + (f" ({skipped_summary(dropped, cfg.max_tokens)})" if dropped else ""))
    return OfflineData(train, held, dict(dropped), f"{cfg.source} {cfg.dataset}")


@BATCH_SOURCES.register("sft", "supervised rows (chat messages, prompt/completion or plain text): the loss on the "
                        "assistant's tokens", formats={"messages", "prompt_completion", "text"}, completions=True)
def sft(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    """With `batches.on_policy` set, every row needs a prompt to roll out: plain text rows have none."""
    from lmrl.data.sft import record_format

    data = encoded_groups(cfg.batches, tokenizer, BATCH_SOURCES.spec("sft").formats)
    text = cfg.batches.format == "text" or any(record_format(g.row) == "text" for g in data.train)
    if cfg.batches.on_policy is not None and text:
        raise ValueError(f"batches.on_policy regenerates each row's completion from its prompt; the text rows of "
                         f"{cfg.batches.dataset} have no prompt (use messages or prompt/completion rows)")
    return data


@BATCH_SOURCES.register("pairs", "preference pairs (chosen / rejected, TRL's format): one group per pair",
                        pairs=True, formats={"preference"})
def pairs(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    return encoded_groups(cfg.batches, tokenizer, BATCH_SOURCES.spec("pairs").formats)


@BATCH_SOURCES.register("unpaired", "rows labelled desirable or not (prompt, completion, label: KTO's format)",
                        formats={"unpaired"}, labels={"desirable"})
def unpaired(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    return encoded_groups(cfg.batches, tokenizer, BATCH_SOURCES.spec("unpaired").formats)


@BATCH_SOURCES.register("steps", "stepwise-supervised traces (prompt, completions: steps, labels: one per step, TRL's "
                        "format): each step's label on its last token, for a process reward model",
                        formats={"stepwise"}, labels={"step_labels"})
def steps(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    """`data.steps`: `batches.params` `separator` (default "\\n"), `max_completion_tokens` (default none) and
    `last_step_only` (default false: TRL's train_on_last_step_only, the held-out rows keep every label)."""
    from lmrl.data.steps import DEFAULT_SEPARATOR, last_step_only, step_encoder

    params = cfg.batches.params
    encode = step_encoder(params.get("max_completion_tokens"), params.get("separator", DEFAULT_SEPARATOR))
    data = encoded_groups(cfg.batches, tokenizer, BATCH_SOURCES.spec("steps").formats, encode)
    if params.get("last_step_only", False):
        data.train = [replace(g, samples=[last_step_only(x) for x in g.samples]) for g in data.train]
    return data


@BATCH_SOURCES.register("demonstrations", "the task's own rows, each with its reference completion "
                        "(task.demonstration): an SFT cold start on the task RL trains next", task_rows=True,
                        completions=True)
def task_demonstrations(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    """The prompt exactly as a rollout of the row sees it (chat template, system prompt), followed by
    `task.demonstration` filled from the row and EOS; the held-out task rows give the eval loss. With an
    environment, the demonstration is a script of policy turns played against it (`data.scripted_episodes`)."""
    held = eval_rows[: cfg.batches.num_eval]
    if cfg.env.name is not None:
        from lmrl.data.scripted_episodes import episode_demonstrations

        train, dropped = episode_demonstrations(cfg, tokenizer, rows, "row-")
        held_groups, _ = episode_demonstrations(cfg, tokenizer, held, "eval-")
        if not train:
            raise ValueError(f"task.demonstration: no worked episode of environment {cfg.env.name} followed its "
                             f"script ({'; '.join(f'{n} {why}' for why, n in dropped.items())})")
        return OfflineData(train, held_groups, dict(dropped),
                           f"worked episodes of environment {cfg.env.name} on task {cfg.task.name}")

    def groups(of: list[dict], prefix: str) -> list[Group]:
        return [Group(f"{prefix}{i}", row, [demonstration_sample(tokenizer, row, cfg.task.demonstration,
                                                                 tokenizer.eos_token_id, Origin.DATASET)])
                for i, row in enumerate(of)]
    return OfflineData(groups(rows, "row-"), groups(held, "eval-"), {},
                       f"demonstrations of task {cfg.task.name} ({cfg.task.demonstration!r})")


NO_GAP = "had no reward gap between its samples"


def best_and_worst(samples: list[Sample], min_gap: float = 0.0) -> list[Sample] | None:
    """[the best-rewarded sample, the worst], labelled chosen and rejected in their `info`; None when the rewards
    differ by no more than `min_gap` (ties go to the earlier sample). Excluded samples do not count."""
    scored = [x for x in samples if x.excluded is None and x.reward is not None]
    if len(scored) < 2:
        return None
    best, worst = max(scored, key=lambda x: x.reward), min(scored, key=lambda x: x.reward)
    if best.reward - worst.reward <= min_gap:
        return None
    best.info["preference"], worst.info["preference"] = "chosen", "rejected"
    return [best, worst]


def preference_pairs(groups: list[Group], min_gap: float = 0.0) -> tuple[list[Group], int]:
    """Each group as the pair of its best- and worst-rewarded samples (online preference optimisation: pairs
    built from the policy's own rollouts by any reward), and how many groups made none."""
    pairs = [(g, best_and_worst(g.samples, min_gap)) for g in groups]
    return [Group(g.uid, g.row, p) for g, p in pairs if p is not None], sum(p is None for _, p in pairs)


def step_pairs(cfg: Config, kept: list[Group], learner=None, tokenizer=None) -> tuple[list[Group], dict[str, float]]:
    """A step's kept groups as its source trains them: for a pair source (`online_pairs`) the preference pair of
    each (`preference_pairs`, `batches.params.min_gap`) with the metrics `data/pairs` and `data/unpaired_groups`;
    for a source that mines its pairs with the policy (`BatchSourceSpec.mines`: `token_pairs`) what it mines; for
    any other source the groups as they are. Applied where a step's batch is collected
    (`loops.collect.collect_groups`), so the inline and the background source pair alike."""
    spec = BATCH_SOURCES.spec(cfg.batches.source)
    if not spec.pairs:
        return kept, {}
    if spec.mines is not None:
        return spec.mines(cfg, kept, learner, tokenizer)
    pairs, unpaired = preference_pairs(kept, float(cfg.batches.params.get("min_gap", 0.0)))
    return pairs, {"data/pairs": float(len(pairs)), "data/unpaired_groups": float(unpaired)}


@BATCH_SOURCES.register("online_pairs", "the policy's own rollouts, each prompt's best- and worst-rewarded samples "
                        "as a preference pair (online DPO: pairs from any reward)", online=True, pairs=True)
def online_pairs(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> None:
    """Made by the step loop, like `rollouts`, inline or in the background (`rollout.max_staleness`); each step's
    kept groups are paired where they are collected (`step_pairs`)."""
    return None


def mine_tokens(cfg: Config, kept: list[Group], learner, tokenizer) -> tuple[list[Group], dict[str, float]]:
    """TLPO's token pairs of a step's rollouts, probed with the learner's current policy (`data.token_pairs`)."""
    from lmrl.data.token_pairs import ModelProbe, TokenPairParams, mine_token_pairs

    probe = ModelProbe(learner.model, learner.device, tokenizer.eos_token_id, cfg.rollout.temperature)
    return mine_token_pairs(kept, probe, tokenizer, TokenPairParams.of(cfg.batches.params))


@BATCH_SOURCES.register("token_pairs", "TLPO: the policy's own rollouts, each wrong-language span's first token e "
                        "paired with the policy's best in-language alternative a+ (one-token completions after a "
                        "shared prefix)", online=True, pairs=True, mines=mine_tokens)
def token_pairs(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> None:
    """Made by the step loop, like `online_pairs`; `batches.params`: k, m, error, lang, lang_field, max_positions
    (`data.token_pairs.TokenPairParams`)."""
    return None


@BATCH_SOURCES.register("rollout_pairs", "pairs from an earlier run's recorded rollouts (run.save_rollouts): each "
                        "prompt's best- and worst-rewarded samples, token ids as sampled", pairs=True,
                        formats={"rollouts"})
def rollout_pairs(cfg: Config, tokenizer, rows: list[dict], eval_rows: list[dict]) -> OfflineData:
    """`batches.dataset` is a rollouts.jsonl (one record per group, `data.replay`). A group whose rewards are all
    equal (or differ by less than `batches.params.min_gap`) makes no pair; ties go to the earlier sample. The
    policy that samples and the reward that scored decide the preference (pairs built from any reward): the
    recorded reward, or with `batches.params.rank_by` one recorded reward component (e.g. the gold verifier a run
    logged with weight 0 beside the proxy it trained on)."""
    from lmrl.data.sft import read_records

    b = cfg.batches
    if b.dataset is None:
        raise ValueError("batches.source=rollout_pairs reads a run's rollouts.jsonl: set batches.dataset")
    min_gap, rank_by = float(b.params.get("min_gap", 0.0)), b.params.get("rank_by")
    groups, dropped = [], Counter()
    for i, record in enumerate(read_records(b.dataset, b.params, key="batches.dataset")):
        if "rollouts" not in record:
            raise ValueError(f"batches.dataset {b.dataset}: record {i} has no 'rollouts' (a run's rollouts.jsonl, "
                             "written with run.save_rollouts=true)")
        samples = [replace(x, origin=Origin.DATASET, info={}) for x in replayed_samples(record, ReplayParams())]
        if rank_by is not None:
            missing = [x for x in samples if rank_by not in x.rewards]
            if missing:
                raise ValueError(f"batches.dataset {b.dataset}: record {i} has no reward component {rank_by!r} "
                                 f"(batches.params.rank_by; it has {', '.join(sorted(missing[0].rewards)) or 'none'})")
            samples = [replace(x, reward=float(x.rewards[rank_by])) for x in samples]
        pair = best_and_worst(samples, min_gap)
        if pair is None:
            dropped[NO_GAP] += 1
            continue
        groups.append(Group(f"pair-{i}", record, pair))
    if len(groups) <= b.num_eval:
        raise ValueError(f"batches.dataset {b.dataset}: {len(groups)} pairs, not more than batches.num_eval="
                         f"{b.num_eval}")
    train, held = held_out(groups, b)
    return OfflineData(train, held, dict(dropped), f"rollout_pairs {b.dataset}")


def check_batches(cfg: Config) -> None:
    """What the batch source's declaration (`BatchSourceSpec`) allows: the row labels a term reads (`chosen`,
    `pair`, `desirable`) come from a source that makes them, a term declared `on_policy` trains the policy's own
    samples (every step's: not a mix of the policy's and a dataset's, `batches.on_policy`), and a source without
    the policy-gradient term takes no setting of it (they would be ignored)."""
    b, spec, a = cfg.batches, BATCH_SOURCES.spec(cfg.batches.source), cfg.algo
    source = f"batches.source={b.source}"
    if b.on_policy is not None and not spec.completions:
        raise ConfigError(f"batches.on_policy regenerates the completions of a dataset's prompt/completion rows "
                          f"(batches.source={' or '.join(n for n, x in BATCH_SOURCES.specs().items() if x.completions)}"
                          f"); {source} " + ("is the policy's own samples already" if spec.online else
                                             "has no such rows") + ": leave it unset")
    for t in (t for t in a.terms if t.coef != 0):
        term = TERMS.spec(t.name)
        missing = sorted(term.inputs & ROW_LABELS - spec.labels)
        makers = [n for n, s in BATCH_SOURCES.specs().items() if term.inputs & ROW_LABELS <= s.labels]
        if missing:
            raise ConfigError(f"the {t.name!r} term reads the row labels {missing}, which {source} does not make: "
                              f"use batches.source={' or '.join(makers) or '(a source that does)'}")
        if term.on_policy and b.on_policy is not None:
            raise ConfigError(f"the {t.name!r} term's gradient holds on the policy's own samples only, sampled at "
                              f"the learner's temperature; with batches.on_policy={b.on_policy} a step trains the "
                              "dataset's tokens or the policy's (at rollout.temperature): use batches.source=rollouts "
                              "for the policy's samples every step, or a term valid on both (gkd, nll)")
        if term.on_policy and not spec.online:
            raise ConfigError(f"the {t.name!r} term's gradient holds on the policy's own samples only; {source} "
                              "trains a dataset's tokens")
        if term.imitates and spec.pairs:
            raise ConfigError(f"the {t.name!r} term would imitate both replies of each pair of {source}, the "
                              "rejected one too ('orpo' adds the chosen reply's NLL)")
    if spec.policy_gradient:
        return
    if not active_terms(a, policy_gradient=False):
        raise ConfigError(f"{source} is trained by the terms of algo.terms alone (e.g. [{{name: nll}}] or "
                          "[{name: dpo}]), and it lists none")
    unused = [(a.kl_in_reward, "algo.kl_in_reward"), (bool(a.shaping), "algo.shaping"), (a.critic, "algo.critic"),
              *((getattr(a, k) != AlgoConfig.model_fields[k].default, f"algo.{k}") for k in ("advantage", "loss")),
              (cfg.data.demonstrations != "none", "data.demonstrations"), (a.group_by is not None, "algo.group_by")]
    if not spec.online:
        unused += [(cfg.data.group_filter != "none", "data.group_filter"), (cfg.dist.backend != "none", "dist.backend"),
                   (cfg.rollout.max_staleness is not None, "rollout.max_staleness")]
    for bad, key in unused:
        if bad:
            raise ConfigError(f"{source} is trained by its listed terms, without the policy-gradient loss; {key} "
                              "applies to that loss or its rollouts: leave it unset")
    if spec.online and cfg.rollout.stream_chunks > 1:
        raise ConfigError(f"rollout.stream_chunks={cfg.rollout.stream_chunks}: {source} pairs the groups of a whole "
                          "step and its pairwise terms divide by the step's pairs, so the batch cannot be trained chunk "
                          "by chunk: use rollout.stream_chunks=1 (rollout.max_staleness runs it asynchronously)")
    if spec.mines is not None:
        from lmrl.data.token_pairs import TokenPairParams

        try:
            TokenPairParams.of(b.params)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from None
        if cfg.rollout.max_staleness is not None:
            raise ConfigError(f"{source} probes the policy being trained for its alternatives while it mines a "
                              "step's rollouts, so it runs in the synchronous loop only: leave rollout.max_staleness "
                              "unset")
        return
    if spec.online and cfg.rollout.group_size < 2:
        raise ConfigError(f"{source} pairs the samples of each prompt: rollout.group_size must be >= 2")
    if spec.online:
        return
    if spec.task_rows and cfg.task.demonstration is None:
        raise ConfigError(f"{source} reads the task's rows with their reference completion: set "
                          "task.demonstration, a template over the row's fields (e.g. 'Answer: {answer}')")
    if b.dataset is None and not spec.task_rows:
        raise ConfigError(f"{source} trains on the rows of an offline dataset: set batches.dataset (a "
                          ".jsonl/.json/.csv/.parquet file, a save_to_disk directory or a hub id)")
    if b.format != "auto" and b.format not in spec.formats:
        raise ConfigError(f"batches.format={b.format}: {source} reads {sorted(spec.formats)} (or auto)")
