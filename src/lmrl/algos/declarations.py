"""What each estimator, loss, loss aggregation, objective term and shaper declares at registration: the inputs it needs and what it guarantees.

`ADVANTAGES.register("grpo", "...", group_relative=True)` stores an `AdvantageSpec`;
`ADVANTAGES.spec("grpo")` reads it back. Config checks, the loop's inputs and the learner's shortcuts
are derived from these records (docs/architecture.md), never from the method's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class AdvantageSpec:
    requires: frozenset[str] = frozenset()  # per-sample inputs beyond rewards, groups and masks (docs/methods/inputs.md)
    state: type | None = None  # kept between steps and saved in checkpoints (algos/state.py)
    group_relative: bool = False  # compares the samples of one prompt: needs rollout.group_size >= 2
    group_local: bool = False  # a group's advantages read its own rows only (no batch statistics): streamable
    group_local_when: Callable[[dict[str, Any]], bool] | None = None  # knobs under which group_local holds
    critic: bool = False  # reads a value head's values; needs algo.critic=true
    value_targets: Callable[..., Any] | None = None  # the critic's regression targets (critic estimators)
    hidden_layer: int = -1  # which hidden states "hidden" means (index into the decoder's hidden states)

    def __post_init__(self):
        object.__setattr__(self, "requires", frozenset(self.requires))

    def is_group_local(self, knobs: dict[str, Any]) -> bool:
        """Whether, with these `algo.advantage_params`, a group's advantages read its own rows only."""
        return self.group_local and (self.group_local_when is None or self.group_local_when(knobs))


@dataclass(frozen=True)
class AggregationSpec:
    denominator: str | None = None  # the one `AggScale` field it divides by (streaming divides by it last)


@dataclass(frozen=True)
class LossSpec:
    requires: frozenset[str] = frozenset()
    state: type | None = None
    zero_at_zero_advantage: bool = False  # row-local and proportional to A: rows with A = 0 may be skipped
    token_mask: Callable[..., Any] | None = None  # rejects tokens (dropped from the denominators by default)
    needs_entropy: bool = False  # the learner computes exact token entropies with their gradient
    sequence_ratio: bool = False  # one importance ratio per sequence: dual-clip and token-ratio bounds do not apply
    sequence_is: bool = False  # weighs rows by pi_old(y)/pi_rollout(y): other policies' samples can be used
    sequence_is_when: Callable[[dict[str, Any]], bool] | None = None  # knobs under which sequence_is holds
    default_aggregation: str | None = None  # the aggregation the method is defined with
    # (rollout_logp, advantages, mask, **knobs) -> scalars the loss reads in `extras`, computed once over
    # the whole prepared batch (into `context`), so micro-batching cannot change them; chunks cannot stream
    batch_statistics: Callable[..., dict[str, float]] | None = None
    batch_statistics_when: Callable[[dict[str, Any]], bool] | None = None  # knobs under which they are computed

    def __post_init__(self):
        object.__setattr__(self, "requires", frozenset(self.requires))

    def reads_whole_batch(self, knobs: dict[str, Any]) -> bool:
        """Whether, with these `algo.loss_params`, the loss reads `batch_statistics` of the whole batch."""
        return self.batch_statistics is not None and (self.batch_statistics_when is None
                                                      or self.batch_statistics_when(knobs))

    def weighs_sequences(self, knobs: dict[str, Any]) -> bool:
        """Whether, with these `algo.loss_params`, rows are weighed by the sequence ratio pi_old(y)/pi_rollout(y).

        Only such a loss can train on completions another policy wrote with another tokenizer
        (`data.demonstrations: peers`, docs/methods/demonstrations.md), where token ratios do not exist.
        """
        return self.sequence_is and (self.sequence_is_when is None or self.sequence_is_when(knobs))


@dataclass(frozen=True)
class TermSpec:
    """An objective term (`algos/terms.py`): what it reads, which token weights, how it is normalised."""

    inputs: frozenset[str] = frozenset()  # `LossInputs` fields and `extras` names it reads
    weights: str = "loss_mask"  # the token-weight stream it sums over: the loss mask or an `extras` name
    denominator: str = "aggregation"  # "aggregation" (per token, the algorithm's aggregation over the loss
    # mask, shared with the pg loss), "tokens" (per token, / valid tokens) or "sequences" (per row, / rows)
    only_with_weights: bool = False  # a micro-batch without its weight stream in `extras` gets no such term
    follows_advantages: bool = False  # zero on rows whose advantages are 0 when the loss is `zero_at_zero_advantage`
    provided: frozenset[str] = frozenset()  # of `inputs`, those an input provider fills for this term
    # knobs of the term's `algo.terms` entry that configure what provides its inputs (not passed to the
    # function), with their defaults
    settings: Mapping[str, Any] = field(default_factory=dict)
    builds: Callable[..., Any] | None = None  # (**settings) -> an object built once per run for its providers
    check: Callable[..., str | None] | None = None  # (config, **knobs, **settings) -> why they do not fit, or None
    # [B] row flags its provider sets in `row_extras` -> the metric their batch share is logged as
    row_flags: Mapping[str, str] = field(default_factory=dict)
    # compares the rows of one group (a preference pair: `row_extras["pair"]`, `row_extras["chosen"]`): the
    # learner keeps a group's rows in one mini- and micro-batch
    pairwise: bool = False
    on_policy: bool = False  # its gradient is that of its objective only on the policy's own samples (rollouts)
    imitates: bool = False  # raises the likelihood of every row it trains (a pair's rejected reply would be one)

    def __post_init__(self):
        object.__setattr__(self, "inputs", frozenset(self.inputs))
        object.__setattr__(self, "provided", frozenset(self.provided))
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))
        object.__setattr__(self, "row_flags", MappingProxyType(dict(self.row_flags)))
        if self.denominator not in DENOMINATORS:
            raise ValueError(f"denominator {self.denominator!r} is not one of {sorted(DENOMINATORS)}")


DENOMINATORS = frozenset({"aggregation", "tokens", "sequences"})


@dataclass(frozen=True)
class ShaperSpec:
    """A reward or advantage transform (`algos/shapers.py`): which value it rewrites and what else it reads."""

    stage: str = "rewards"  # "rewards" ([B] sequence rewards), "token_rewards" ([B, T], after the outcome is
    # placed on the last token) or "advantages" ([B, T], after the estimator and the critic's targets)
    inputs: frozenset[str] = frozenset()  # `SHAPER_INPUTS` names or batch `extras` names it reads
    whole_batch: bool = False  # reads the whole batch at once (a batch consumed in chunks would change it)
    # (config, **knobs) -> why the knobs do not fit the run's settings, or None; run at config time
    check: Callable[..., str | None] | None = None

    def __post_init__(self):
        object.__setattr__(self, "inputs", frozenset(self.inputs))
        if self.stage not in STAGES:
            raise ValueError(f"stage {self.stage!r} is not one of {list(STAGES)}")


STAGES = ("rewards", "token_rewards", "advantages")  # the order `Algorithm.prepare` applies shapers in
