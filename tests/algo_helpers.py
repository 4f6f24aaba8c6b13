"""Shared builders of loss inputs and estimator calls for the algos unit tests."""
import math

import torch

from lmrl.algos import ADVANTAGES, LOSSES, LossInputs
from lmrl.algos.advantages import outcome_to_token_rewards


def token_inputs(log_ratio, adv, mask=None, entropy=None, rollout_log_ratio=None, **extras):
    """ρ = exp(log_ratio) with logp = 0 as the gradient leaf; rollout_log_ratio = old − rollout."""
    lr = torch.tensor(log_ratio, dtype=torch.float)
    logp = torch.zeros_like(lr, requires_grad=True)
    old = -lr
    a = torch.tensor(adv, dtype=torch.float)
    a = a.expand_as(lr) if a.dim() == 0 else (a.unsqueeze(1).expand_as(lr) if a.dim() == 1 else a)
    ex = {k: torch.tensor(v, dtype=torch.float) for k, v in extras.items()}
    if rollout_log_ratio is not None:
        ex["rollout_logp"] = old - torch.tensor(rollout_log_ratio, dtype=torch.float)
    m = torch.ones_like(lr) if mask is None else torch.tensor(mask, dtype=torch.float)
    ent = None if entropy is None else torch.tensor(entropy, dtype=torch.float)
    return logp, LossInputs(logp=logp, old_logp=old, advantages=a.clone(), mask=m, entropy=ent, extras=ex)


def rollout_inputs(log_ratio, adv, rollout_shift=None, mask=None, **extras):
    """logp = 0 is the gradient leaf; old = −log_ratio; rollout = −rollout_shift (default: old)."""
    lr = torch.tensor(log_ratio, dtype=torch.float)
    logp = torch.zeros_like(lr, requires_grad=True)
    a = torch.tensor(adv, dtype=torch.float)
    a = a.unsqueeze(1).expand_as(lr).clone() if a.dim() == 1 else a
    ex = {k: torch.as_tensor(v, dtype=torch.float) for k, v in extras.items()}
    ex["rollout_logp"] = -lr if rollout_shift is None else -torch.tensor(rollout_shift, dtype=torch.float)
    m = torch.ones_like(lr) if mask is None else torch.tensor(mask, dtype=torch.float)
    return logp, LossInputs(logp=logp, old_logp=-lr, advantages=a, mask=m, extras=ex)


def loss_inputs(logp, adv_values, mask=None, entropy=None, old_logp=None, **extras):
    """logp (and entropy, when given) are gradient leaves; old_logp defaults to a detached copy of logp."""
    lp = torch.tensor(logp, dtype=torch.float, requires_grad=True)
    a = torch.tensor(adv_values, dtype=torch.float)
    a = a.unsqueeze(1).expand_as(lp).clone() if a.dim() == 1 else a
    m = torch.ones_like(lp) if mask is None else torch.tensor(mask, dtype=torch.float)
    ent = None if entropy is None else torch.tensor(entropy, dtype=torch.float, requires_grad=True)
    old = lp.detach().clone() if old_logp is None else torch.tensor(old_logp, dtype=torch.float)
    ex = {k: torch.tensor(v, dtype=torch.float) for k, v in extras.items()}
    return lp, ent, LossInputs(logp=lp, old_logp=old, advantages=a, mask=m, entropy=ent, extras=ex)


def logs(values):
    return [[math.log(v) for v in row] for row in values]


def run_loss(name, x, logp, **knobs):
    """Calls the LOSSES entry, backpropagates the summed loss; returns (loss, logp.grad, metrics)."""
    loss, metrics = LOSSES.get(name)(x, **knobs)
    loss.sum().backward()
    return loss.detach(), logp.grad, metrics


def run_estimator(name, rewards, groups=None, width=3, mask=None, **kw):
    """Token advantages of one ADVANTAGES entry for outcome rewards; groups default to a single group."""
    r = torch.tensor(rewards, dtype=torch.float)
    mask = torch.ones(len(rewards), width) if mask is None else mask
    g = torch.tensor(groups or [0] * len(rewards))
    return ADVANTAGES.get(name)(outcome_to_token_rewards(r, mask), g, mask, **kw)


def adv(name, rewards, groups, width=2, mask=None, **kw):
    """run_estimator with the groups spelled out and two tokens per row by default."""
    return run_estimator(name, rewards, groups, width=width, mask=mask, **kw)


def seq(adv):
    """The per-sequence value of an advantage that is broadcast to every token."""
    assert torch.allclose(adv, adv[:, :1].expand_as(adv))
    return adv[:, 0].tolist()
