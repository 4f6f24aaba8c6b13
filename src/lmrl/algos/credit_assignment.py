"""Advantage estimators that redistribute credit: over tokens (EqLen, P-GRPO, ResRL), over samples (HARGO)
or over the turns of multi-turn episodes (`turn_discounted`, docs/environments.md).

EqLen, P-GRPO and ResRL take any registered estimator's advantages (`base`, GRPO by default; the
remaining knobs go to it) and reweight them per token: by an equal-length cut of paired responses,
by pointwise mutual information with the evidence, or by how far a negative token's hidden state
lies from the positives' subspace. HARGO boosts GRPO advantages in informative groups where the
reference model is unsure and reweights the samples of each group. Formulas and deviations:
docs/methods/{eqlen,p_grpo,resrl,hargo}.md.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lmrl.algos.advantages import ADVANTAGES, required, sequence_scores, to_tokens
from lmrl.stats import group_mean_std, group_normalise, group_slots

# --- EqLen -------------------------------------------------------------------------------------


def default_pairs(group_index: torch.Tensor) -> torch.Tensor:
    """Pair id per row: consecutive rows of a group are the two tracks (rows 0–1, 2–3, …)."""
    same = group_index.unsqueeze(0) == group_index.unsqueeze(1)
    rank = torch.tril(same, diagonal=-1).sum(dim=1)
    return torch.unique(torch.stack([group_index, rank // 2], dim=1), dim=0, return_inverse=True)[1]


def eqlen_mask(mask: torch.Tensor, pair_index: torch.Tensor) -> torch.Tensor:
    """Keep each row's first ℓ valid tokens, ℓ = the shortest length among rows sharing its pair id."""
    lengths = mask.sum(dim=1)
    pairs, inverse = torch.unique(pair_index, return_inverse=True)
    shortest = torch.zeros(len(pairs), dtype=lengths.dtype)
    shortest = shortest.scatter_reduce(0, inverse, lengths, reduce="amin", include_self=False)
    return mask * (torch.cumsum(mask, dim=1) <= shortest[inverse].unsqueeze(1))


@ADVANTAGES.register("eqlen", "EqLen: a base estimator's advantages on equal-length segments of paired responses",
                     group_relative=True)
def eqlen(token_rewards, group_index, mask, base: str = "grpo", pair_index=None, **knobs):
    """EqLen (arXiv 2604.17328; docs/methods/eqlen.md) — confidence low: reconstruction from the abstract.

    Responses come in pairs (dual tracks); the comparison unit is the first ℓ tokens of both,
    ℓ = the shorter length, and the longer track's tail gets no advantage. The advantage itself
    is any registered estimator (`base`, given the remaining knobs) on the full-response rewards.
    `pair_index` [B] (optional): pair id per row; default pairs consecutive rows of each group.
    """
    if base == "eqlen":
        raise ValueError("eqlen needs a different base estimator")
    pairs = default_pairs(group_index) if pair_index is None else pair_index
    adv = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    return adv * eqlen_mask(mask, pairs)


# --- P-GRPO ------------------------------------------------------------------------------------


def pmi_token_weights(pmi: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w_t = softmax over the row's valid tokens of PMI, times the row's length (mean weight 1)."""
    logits = torch.where(mask > 0, pmi.float(), -math.inf)
    safe = torch.where(mask.sum(dim=1, keepdim=True) > 0, logits, torch.zeros_like(logits))
    return torch.softmax(safe, dim=1) * mask.sum(dim=1, keepdim=True) * mask


@ADVANTAGES.register("p_grpo", "P-GRPO: base advantage reweighted per token by PMI, phased in over ramp_steps",
                     requires={"pmi"}, group_relative=True)
def p_grpo(token_rewards, group_index, mask, pmi=None, step: float = 0, ramp_steps: float = 0,
           base: str = "grpo", **knobs):
    """P-GRPO (EmoAgent-R1; docs/methods/p_grpo.md) — confidence low: reconstruction from the abstract.

    Token credit from pointwise mutual information with the evidence, PMI_t = log p(y_t|x, y<t) −
    log p(y_t|x⁻, y<t) (x⁻ drops the evidence; one extra forward pass). A_{i,t} = A_i·(1 +
    λ(s)(w_t − 1)), λ(s) = min(1, s/S) with S = `ramp_steps` (S ≤ 0: λ = 1 from the start).
    `pmi` [B, T] aligned with the mask; A_i from the `base` estimator.
    """
    weights = pmi_token_weights(required("pmi", pmi), mask)
    lam = min(1.0, step / ramp_steps) if ramp_steps > 0 else 1.0
    adv = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    return adv * (1 + lam * (weights - 1)) * mask


# --- HARGO -------------------------------------------------------------------------------------


def sequence_confidence(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """c_i = exp(mean of logp over the row's valid tokens): the geometric-mean token probability [B]."""
    mask = mask.to(logp.dtype)
    return torch.exp((logp * mask).sum(1) / mask.sum(1).clamp(min=1))


def hargo_modulate(advantages: torch.Tensor, discrimination: torch.Tensor | float, confidence: torch.Tensor,
                   lam: float = 1.0) -> torch.Tensor:
    """Ã_i = A_i·(1 + λ·D_g·(1 − c_i))."""
    return advantages * (1 + lam * discrimination * (1 - confidence))


def group_softmax_weights(scores: torch.Tensor, group_index: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """w_i = G_g·softmax over the row's group of scores/T: weights of mean 1 within each group."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    inverse, counts = group_slots(group_index)
    z = scores / temperature
    top = torch.full((len(counts),), float("-inf"), dtype=z.dtype).scatter_reduce(0, inverse, z, reduce="amax")
    e = torch.exp(z - top[inverse])
    total = torch.zeros(len(counts), dtype=z.dtype).index_add_(0, inverse, e)
    return counts[inverse].to(z.dtype) * e / total[inverse]


@ADVANTAGES.register(
    "hargo", "HARGO: GRPO advantage boosted by group contrast x reference doubt, group-softmax weighted",
    requires={"ref_logp"}, group_relative=True,
)
def hargo(token_rewards, group_index, mask, ref_logp=None, lam: float = 1.0, temperature: float = 1.0,
          eps: float = 1e-6, **_):
    """HARGO, heterogeneity-aware reward-guided optimisation (docs/methods/hargo.md). Confidence: low —
    reconstructed from the abstract.

    What: A_i = GRPO; D_g = unbiased std of the group's rewards (0 for a singleton); c_i =
    `sequence_confidence(ref_logp)`; Ã_i = A_i·(1 + λ·D_g·(1 − c_i)) (boost where the group is
    informative and the reference unsure); w_i = G·softmax_g(|Ã_i|/T). Returns w_i·Ã_i per token:
    for a loss that scales with A by a positive factor (PPO clip, dual-clip, CISPO, GSPO) this is
    exactly Σ_i w_i·(loss of i with Ã_i). Why: tasks of very different lengths and reward spreads,
    without task labels.

    `ref_logp` [B,T]: the reference model's log-probs of the sampled tokens. λ = 1 from the method
    page's example, T = 1 (the source gives neither).
    """
    ref = required("ref_logp", ref_logp).to(token_rewards.dtype)
    scores = sequence_scores(token_rewards)
    _, std = group_mean_std(scores, group_index)
    inverse, counts = group_slots(group_index)
    discrimination = torch.where(counts[inverse] > 1, std, torch.zeros_like(std))
    modulated = hargo_modulate(group_normalise(scores, group_index, eps), discrimination,
                               sequence_confidence(ref, mask), lam)
    weights = group_softmax_weights(modulated.abs(), group_index, temperature)
    return to_tokens(weights * modulated, mask)


# --- ResRL -------------------------------------------------------------------------------------


def length_penalty_factor(lengths: torch.Tensor, start: float = 3500, end: float = 4096,
                          floor: float = 0.7) -> torch.Tensor:
    """1 up to `start` tokens, falling linearly to `floor` at `end`, `floor` beyond."""
    frac = ((lengths.float() - start) / (end - start)).clamp(0.0, 1.0)
    return 1 - (1 - floor) * frac


def distance_weights(d: torch.Tensor, q_low: float = 0.2, q_high: float = 0.8, min_weight: float = 0.1,
                     flat: float = 1e-5) -> torch.Tensor:
    """w = min_weight + (1 − min_weight)·clip((d − lo)/(hi − lo), 0, 1), lo/hi the q_low/q_high quantiles of d.

    When hi − lo < `flat` every token gets the midpoint weight (0.55 with the defaults).
    """
    lo, hi = torch.quantile(d.float(), torch.tensor([q_low, q_high])).tolist()
    if hi - lo < flat:
        return torch.full_like(d, min_weight + (1 - min_weight) * 0.5)
    return min_weight + (1 - min_weight) * ((d - lo) / (hi - lo)).clamp(0.0, 1.0)


def projection_distances(positive: torch.Tensor, negative: torch.Tensor, max_rank: int = 64,
                         max_tokens: int = 4096, generator: torch.Generator | None = None) -> torch.Tensor | None:
    """d = ‖e‖²/H of each negative token, e its residual off the top principal subspace of the positives.

    Both inputs [M, H] / [N, H] are layer-normalised (no affine) first; the positives are
    subsampled to `max_tokens` and centred; k = min(max_rank, M − 1, H). None under 4 positives.
    """
    hidden = positive.shape[1]
    x = F.layer_norm(positive.float(), (hidden,))
    if x.shape[0] > max_tokens:
        x = x[torch.randperm(x.shape[0], generator=generator)[:max_tokens]]
    if x.shape[0] < 4:
        return None
    mu = x.mean(0)
    k = min(max_rank, x.shape[0] - 1, hidden)
    _, _, basis = torch.pca_lowrank(x - mu, q=k, center=False, niter=4)
    h = F.layer_norm(negative.float(), (hidden,)) - mu
    residual = h - (h @ basis) @ basis.T
    return (residual ** 2).sum(-1) / hidden


def svd_token_weights(hidden: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor, group_index: torch.Tensor,
                      max_rank: int = 64, max_tokens: int = 4096, q_low: float = 0.2, q_high: float = 0.8,
                      min_weight: float = 0.1) -> torch.Tensor:
    """[B,T] weights of negative tokens (1 elsewhere) in groups with both positive and negative rows."""
    weights = torch.ones_like(mask, dtype=torch.float)
    valid = mask > 0
    for g in torch.unique(group_index):
        rows = group_index == g
        pos, neg = rows & positive, rows & ~positive
        if not pos.any() or not neg.any():
            continue
        pos_tokens = valid & pos.unsqueeze(1)
        neg_tokens = valid & neg.unsqueeze(1)
        if not neg_tokens.any():
            continue
        d = projection_distances(hidden[pos_tokens], hidden[neg_tokens], max_rank, max_tokens)
        if d is not None:
            weights[neg_tokens] = distance_weights(d, q_low, q_high, min_weight)
    return weights


@ADVANTAGES.register(
    "resrl", "ResRL: negative tokens weighted by their residual off the positives' hidden-state subspace",
    requires={"hidden"}, group_relative=True,
    hidden_layer=-2,  # the penultimate layer's output, as in the reference (`hidden_states[-2]`)
)
def resrl(token_rewards, group_index, mask, hidden=None, base: str = "grpo", positive_scale: float = 0.1,
          max_rank: int = 64, max_tokens: int = 4096, q_low: float = 0.2, q_high: float = 0.8,
          min_weight: float = 0.1, length_start: float = 3500, length_end: float = 4096, length_floor: float = 0.7,
          **knobs):
    """ResRL (1229095296/ResRL `dp_actor.py::_compute_svd_token_weights`; docs/methods/resrl.md). Confidence: high.

    Negative responses keep exploring (as in NSR) except where their tokens repeat the positive
    reasoning: per group with a positive (score > 0) and a negative row, the positives' penultimate-
    layer hidden states span a subspace (PCA, rank ≤ 64); a negative token's weight grows with its
    residual distance off that subspace (`distance_weights`), so negative tokens that look like
    positive reasoning are pushed down only weakly (0.1). Positives of such groups get
    `positive_scale` × A. Positive rewards are length-penalised first (`length_penalty_factor`).
    A_t comes from the `base` estimator (GRPO) on the penalised rewards.
    """
    hidden = required("hidden", hidden)
    scores = token_rewards.sum(dim=1)
    positive = scores > 0
    factor = torch.where(positive, length_penalty_factor(mask.sum(1), length_start, length_end, length_floor),
                         torch.ones_like(scores))
    adv = ADVANTAGES.get(base)(token_rewards * factor.unsqueeze(1), group_index, mask, **knobs)
    weights = svd_token_weights(hidden, mask, positive, group_index, max_rank, max_tokens, q_low, q_high, min_weight)
    groups_mixed = torch.zeros_like(positive)
    for g in torch.unique(group_index):
        rows = group_index == g
        if (rows & positive).any() and (rows & ~positive).any():
            groups_mixed |= rows
    scale = torch.where(groups_mixed & positive, torch.full_like(scores, positive_scale), torch.ones_like(scores))
    return adv * scale.unsqueeze(1) * weights * mask


# --- per-turn credit of multi-turn episodes ------------------------------------------------------


def turn_ids(mask: torch.Tensor) -> torch.Tensor:
    """[B,T] index of the policy turn each token belongs to (runs of mask > 0, from 0), −1 elsewhere."""
    on = mask > 0
    starts = on & ~torch.cat([torch.zeros_like(on[:, :1]), on[:, :-1]], dim=1)
    return torch.where(on, starts.long().cumsum(1) - 1, torch.full_like(on, -1, dtype=torch.long))


def discounted_turn_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """[B,J] G_j = Σ_{k≥j} γ^(k−j) r_k over each row's turns (rows 0-padded past their last turn)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for j in reversed(range(rewards.shape[1])):
        running = rewards[:, j] + gamma * running
        returns[:, j] = running
    return returns


@ADVANTAGES.register("turn_discounted", "per-turn rewards, discounted returns per turn, GRPO-normalised per turn "
                     "index within the group", requires={"turn_rewards"}, group_relative=True)
def turn_discounted(token_rewards, group_index, mask, turn_rewards=None, gamma: float = 1.0,
                    norm_by_std: bool = True, eps: float = 1e-6, **_):
    """Per-turn credit for multi-turn episodes (docs/environments.md). Confidence: lmrl's own design.

    r_j: the environment's reward for policy turn j (`turn_rewards`); the rest of the sequence reward
    R − Σ_j r_j (other components, e.g. the answer grader) is added to the last turn, so Σ_j r_j = R.
    G_j = Σ_{k≥j} γ^(k−j) r_k (γ per turn, not per token). Every token of turn j gets
    A = (G_j − mean G_j) / (std G_j + eps), mean and std over the episodes of its group that reach
    turn j (as GRPO: a lone episode gets baseline 0, std 1). An episode with no trainable token still
    counts in its group's first-turn statistics with G_0 = R (its tokens get no advantage). With
    γ = 1, all reward on the last turn and equal turn counts this is GRPO.
    """
    per_turn = required("turn_rewards", turn_rewards).to(torch.float)
    ids = turn_ids(mask)
    counts = (ids.max(dim=1).values + 1).clamp(min=1)  # an episode without a trainable turn: one, unread
    width = int(counts.max())
    rewards = torch.zeros((mask.shape[0], width))
    cols = min(width, per_turn.shape[1])
    rewards[:, :cols] = per_turn[:, :cols]
    rewards = rewards * (torch.arange(width).unsqueeze(0) < counts.unsqueeze(1))
    residual = token_rewards.sum(dim=1).float() - rewards.sum(dim=1)
    rewards[torch.arange(mask.shape[0]), counts - 1] += residual
    returns = discounted_turn_returns(rewards, gamma)
    advantages = torch.zeros_like(returns)
    for j in range(width):
        has = counts > j
        mean, std = group_mean_std(returns[has, j], group_index[has])
        centred = returns[has, j] - mean
        advantages[has, j] = centred / (std + eps) if norm_by_std else centred
    return advantages.gather(1, ids.clamp(min=0)) * mask
