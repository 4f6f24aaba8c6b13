"""Advantage estimators that differ in their baseline: GRPO, Dr.GRPO, RLOO, REINFORCE++, XGRPO, PRPO.

Signature of every estimator in `ADVANTAGES`: `(token_rewards [B,T], group_index [B], mask [B,T],
**knobs) -> advantages [B,T]`. `token_rewards` holds the outcome reward at each sequence's last
generated token (plus any per-token terms such as a KL penalty folded into the reward); group
estimators use its row sum, which is every sample's real reward, also for a row without a generated
token (`outcome_to_token_rewards`). Per-sample inputs beyond the reward arrive as keyword tensors or numbers
(docs/methods/inputs.md); a required one that is missing raises a ValueError naming it. Each
estimator declares at registration what it needs and whether it compares the samples of a group
(`declarations.py`). Formulas: docs/methods/{grpo,dr_grpo,rloo,reinforce_pp,xgrpo,prpo}.md.
"""
from __future__ import annotations

import torch

from lmrl.algos.declarations import AdvantageSpec
from lmrl.registry import Registry
from lmrl.stats import group_mean_std, group_normalise

ADVANTAGES: Registry = Registry("advantage estimator", declares=AdvantageSpec)


def required(name: str, value):
    """`value`, or a ValueError naming the missing input."""
    if value is None:
        raise ValueError(f"this advantage estimator needs the per-sample input {name!r}")
    return value


def sequence_scores(token_rewards: torch.Tensor) -> torch.Tensor:
    """[B] each sequence's reward: the row sum of its token rewards."""
    return token_rewards.sum(dim=1)


def to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] per-sequence advantages broadcast to every valid token [B,T]."""
    return adv.unsqueeze(1) * mask


def outcome_to_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward on its last valid token.

    A row without a valid token (a multi-turn episode whose every turn is masked, a turn cut to 0
    tokens) keeps its reward on its last position, outside the mask: the row sum stays the sample's
    reward, so group baselines count it as verl and TRL do, while no token of it gets an advantage
    (estimators multiply by the mask; recursions over tokens read rewards on valid positions only).
    """
    token_rewards = torch.zeros_like(mask, dtype=torch.float)
    if mask.shape[1] == 0:
        return token_rewards
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    last = torch.where(last >= 0, last, torch.full_like(last, mask.shape[1] - 1))
    token_rewards[torch.arange(mask.shape[0], device=mask.device), last] = rewards.float()
    return token_rewards


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over generated positions: G_t = r_t + γ·G_t', t' the row's next generated position.

    Positions outside the mask (an environment's observation between two policy turns, padding)
    neither discount nor break the return and their rewards are not read: the return of a turn
    includes the rewards of the later turns, as in verl's GAE over the response mask.
    """
    on = mask > 0
    returns = torch.zeros_like(token_rewards, dtype=torch.float)
    running = torch.zeros(token_rewards.shape[0], device=token_rewards.device)
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(on[:, t], token_rewards[:, t].float() + gamma * running, running)
        returns[:, t] = running
    return returns * mask


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten over all valid tokens of the batch with the unbiased variance."""
    valid = values[mask > 0]
    mean = valid.mean()
    var = valid.var(unbiased=True) if valid.numel() > 1 else torch.zeros((), dtype=values.dtype)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def whiten_by_task(values: torch.Tensor, mask: torch.Tensor, task_index: torch.Tensor | None) -> torch.Tensor:
    """`masked_whiten` over each task's valid tokens apart (`task_index` [B]; None: one task)."""
    if task_index is None:
        return masked_whiten(values, mask)
    out = torch.zeros_like(values, dtype=torch.float)
    for task in torch.unique(task_index):
        rows = task_index == task
        out[rows] = masked_whiten(values[rows], mask[rows])
    return out


def _not_task_std(knobs) -> bool:
    return not knobs.get("task_std", False)


@ADVANTAGES.register("grpo", "GRPO: (r - group mean) / (group std + eps), broadcast to tokens; task_std: / the std "
                     "of the task's rewards in the batch", group_relative=True, group_local=True,
                     group_local_when=_not_task_std)
def grpo(token_rewards, group_index, mask, eps: float = 1e-6, norm_by_std: bool = True, task_std: bool = False,
         task_index=None, **_):
    """`task_std` (docs/mixtures.md): the group-centred rewards divided by the unbiased std of all rewards of
    the row's task in the batch (`task_index`, the mixture's tasks; None: the batch is one task) instead of
    the group's, so a task with a small reward scale is not blown up group by group."""
    scores = token_rewards.sum(dim=1)
    mean, std = group_mean_std(scores, group_index)
    if task_std:
        tasks = task_index if task_index is not None else torch.zeros_like(group_index)
        _, std = group_mean_std(scores, tasks)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return adv.unsqueeze(1) * mask


@ADVANTAGES.register("dr_grpo", "Dr.GRPO: r - group mean, no std normalisation", group_relative=True,
                     group_local=True)
def dr_grpo(token_rewards, group_index, mask, **_):
    return grpo(token_rewards, group_index, mask, norm_by_std=False)


@ADVANTAGES.register("rloo", "RLOO: r_i minus the mean of the other samples of its group", group_relative=True,
                     group_local=True)
def rloo(token_rewards, group_index, mask, **_):
    scores = token_rewards.sum(dim=1)
    mean, _ = group_mean_std(scores, group_index)
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n = counts[inverse].float()
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return (factor * (scores - mean)).unsqueeze(1) * mask


@ADVANTAGES.register("reinforce_pp", "REINFORCE++: discounted return-to-go, whitened over the batch's tokens "
                     "(over each task's with whiten_per_task)")
def reinforce_pp(token_rewards, group_index, mask, gamma: float = 1.0, whiten_per_task: bool = False,
                 task_index=None, **_):
    returns = discounted_returns(token_rewards, mask, gamma)
    return whiten_by_task(returns, mask, task_index) if whiten_per_task else masked_whiten(returns, mask)


@ADVANTAGES.register(
    "reinforce_pp_baseline", "REINFORCE++ with a group-mean baseline, whitened over the batch's tokens (over each "
    "task's with whiten_per_task)", group_relative=True,
)
def reinforce_pp_baseline(token_rewards, group_index, mask, whiten_per_task: bool = False, task_index=None, **_):
    scores = token_rewards.sum(dim=1)
    mean, _ = group_mean_std(scores, group_index)
    centred = (scores - mean).unsqueeze(1) * mask
    return whiten_by_task(centred, mask, task_index) if whiten_per_task else masked_whiten(centred, mask)


@ADVANTAGES.register("xgrpo", "XGRPO: GRPO on own rollouts with the baseline pooled over own and peer rewards",
                     requires={"peer_rewards"}, group_relative=True)
def xgrpo(token_rewards, group_index, mask, peer_rewards=None, eps: float = 1e-6, **_):
    """XGRPO (Mutual RL, arXiv 2605.07244; docs/methods/xgrpo.md) — confidence low: reconstruction from the abstract.

    Heterogeneous policies train side by side; only own rollouts carry gradient, but the baseline
    uses everyone's rewards for the prompt: A_i = (r_i − mean(R_self ∪ R_peer)) / (std(R_self ∪
    R_peer) + eps), unbiased std. `peer_rewards` [B, P]: the peer rewards of row i's prompt
    (every row of a group carries the same values; the group's first row is read). NaN entries
    are absent peers, so groups can have different peer counts. A pool of one sample gets GRPO's
    singleton convention (mean 0, std 1).
    """
    peers = required("peer_rewards", peer_rewards).to(token_rewards.dtype).reshape(len(group_index), -1)
    scores = sequence_scores(token_rewards)
    groups, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    rows = torch.arange(len(group_index), device=group_index.device)
    first = torch.zeros(len(groups), dtype=rows.dtype, device=rows.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin", include_self=False)
    peer = peers[first]  # [G, P]
    present = torch.isfinite(peer)
    n = counts.to(scores.dtype) + present.sum(dim=1)
    total = torch.zeros(len(groups), dtype=scores.dtype).index_add_(0, inverse, scores)
    mean = (total + torch.where(present, peer, 0.0).sum(dim=1)) / n
    own_sq = torch.zeros(len(groups), dtype=scores.dtype).index_add_(0, inverse, (scores - mean[inverse]) ** 2)
    peer_sq = torch.where(present, (peer - mean.unsqueeze(1)) ** 2, 0.0).sum(dim=1)
    std = torch.sqrt((own_sq + peer_sq) / (n - 1).clamp(min=1))
    single = n == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return to_tokens((scores - mean[inverse]) / (std[inverse] + eps), mask)


@ADVANTAGES.register("prpo", "PRPO: GRPO within each column permutation plus lam x GRPO of permutation means",
                     requires={"perm_index"}, group_relative=True)
def prpo(token_rewards, group_index, mask, perm_index=None, lam: float = 1.0, eps: float = 1e-6, **_):
    """PRPO (TabR1, arXiv 2510.17385; docs/methods/prpo.md) — confidence low-medium (two levels explicit;
    their additive combination is a reconstruction).

    Column permutations of a table are label-preserving, so they densify a sparse reward:
    A_{m,g} = A^in + λ·A^out with A^in = GRPO within (sample, permutation m) and A^out_m = GRPO of
    the permutation means r̄_m across the sample's permutations. `group_index` = the sample (table),
    `perm_index` [B] = the permutation id within it. With a single permutation A^out = 0 (PRPO
    reduces to GRPO); a singleton (sample, permutation) cell follows GRPO's convention in A^in.
    """
    perms = required("perm_index", perm_index)
    scores = sequence_scores(token_rewards)
    cells, cell_of_row, cell_size = torch.unique(torch.stack([group_index, perms], dim=1), dim=0,
                                                 return_inverse=True, return_counts=True)
    a_in = group_normalise(scores, cell_of_row, eps)
    cell_mean = torch.zeros(len(cells), dtype=scores.dtype).index_add_(0, cell_of_row, scores) / cell_size
    _, sample_slot, perms_per_sample = torch.unique(cells[:, 0], return_inverse=True, return_counts=True)
    a_out = group_normalise(cell_mean, cells[:, 0], eps)
    a_out = torch.where(perms_per_sample[sample_slot] > 1, a_out, torch.zeros_like(a_out))
    return to_tokens(a_in + lam * a_out[cell_of_row], mask)
