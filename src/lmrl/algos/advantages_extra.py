"""Advantage estimators of specs/algorithms.md §2, §4, §6, §7, §9, §18–20, registered in `ADVANTAGES`.

Same signature as `advantages.py`: `(token_rewards [B,T], group_index [B], mask [B,T], **knobs)
-> advantages [B,T]`. Per-sample inputs beyond the reward (reward components, peer rewards, PMI,
modality masks, …) arrive as keyword tensors; scalars (entropy, step) as keyword numbers. A
required input that is missing raises a ValueError naming it. Cost-Aware GRPO is not an estimator
but a sampler between the advantage and the loss: `cost_aware_probs` / `cost_aware_weights`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from lmrl.algos.advantages import ADVANTAGES, group_mean_std


def _required(name: str, value):
    if value is None:
        raise ValueError(f"this advantage estimator needs the per-sample input {name!r}")
    return value


def _scores(token_rewards: torch.Tensor) -> torch.Tensor:
    return token_rewards.sum(dim=1)


def _to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(1) * mask


def group_normalise(values: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """(v − group mean) / (group std + eps), with GRPO's singleton convention (mean 0, std 1)."""
    mean, std = group_mean_std(values, group_index)
    return (values - mean) / (std + eps)


def _batch_zscore(values: torch.Tensor, eps: float) -> torch.Tensor:
    std = values.std() if values.numel() > 1 else torch.ones((), dtype=values.dtype)
    return (values - values.mean()) / (std + eps)


# §2 Mutual RL, XGRPO ---------------------------------------------------------------------------

@ADVANTAGES.register("xgrpo", "XGRPO: GRPO on own rollouts with the baseline pooled over own and peer rewards")
def xgrpo(token_rewards, group_index, mask, peer_rewards=None, eps: float = 1e-6, **_):
    """XGRPO (Mutual RL, arXiv 2605.07244) — confidence low: reconstruction from the abstract.

    Heterogeneous policies train side by side; only own rollouts carry gradient, but the baseline
    uses everyone's rewards for the prompt: A_i = (r_i − mean(R_self ∪ R_peer)) / (std(R_self ∪
    R_peer) + eps), unbiased std. `peer_rewards` [B, P]: the peer rewards of row i's prompt
    (every row of a group carries the same values; the group's first row is read). NaN entries
    are absent peers, so groups can have different peer counts. A pool of one sample gets GRPO's
    singleton convention (mean 0, std 1).
    """
    peers = _required("peer_rewards", peer_rewards).to(token_rewards.dtype).reshape(len(group_index), -1)
    scores = _scores(token_rewards)
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
    return _to_tokens((scores - mean[inverse]) / (std[inverse] + eps), mask)


# §4 GDPO and RVPO ------------------------------------------------------------------------------

def component_advantages(components: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """[B, K] per-reward group advantages A_{i,k} = (r_{i,k} − mean_g r_{·,k}) / (std_g + eps)."""
    components = components.float()
    return torch.stack([group_normalise(components[:, k], group_index, eps)
                        for k in range(components.shape[1])], dim=1)


@ADVANTAGES.register("gdpo", "GDPO: per-reward group normalisation, weighted sum, batch z-score")
def gdpo(token_rewards, group_index, mask, components=None, component_weights: Sequence[float] | None = None,
         eps: float = 1e-4, batch_norm: bool = True, **_):
    """GDPO (NVlabs/GDPO) — confidence high for the released code (the comparison method of RVPO).

    Normalises each reward component within its group before combining, so one dense reward
    cannot drown a sparse one: A_i = z_batch(Σ_k w_k A_{i,k}). `components` [B, K]; NaN
    components are skipped (the reference's nansum). eps = 1e-4 as in the reference.
    """
    adv = component_advantages(_required("components", components), group_index, eps)
    w = (torch.ones(adv.shape[1]) if component_weights is None
         else torch.as_tensor(component_weights, dtype=adv.dtype))
    total = (adv * w).nansum(dim=1)
    return _to_tokens(_batch_zscore(total, eps) if batch_norm else total, mask)


def softmin_aggregate(adv: torch.Tensor, tau: float) -> torch.Tensor:
    """SoftMin over the last dim: −τ · log((1/K) Σ_k exp(−A_k/τ)), NaN components ignored.

    ≈ mean_k A_k − Var_k A_k / (2τ); τ → ∞ gives the mean, τ → 0 the minimum. All-NaN rows give 0.
    """
    present = torch.isfinite(adv)
    k = present.sum(dim=-1)
    z = torch.where(present, -adv / tau, -math.inf)
    out = -tau * (torch.logsumexp(z, dim=-1) - torch.log(k.clamp(min=1).to(adv.dtype)))
    return torch.where(k > 0, out, torch.zeros_like(out))


@ADVANTAGES.register("rvpo", "RVPO: SoftMin (temperature tau) over per-reward group advantages")
def rvpo(token_rewards, group_index, mask, components=None, tau: float = 1.0, eps: float = 1e-4,
         batch_norm: bool = False, **_):
    """RVPO (arXiv 2605.05750) — confidence medium-low (τ and the normalisation were not retrieved).

    Aggregates K rewards with a SoftMin of their GDPO advantages instead of a sum, penalising
    reward variance so a sample failing one constraint is not carried by the others. Optional
    batch z-score as GDPO does (off by default: the spec presents it as optional).
    """
    adv = component_advantages(_required("components", components), group_index, eps)
    total = softmin_aggregate(adv, tau)
    return _to_tokens(_batch_zscore(total, eps) if batch_norm else total, mask)


# §7 Entrocraft ---------------------------------------------------------------------------------

def entropy_bounds(step: float, total_steps: float, lo: Sequence[float] = (0.6, 0.4),
                   hi: Sequence[float] = (0.7, 0.5), schedule: str = "linear") -> tuple[float, float]:
    """Entropy band [lo(s), hi(s)] moving from (lo[0], hi[0]) to (lo[1], hi[1]) over training."""
    frac = min(max(step / total_steps, 0.0), 1.0)
    if schedule == "cosine":
        frac = 0.5 * (1 - math.cos(math.pi * frac))
    elif schedule != "linear":
        raise ValueError(f"unknown entropy schedule {schedule!r} (linear | cosine)")
    return lo[0] + (lo[1] - lo[0]) * frac, hi[0] + (hi[1] - hi[0]) * frac


def entrocraft_mode(entropy: float, step: float, total_steps: float, **bounds) -> str:
    """'raft++' above the band (drop negatives), 'nsr' below it (drop positives), else 'grpo'."""
    low, high = entropy_bounds(step, total_steps, **bounds)
    entropy = float(entropy)
    return "raft++" if entropy > high else "nsr" if entropy < low else "grpo"


@ADVANTAGES.register("entrocraft", "Entrocraft: RAFT++ / NSR / GRPO by batch entropy vs a scheduled band")
def entrocraft(token_rewards, group_index, mask, entropy=None, step=None, total_steps=None,
               lo: Sequence[float] = (0.6, 0.4), hi: Sequence[float] = (0.7, 0.5), schedule: str = "linear",
               binary_to_signed: bool = False, eps: float = 1e-6, **_):
    """Entrocraft `grpo_range_linear` (lblaoke/entrocraft) — confidence high for the released controller.

    Steers policy entropy along a schedule by choosing the advantage's sign mix: above hi(s) use
    RAFT++ A = max(r, 0) (rejecting negatives lowers entropy); below lo(s) use NSR A = min(r, 0)
    (rejecting positives raises it); inside the band plain GRPO. RAFT++/NSR use the raw reward,
    which must be signed (±1); `binary_to_signed` maps 0/1 rewards to −1/+1 first.
    """
    _required("entropy", entropy)
    mode = entrocraft_mode(entropy, _required("step", step), _required("total_steps", total_steps),
                           lo=lo, hi=hi, schedule=schedule)
    scores = _scores(token_rewards)
    if binary_to_signed:
        scores = 2 * scores - 1
    if mode == "raft++":
        adv = scores.clamp(min=0)
    elif mode == "nsr":
        adv = scores.clamp(max=0)
    else:
        adv = group_normalise(scores, group_index, eps)
    return _to_tokens(adv, mask)


# §9 EqLen --------------------------------------------------------------------------------------

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


@ADVANTAGES.register("eqlen", "EqLen: a base estimator's advantages on equal-length segments of paired responses")
def eqlen(token_rewards, group_index, mask, base: str = "grpo", pair_index=None, **knobs):
    """EqLen (arXiv 2604.17328) — confidence low: reconstruction from the abstract.

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


# §18 P-GRPO ------------------------------------------------------------------------------------

def pmi_token_weights(pmi: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w_t = softmax over the row's valid tokens of PMI, times the row's length (mean weight 1)."""
    logits = torch.where(mask > 0, pmi.float(), -math.inf)
    safe = torch.where(mask.sum(dim=1, keepdim=True) > 0, logits, torch.zeros_like(logits))
    return torch.softmax(safe, dim=1) * mask.sum(dim=1, keepdim=True) * mask


@ADVANTAGES.register("p_grpo", "P-GRPO: base advantage reweighted per token by PMI, phased in over ramp_steps")
def p_grpo(token_rewards, group_index, mask, pmi=None, step: float = 0, ramp_steps: float = 0,
           base: str = "grpo", **knobs):
    """P-GRPO (EmoAgent-R1) — confidence low: reconstruction from the abstract.

    Token credit from pointwise mutual information with the evidence, PMI_t = log p(y_t|x, y<t) −
    log p(y_t|x⁻, y<t) (x⁻ drops the evidence; one extra forward pass). A_{i,t} = A_i·(1 +
    λ(s)(w_t − 1)), λ(s) = min(1, s/S) with S = `ramp_steps` (S ≤ 0: λ = 1 from the start).
    `pmi` [B, T] aligned with the mask; A_i from the `base` estimator.
    """
    weights = pmi_token_weights(_required("pmi", pmi), mask)
    lam = min(1.0, step / ramp_steps) if ramp_steps > 0 else 1.0
    adv = ADVANTAGES.get(base)(token_rewards, group_index, mask, **knobs)
    return adv * (1 + lam * (weights - 1)) * mask


# §19 ALPO --------------------------------------------------------------------------------------

def modality_mask(token_ids: torch.Tensor, speech_id_range: Sequence[int]) -> torch.Tensor:
    """1.0 where the predicted token id lies in [start, end) of the speech vocabulary, else 0.0."""
    start, end = speech_id_range
    return ((token_ids >= start) & (token_ids < end)).float()


@ADVANTAGES.register("alpo", "ALPO: text tokens get the text-reward GRPO advantage, speech tokens the acoustic one")
def alpo(token_rewards, group_index, mask, acoustic_rewards=None, speech_mask=None, text_rewards=None,
         eps: float = 1e-6, **_):
    """ALPO (acoustic-lexical decoupled PO) — confidence medium-low (routing explicit; GRPO normalisation assumed).

    One speech-text rollout carries two rewards; each token is credited with the reward of its
    own modality: A_{i,t} = GRPO(r^text)_i on text tokens, GRPO(r^acoustic)_i on speech tokens.
    `acoustic_rewards` [B]; `speech_mask` [B, T] (1 = speech token, see `modality_mask`);
    `text_rewards` [B] defaults to the sequence reward.
    """
    acoustic = _required("acoustic_rewards", acoustic_rewards).float()
    speech = _required("speech_mask", speech_mask).float()
    text = _scores(token_rewards) if text_rewards is None else text_rewards.float()
    a_text = group_normalise(text, group_index, eps).unsqueeze(1)
    a_ac = group_normalise(acoustic, group_index, eps).unsqueeze(1)
    return (speech * a_ac + (1 - speech) * a_text) * mask


# §20 PRPO --------------------------------------------------------------------------------------

@ADVANTAGES.register("prpo", "PRPO: GRPO within each column permutation plus lam x GRPO of permutation means")
def prpo(token_rewards, group_index, mask, perm_index=None, lam: float = 1.0, eps: float = 1e-6, **_):
    """PRPO (TabR1, arXiv 2510.17385) — confidence low-medium (two levels explicit; the sum is the spec's).

    Column permutations of a table are label-preserving, so they densify a sparse reward:
    A_{m,g} = A^in + λ·A^out with A^in = GRPO within (sample, permutation m) and A^out_m = GRPO of
    the permutation means r̄_m across the sample's permutations. `group_index` = the sample (table),
    `perm_index` [B] = the permutation id within it. With a single permutation A^out = 0 (PRPO
    reduces to GRPO); a singleton (sample, permutation) cell follows GRPO's convention in A^in.
    """
    perms = _required("perm_index", perm_index)
    scores = _scores(token_rewards)
    cells, cell_of_row, cell_size = torch.unique(torch.stack([group_index, perms], dim=1), dim=0,
                                                 return_inverse=True, return_counts=True)
    a_in = group_normalise(scores, cell_of_row, eps)
    cell_mean = torch.zeros(len(cells), dtype=scores.dtype).index_add_(0, cell_of_row, scores) / cell_size
    _, sample_slot, perms_per_sample = torch.unique(cells[:, 0], return_inverse=True, return_counts=True)
    a_out = group_normalise(cell_mean, cells[:, 0], eps)
    a_out = torch.where(perms_per_sample[sample_slot] > 1, a_out, torch.zeros_like(a_out))
    return _to_tokens(a_in + lam * a_out[cell_of_row], mask)


# §6 Cost-Aware GRPO (sampler between the advantage and the loss) -------------------------------

def cost_aware_probs(advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """p_i ∝ |A_i| / √L_i (gradient-norm proxy over the square root of the cost); zeros if all A = 0."""
    score = advantages.abs().float() / lengths.float().clamp(min=1).sqrt()
    total = score.sum()
    return score / total if total > 0 else torch.zeros_like(score)


def cost_aware_weights(advantages_per_seq: torch.Tensor, lengths: torch.Tensor, num_draws: int,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cost-Aware GRPO (arXiv 2604.28020) — confidence low-medium (distribution derived from the stated principle).

    Spends the update on responses with a high expected gradient per token: draw `num_draws`
    responses with replacement from `cost_aware_probs`, and return (selected [N] bool, weights [N])
    with w_i = count_i / (num_draws · p_i), 0 where not drawn. Σ_i w_i ℓ_i is then an unbiased
    estimate of Σ_i ℓ_i, so multiply each selected response's loss by w_i and keep the full batch's
    normaliser (row count or token count). With num_draws = N and single draws w_i = 1/(N p_i).
    """
    probs = cost_aware_probs(advantages_per_seq, lengths)
    if probs.sum() == 0 or num_draws <= 0:
        return torch.zeros_like(probs, dtype=torch.bool), torch.zeros_like(probs)
    draws = torch.multinomial(probs, num_draws, replacement=True, generator=generator)
    counts = torch.bincount(draws, minlength=len(probs)).to(probs.dtype)
    selected = counts > 0
    weights = torch.where(selected, counts / (num_draws * probs.clamp(min=1e-30)), torch.zeros_like(probs))
    return selected, weights

# Per-sample inputs each estimator needs beyond rewards and groups; the loop validates that it
# can supply them before a run starts (see loops/build.py).
for _fn, _inputs in ((xgrpo, {"peer_rewards"}), (gdpo, {"components"}), (rvpo, {"components"}),
                     (entrocraft, {"entropy", "step", "total_steps"}), (p_grpo, {"pmi"}),
                     (alpo, {"acoustic_rewards", "speech_mask"}), (prpo, {"perm_index"})):
    _fn.requires = _inputs
