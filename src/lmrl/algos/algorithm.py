"""An Algorithm is a named bundle of registry choices, built from `AlgoConfig`.

It turns a rollout batch into per-token advantages (`prepare`) and defines the objective the
learner minimises (`objective`). The learner only sees these methods and what the algorithm
declares it needs (`prepare_outputs`: model outputs before `prepare`; `needs`: model outputs in the
training forward; `critic`: a value head; `score_labels`: a reward model's head), never the
names. What the configured estimator and loss need and guarantee is read from their declarations
(`ADVANTAGES.spec`, `LOSSES.spec`). Methods with state between steps (`algos/state.py`) are driven
through `after_update` and `replays`. The objective is the sum of the registered terms the config
switches on (`algos/terms.py`: policy gradient, KL, distillation under a privileged context,
entropy, demonstration NLL, value, and any the entries of `algo.terms`); the algorithm composes them
and names none. Rewards and advantages pass through the registered shapers of the config
(`algos/shapers.py`: KL in the reward, and the entries of `algo.shaping` such as overlong shaping or
cost-aware draws), applied by stage and named nowhere here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmrl.algos.advantages import ADVANTAGES, outcome_to_token_rewards
from lmrl.algos.aggregation import AggScale
from lmrl.algos.critic import explained_variance
from lmrl.algos.gather import SCORE_HEAD_LABELS, gather, model_outputs_for, optional_inputs
from lmrl.algos.losses import LOSSES, LossInputs
from lmrl.algos.guards import Guard
from lmrl.algos.state import build_state
from lmrl.algos.shapers import active_shapers, apply_shapers, shaper_inputs
from lmrl.algos.terms import TERMS, active_terms, compose, term_inputs
from lmrl.config import AlgoConfig
from lmrl.types import Batch


def task_advantage_shares(batch: Batch) -> dict[str, float]:
    """Each mixture task's share of the policy gradient, `task/<name>/advantage_share`: Σ|A| over its rows'
    valid tokens ÷ the batch's (the tasks of the `task_index` input; nothing for a run of one task)."""
    names, index = batch.context.get("task_names", []), batch.row_extras.get("task_index")
    if len(names) < 2 or index is None:
        return {}
    mass = (batch.advantages.abs() * (batch.completion_mask > 0)).sum(dim=1)
    total = float(mass.sum())
    return {f"task/{name}/advantage_share": float(mass[index == i].sum()) / total if total > 0 else 0.0
            for i, name in enumerate(names)}


@dataclass
class Algorithm:
    """`policy_gradient=False`: the batches are trained by their listed terms alone (`batches.source`: an offline
    dataset's rows, which bring no rewards, or preference pairs of rollouts): no advantages, no policy-gradient
    loss; the objective is the KL and entropy terms and `algo.terms`."""

    cfg: AlgoConfig
    max_new_tokens: int
    policy_gradient: bool = True

    def __post_init__(self):
        self.advantage_fn = ADVANTAGES.get(self.cfg.advantage)
        self.advantage_spec = ADVANTAGES.spec(self.cfg.advantage if self.policy_gradient else "grpo")
        self.loss_spec = LOSSES.spec(self.cfg.loss if self.policy_gradient else "ppo_clip")
        rejects = self.policy_gradient and self.cfg.rejected_tokens == "drop"
        self.token_mask_fn = self.loss_spec.token_mask if rejects else None
        advantage_state, self.advantage_knobs = build_state(self.advantage_spec, self.cfg.advantage_params)
        loss_state, self.loss_knobs = build_state(self.loss_spec, self.cfg.loss_params)
        self.states = {name: st for name, st in (("advantage", advantage_state), ("loss", loss_state)) if st is not None}
        if self.cfg.guards.enabled:  # failure-mode guard (algos/guards.py), checkpointed like the method states
            self.states["guard"] = Guard(self.cfg.guards)
        self.terms = active_terms(self.cfg, self.policy_gradient)
        # what a term's input providers use, built once per run (e.g. the distill term's teacher context)
        self.built = {t.name: TERMS.spec(t.name).builds(**t.settings) for t in self.terms if TERMS.spec(t.name).builds}
        self.term_inputs = term_inputs(self.terms)
        self.shapers = active_shapers(self.cfg)
        self.shaper_inputs = shaper_inputs(self.shapers)

    @property
    def requires(self) -> set[str]:
        """Per-sample inputs the estimator and the loss declare (see `algos/gather.py`), and those the terms
        declare an input provider fills (`TermSpec.provided`)."""
        provided = set().union(*(TERMS.spec(t.name).provided for t in self.terms))
        return set(self.advantage_spec.requires | self.loss_spec.requires | provided)

    def term(self, name: str):
        """The active term `name` (its knobs and settings), or None when the objective has no such term."""
        return next((t for t in self.terms if t.name == name), None)

    @property
    def critic(self) -> bool:
        """A value head is trained (its values feed the estimator, its loss joins the objective)."""
        return self.cfg.critic and self.policy_gradient

    @property
    def pairwise(self) -> bool:
        """A term compares the rows of one group (`TermSpec.pairwise`): the learner keeps groups whole."""
        return any(TERMS.spec(t.name).pairwise for t in self.terms)

    @property
    def prepare_outputs(self) -> set[str]:
        """Model outputs the learner computes, without gradient, before `prepare`."""
        return model_outputs_for(self.advantage_spec.requires)

    @property
    def needs(self) -> set[str]:
        """Model outputs the learner adds to `LossInputs.extras` in the training forward."""
        return (self.term_inputs | self.loss_spec.requires) & {"values", "hidden", "score", "token_scores", "logits"}

    @property
    def score_labels(self) -> int:
        """The score head's number of labels (0: none is trained): 1 for a scalar reward model, whose "score" of
        each row's last token a term reads, 2 (bad, good) for a process reward model's step head, whose
        "token_scores" of each generated token a term reads."""
        read = sorted(self.needs & SCORE_HEAD_LABELS.keys())
        if len(read) > 1:
            raise ValueError(f"the terms read both {read[0]!r} and {read[1]!r}: one score head serves one of them")
        return SCORE_HEAD_LABELS[read[0]] if read else 0

    @property
    def hidden_layer(self) -> int:
        """Which hidden states "hidden" means (index into the decoder's hidden states; -1: the last)."""
        return self.advantage_spec.hidden_layer

    @property
    def needs_old_logp(self) -> bool:
        """Old log-probs must exist before the update (the loss mask depends on them)."""
        return self.token_mask_fn is not None

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0 or "ref_logp" in self.requires | self.term_inputs | self.shaper_inputs

    @property
    def needs_entropy_grad(self) -> bool:
        """Exact per-token entropy is computed when the bonus or the loss itself uses it."""
        return "entropy" in self.term_inputs or self.loss_spec.needs_entropy

    def inert_rows(self, batch: Batch) -> torch.Tensor:
        """[B] bool: rows whose loss and gradient are exactly zero, so the learner may skip them.

        True where every advantage of the row is 0, the loss is declared zero there
        (`zero_at_zero_advantage`: row-local and proportional to A), and no other term still pulls on
        the row: a term over the loss mask (KL, entropy, value) leaves no row inert, a term over its
        own weights (demonstration rows, distilled tokens) only the rows without them. Denominators stay
        those of the whole batch (`scale`).
        """
        rows = batch.completion_mask.shape[0]
        inert = self._inert_by_advantage(batch)
        for term in self.terms:
            spec = TERMS.spec(term.name)
            if spec.follows_advantages:
                continue
            if spec.weights == "loss_mask":
                return torch.zeros(rows, dtype=torch.bool)
            weights = batch.row_extras.get(spec.weights, batch.extras.get(spec.weights))
            if weights is not None:
                inert = inert & (weights.reshape(rows, -1).sum(1) == 0)
        return inert

    def _inert_by_advantage(self, batch: Batch) -> torch.Tensor:
        rows = batch.completion_mask.shape[0]
        if not self.policy_gradient:  # no policy-gradient term: only the other terms pull on a row
            return torch.ones(rows, dtype=torch.bool)
        if not self.loss_spec.zero_at_zero_advantage or batch.advantages is None:
            return torch.zeros(rows, dtype=torch.bool)
        return ((batch.advantages != 0) & (batch.completion_mask > 0)).sum(1) == 0

    def scale(self, mask: torch.Tensor) -> AggScale:
        return AggScale.of(mask, self.cfg.horizon or self.max_new_tokens)

    def _keep(self, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        knobs = {"eps_low": self.cfg.eps_low, "eps_high": self.cfg.eps_high, **self.loss_knobs}
        return self.token_mask_fn(old_logp, rollout_logp, mask, **knobs).to(mask.dtype)

    def aggregation_mask(self, batch: Batch) -> torch.Tensor:
        """[B,T] mask the objective aggregates over: the completion mask, less tokens the loss rejects.

        Needs `extras["old_logp"]` when the loss rejects tokens (`needs_old_logp`). The learner builds
        each mini-batch's denominators (`scale`) from it before any micro-batch runs.
        """
        mask = batch.completion_mask
        if self.token_mask_fn is None:
            return mask
        return mask * self._keep(batch.extras["old_logp"], batch.extras["rollout_logp"], mask)

    def prepare(self, batch: Batch) -> dict[str, float]:
        """Shape rewards and fill `batch.advantages` (uses `batch.extras['ref_logp']` if present).

        Stateful methods first put their inputs into the batch (`before_prepare`)."""
        for state in self.states.values():
            if hasattr(state, "before_prepare"):
                state.before_prepare(batch)
        metrics = self._prepare(batch) if self.policy_gradient else {}
        if not self.policy_gradient:
            batch.advantages = torch.zeros_like(batch.completion_mask)
        for term in self.terms:  # the share of rows each term's provider flagged (`TermSpec.row_flags`)
            for flag, metric in TERMS.spec(term.name).row_flags.items():
                if flag in batch.row_extras:
                    metrics[metric] = float(batch.row_extras[flag].mean())
        return metrics

    def after_update(self, batch: Batch, metrics: dict[str, float]) -> dict[str, float]:
        """Stateful methods learn from the finished update (e.g. a controller reads a metric)."""
        out: dict[str, float] = {}
        for state in self.states.values():
            if hasattr(state, "after_update"):
                out.update(state.after_update(batch, metrics))
        return out

    def replays(self, batch: Batch) -> list[Batch]:
        """Prepared batches for extra updates after `batch`'s (e.g. PIPO's replay of the previous batch)."""
        out = []
        for state in self.states.values():
            extra = state.replay(batch) if hasattr(state, "replay") else None
            if extra is not None:
                self._prepare(extra)
                out.append(extra)
        return out

    def state_dict(self) -> dict:
        return {name: {"kind": type(st).__name__, "state": st.state_dict()}
                for name, st in self.states.items() if hasattr(st, "state_dict")}

    def load_state_dict(self, state: dict) -> None:
        """Restore the states this configuration has; a saved state of another method is ignored."""
        for name, saved in state.items():
            mine = self.states.get(name)
            if mine is not None and isinstance(saved, dict) and type(mine).__name__ == saved.get("kind"):
                mine.load_state_dict(saved["state"])

    def _prepare(self, batch: Batch) -> dict[str, float]:
        """Advantages of the batch; rows outside the estimate (`row_extras["in_advantage"]` False, e.g.
        rescue demonstrations) are left out of it and get A = 0. Then the loss's statistics of the
        whole batch, if it declares any (`LossSpec.batch_statistics`), go into `batch.context`, which
        every micro-batch hands to the loss in `extras`."""
        in_advantage = batch.row_extras.get("in_advantage")
        if in_advantage is None or bool(in_advantage.all()):
            metrics = self._estimate(batch)
        else:
            sampled = in_advantage.nonzero().flatten().tolist()
            part = batch.select(sampled)
            metrics = self._estimate(part)
            batch.advantages = torch.zeros_like(batch.completion_mask)
            batch.advantages[sampled, : part.advantages.shape[1]] = part.advantages
            batch.extras.setdefault("rollout_logp", batch.behaviour_logprobs)
        if self.loss_spec.reads_whole_batch(self.loss_knobs):
            batch.context.update(self.loss_spec.batch_statistics(
                batch.extras["rollout_logp"], batch.advantages, batch.completion_mask, **self.loss_knobs))
        return metrics

    def _estimate(self, batch: Batch) -> dict[str, float]:
        mask = batch.completion_mask
        rewards, metrics = apply_shapers(self.shapers, "rewards", batch.sequence_rewards.clone(),
                                         self._shaper_inputs(batch))
        batch.extras.setdefault("rollout_logp", batch.behaviour_logprobs)
        token_rewards, shaped = apply_shapers(self.shapers, "token_rewards", outcome_to_token_rewards(rewards, mask),
                                              self._shaper_inputs(batch))
        metrics.update(shaped)
        knobs = self.advantage_knobs
        required = self.advantage_spec.requires
        inputs = {**optional_inputs(self.advantage_fn, required, batch, knobs), **gather(required, batch)}
        batch.advantages = self.advantage_fn(token_rewards, batch.group_index, mask, **inputs, **knobs)
        if self.critic:
            metrics.update(self._critic_targets(batch, token_rewards))
        batch.advantages, shaped = apply_shapers(self.shapers, "advantages", batch.advantages,
                                                   self._shaper_inputs(batch))
        metrics.update(shaped)
        for name in self.prepare_outputs - {"values"}:
            batch.extras.pop(name, None)  # consumed; keeps micro-batches light
        valid = batch.advantages[mask > 0]
        metrics["advantage/mean"] = float(valid.mean()) if valid.numel() else 0.0
        metrics["advantage/abs_mean"] = float(valid.abs().mean()) if valid.numel() else 0.0
        metrics.update(task_advantage_shares(batch))
        return metrics

    def _shaper_inputs(self, batch: Batch) -> dict:
        """What a shaper may read (`algos/shapers.py` SHAPER_INPUTS, and the batch's extras as they are now)."""
        return {**batch.extras, "mask": batch.completion_mask, "behaviour_logp": batch.behaviour_logprobs,
                "max_new_tokens": self.max_new_tokens, "group_index": batch.group_index}

    def _critic_targets(self, batch: Batch, token_rewards: torch.Tensor) -> dict[str, float]:
        """Value targets of a critic-based estimator; the prepare-time values become `old_values`."""
        values = batch.extras.pop("values")
        mask = batch.completion_mask
        returns = self.advantage_spec.value_targets(token_rewards, values, mask, **self.advantage_knobs)
        batch.extras.update(old_values=values, returns=returns)
        valid = mask > 0
        return {"critic/explained_variance": explained_variance(returns, values, mask),
                "critic/values_mean": float(values[valid].mean()) if valid.any() else 0.0,
                "critic/returns_mean": float(returns[valid].mean()) if valid.any() else 0.0}

    def objective(self, inputs: LossInputs, scale: AggScale) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss of one micro-batch, normalised by batch-level denominators: Σ coef · term (`algos/terms.py`).

        Aggregates over `inputs.mask` less the tokens the loss rejects (see `aggregation_mask`); the
        denominators in `scale` were computed from the same mask over the whole mini-batch.
        """
        mask = inputs.mask
        if self.token_mask_fn is not None:
            mask = mask * self._keep(inputs.old_logp, inputs.extras["rollout_logp"], mask)
        total, metrics = compose(self.terms, inputs, mask, scale, self.cfg.aggregation)
        guard = self.states.get("guard")
        if guard is not None and "rollout_logp" in inputs.extras:
            metrics.update(guard.token_metrics(inputs.logp, inputs.extras["rollout_logp"], inputs.mask))
        return total, metrics
