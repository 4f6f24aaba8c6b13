"""What each step does for the run's roles (docs/roles.md): score what they sampled, train them, measure drift.

After the policy's rollouts, `collect_roles` takes each trained role's samples of the step (recorded by its
client as its engine produced them), scores them with the role's own reward, and returns the groups of roles
that play with the policy's weights (self-play), which join the policy's batch. After the policy's update,
`learn_roles` trains every other role on its groups by its own objective (`loops.collect.learn`, the policy's
one update path), after measuring how far it has moved from its start: `role/<name>/drift/kl`, the mean k3
estimate of KL(role ‖ its initial weights) on its samples, which `trainer.stop_when` can watch (a learning
simulator or judge that drifts away from its frozen start is the first sign of collusion).

A role trains only in the steps of its `trainer.train_steps` (alternating phases: an instructor, then its
follower); in the others it only answers, its samples are still scored and its drift still measured
(`role/<name>/trains` is 0). An environment's own collusion probes reach the same family through the role's
rows: numbers under `row["drift"]` (e.g. a frozen reference's success on the role's instructions) are averaged
over the role's samples as `role/<name>/drift/<key>`.
"""
from __future__ import annotations

import contextlib

import torch

from lmrl.envs import rollout
from lmrl.loops.collect import batch_inputs, learn, rollout_metrics
from lmrl.loops.batching import to_batch
from lmrl.loops.role_setup import Role, SwitchedEngine
from lmrl.types import Group


def collect_roles(roles: dict[str, Role], step: int, rows: list[dict], environment, group_size: int
                  ) -> tuple[list[Group], dict[str, float]]:
    """Score each trained role's samples of step `step` (what it answered, and for a role with `rollouts: true`, its own
    `group_size` rollouts of each of the step's `rows` in `environment`): the groups that join the policy's
    update, and the roles' metrics (`role/<name>/…`). A role's reward errors above its `reward.max_error_rate` stop
    the run."""
    joined, metrics = [], {}
    for name, role in roles.items():
        if not role.spec.trains:
            continue
        groups = role.client.take() + (own_rollouts(role, rows, environment, group_size) if role.spec.rollouts else [])
        trains = role.cfg.trainer.trains_at(step)
        role.pending = groups
        own = {"samples": float(sum(len(g.samples) for g in groups)), "trains": float(trains)}
        if groups:
            scored = role.scorer.score(groups)
            role.scorer.check_error_rate(scored, step)
            own.update(scored)
            own.update(rollout_metrics(groups, role.cfg.reward.accuracy_component))
            own.update(probes(groups))
        metrics.update({f"role/{name}/{k}": v for k, v in own.items()})
        if role.joins_policy:
            joined += groups if trains else []
    return joined, metrics


def own_rollouts(role: Role, rows: list[dict], environment, group_size: int) -> list[Group]:
    """The role's own rollouts of `rows`, sampled by its engine at its temperature and reply length."""
    with role.switch():
        played = rollout(role.engine, role.tokenizer, rows, group_size, role.client.params, role.generator,
                         environment)
    for group in played:
        group.uid = f"{role.name}/{group.uid}"
        for sample in group.samples:
            sample.role = role.name
    return played


def probes(groups: list[Group]) -> dict[str, float]:
    """`drift/<key>`: the mean over the role's samples of each number its rows hold under `drift`."""
    values: dict[str, list[float]] = {}
    for group in groups:
        for sample in group.samples:
            for key, value in (sample.row.get("drift") or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(float(value))
    return {f"drift/{key}": sum(v) / len(v) for key, v in values.items()}


def learn_roles(roles: dict[str, Role], step: int) -> dict[str, float]:
    """Train each role with weights of its own on the groups `collect_roles` took; its engine then generates as
    version `step`. A role with no scored sample this step skips its update (`role/<name>/skipped_updates`), a
    role outside its `train_steps` rests (its drift measured all the same, on the step's samples)."""
    metrics = {}
    for name, role in roles.items():
        if role.learner is None:
            continue
        trains = role.cfg.trainer.trains_at(step)
        groups, role.pending = role.pending, []
        with role.switch():
            own = drift(role, groups, step)
            learned = learn(role, groups, step) if groups and trains else None
        if trains:
            own.update(learned if learned is not None else {"skipped_updates": 1.0})
        if learned is not None:
            role.engine.update_weights(None, step)
        metrics.update({f"role/{name}/{k}": v for k, v in own.items()})
    return metrics


def drift(role: Role, groups: list[Group], step: int) -> dict[str, float]:
    """`drift/kl`: the mean over the role's sampled tokens of the k3 estimate of KL(role ‖ its initial weights),
    exp(d) − d − 1 with d = log p_initial − log p_role (the behaviour log-probs: the role sampled them)."""
    batch = to_batch(batch_inputs(role, groups, step), role.engine.pad_token_id) if groups else None
    if batch is None:
        return {}
    initial = role.learner.logprobs(batch, reference=True)
    mask = batch.completion_mask
    d = (initial - batch.behaviour_logprobs) * mask
    k3 = (torch.exp(d) - d - 1.0) * mask
    return {"drift/kl": float(k3.sum() / mask.sum().clamp(min=1.0))}


def policy_turn(engine):
    """The context the policy's update runs in: its own adapter in place when roles share its base."""
    return engine.switch() if isinstance(engine, SwitchedEngine) else contextlib.nullcontext()
