"""Presets: named bundles of dotted settings (`algo.preset=dapo`), each with a one-line description.

A preset is a `Preset` record in the `PRESETS` registry, so `lmrl list algos`, the config's name
check and the validation's derived checks read the same table. Expanding `algo.preset` fills only
the settings the user left unset (loading.build_config). This module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from lmrl.registry import Registry


@dataclass(frozen=True)
class Preset:
    description: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # dotted key -> value, e.g. "algo.eps_high": 0.28


PRESETS: Registry[Preset] = Registry("preset", adopts_plain=False)


def preset(name: str, description: str, settings: dict[str, Any]) -> Preset:
    """Register the preset `name`: its description and its (read-only) settings together."""
    record = Preset(description, MappingProxyType(dict(settings)))
    PRESETS.register(name, description)(record)
    return record


_TOKEN_MEAN = {"algo.loss": "ppo_clip", "algo.aggregation": "token_mean"}  # PPO clip over the batch's tokens

preset("grpo", "GRPO: group-normalised advantages, PPO clip, token-mean", {"algo.advantage": "grpo", **_TOKEN_MEAN})
preset("dapo", "DAPO: clip-higher 0.2/0.28, dual-clip 10, token-mean, dynamic sampling, no KL", {
    "algo.advantage": "grpo", "algo.loss": "ppo_clip", "algo.eps_low": 0.2, "algo.eps_high": 0.28,
    "algo.dual_clip": 10.0, "algo.aggregation": "token_mean", "algo.kl_coef": 0.0, "data.group_filter": "nonzero_std"})
preset("dr_grpo", "Dr.GRPO: no std normalisation, sum over tokens / constant horizon, no KL", {
    "algo.advantage": "dr_grpo", "algo.loss": "ppo_clip", "algo.aggregation": "seq_mean_token_sum_norm",
    "algo.kl_coef": 0.0})
preset("gspo", "GSPO: sequence-level ratio clipped at 3e-4/4e-4, seq-mean-token-mean", {
    "algo.advantage": "grpo", "algo.loss": "gspo", "algo.eps_low": 3e-4, "algo.eps_high": 4e-4,
    "algo.aggregation": "seq_mean_token_mean", "algo.dual_clip": None})
preset("rloo", "RLOO: leave-one-out baseline, PPO clip", {"algo.advantage": "rloo", **_TOKEN_MEAN})
preset("reinforce_pp", "REINFORCE++: batch-whitened return-to-go, k1 KL folded into the reward", {
    "algo.advantage": "reinforce_pp", **_TOKEN_MEAN, "algo.kl_coef": 0.001, "algo.kl_in_reward": True})
preset("ppo", "PPO: learned critic (value head), GAE advantages, clipped value loss, PPO clip", {
    "algo.advantage": "gae", **_TOKEN_MEAN, "algo.critic": True})
preset("evpo", "EVPO: critic advantages while the critic's explained variance > 0, else a batch-mean baseline", {
    "algo.advantage": "evpo", **_TOKEN_MEAN, "algo.critic": True})
preset("resrl", "ResRL: negative tokens weighted by their residual off the positives' hidden-state subspace", {
    "algo.advantage": "resrl", **_TOKEN_MEAN})
preset("gdpo", "GDPO: each reward component group-normalised, summed, batch z-scored", {
    "algo.advantage": "gdpo", **_TOKEN_MEAN})
preset("rvpo", "RVPO: SoftMin over per-component group advantages (penalises reward variance)", {
    "algo.advantage": "rvpo", **_TOKEN_MEAN})
preset("entrocraft", "Entrocraft: RAFT++ / NSR / GRPO chosen by batch entropy against a scheduled band", {
    "algo.advantage": "entrocraft", **_TOKEN_MEAN, "algo.advantage_params": {"binary_to_signed": True},
    "algo.kl_coef": 0.001})
preset("eqlen", "EqLen: GRPO advantages on equal-length segments of paired responses", {
    "algo.advantage": "eqlen", **_TOKEN_MEAN})
preset("xgrpo", "XGRPO: GRPO with the baseline pooled over own and peer rewards (task field peer_rewards)", {
    "algo.advantage": "xgrpo", **_TOKEN_MEAN})
preset("alpo", "ALPO: text tokens get the text-reward advantage, speech tokens the acoustic one", {
    "algo.advantage": "alpo", **_TOKEN_MEAN})
preset("prpo", "PRPO: GRPO within each permutation plus GRPO of permutation means (task fields)", {
    "algo.advantage": "prpo", **_TOKEN_MEAN})
preset("p_grpo", "P-GRPO: GRPO advantages reweighted per token by PMI with the evidence (task field without it)", {
    "algo.advantage": "p_grpo", **_TOKEN_MEAN})
preset("cost_aware_grpo", "Cost-Aware GRPO: train on half the rows, drawn by |A|/sqrt(length), importance-weighted", {
    "algo.advantage": "grpo", **_TOKEN_MEAN,
    "algo.shaping": [{"name": "cost_aware", "params": {"fraction": 0.5}}]})
preset("htpo", "HTPO: clip bounds and loss weights by token entropy and prompt difficulty (DAPO-style clip)", {
    "algo.advantage": "grpo", "algo.loss": "htpo", "algo.eps_low": 0.2, "algo.eps_high": 0.28,
    "algo.dual_clip": 10.0, "algo.aggregation": "token_mean", "algo.kl_coef": 0.0})
preset("cispo", "CISPO: REINFORCE with the IS weight clipped (at 1.28) and detached; no token loses its gradient", {
    "algo.advantage": "grpo", "algo.loss": "cispo", "algo.eps_low": 1.0, "algo.eps_high": 0.28,
    "algo.aggregation": "token_mean"})
preset("sapo", "SAPO: soft sigmoid gate on the ratio instead of a hard clip, sharper for negative advantages, "
               "seq-mean-token-mean", {
    "algo.advantage": "grpo", "algo.loss": "sapo", "algo.aggregation": "seq_mean_token_mean"})
preset("grpo_or", "GRPO-OR (Output Reset): one-sided squared pull of the log-ratio to a margin, no clip", {
    "algo.advantage": "grpo", "algo.loss": "output_reset", "algo.aggregation": "token_mean"})
preset("gft", "GFT: policy gradient with the 1/pi weight capped at 1/tau (tau = 0.1)", {
    "algo.advantage": "grpo", "algo.loss": "gft", "algo.aggregation": "token_mean"})
preset("acrl", "ACRL: PPO clip, tokens masked when train/rollout ratio leaves [1/c, c]; c adapts to the discrepancy", {
    "algo.advantage": "grpo", "algo.loss": "acrl", "algo.aggregation": "token_mean"})
preset("hargo", "HARGO: GRPO advantages boosted by group contrast x reference doubt, group-softmax weighted", {
    "algo.advantage": "hargo", **_TOKEN_MEAN})
preset("gepo", "GEPO: GRPO advantages damped where the group's entropy leaves its history band (mu ± sigma)", {
    "algo.advantage": "gepo", **_TOKEN_MEAN})
preset("pipo", "PIPO: GRPO step, then a replay of the previous batch scaled by the reward-window verdict", {
    "algo.advantage": "pipo", **_TOKEN_MEAN})
preset("grpo_chi2", "GRPO regularised by the chi-squared divergence to the reference (coefficient 0.05)", {
    "algo.advantage": "grpo", **_TOKEN_MEAN, "algo.kl_estimator": "f_chi2", "algo.kl_coef": 0.05})
preset("gft_demo", "GFT with the task's reference answer as one more group member (reads gold answers as data)", {
    "algo.advantage": "grpo", "algo.loss": "gft", "algo.aggregation": "token_mean",
    "data.demonstrations": "group", "task.demonstration": "Answer: {answer}"})
preset("prp", "PRP: another policy's rollouts (task field peer_rollouts) join each group, "
              "weighted min(π/π_peer, 2)", {
    "algo.advantage": "grpo", "algo.loss": "ppo_clip_tis_seq", "algo.aggregation": "token_mean",
    "data.demonstrations": "peers", "task.peer_rollouts": "peer_rollouts"})
preset("sgt", "SGT rescue: groups with no success get the reference answer, trained by a supervised term (0.1)", {
    "algo.advantage": "grpo", **_TOKEN_MEAN, "data.demonstrations": "rescue",
    "task.demonstration": "Answer: {answer}",
    "algo.terms": [{"name": "demo_nll", "coef": 0.1}]})
preset("policy_split", "Policy Split: each prompt also rolled out with an exploration instruction; pooled GRPO, "
                       "entropy bonus on that mode", {
    "algo.advantage": "grpo", "algo.loss": "policy_split", "algo.aggregation": "token_mean",
    "algo.group_by": "variant_of",
    # exact entropy with its gradient keeps several [tokens, vocab] tensors: smaller micro-batches
    "trainer.micro_batch_tokens": 2048,
    "task.prompt_variants": ["Explore: consider several different approaches before you settle on an answer."]})

# Stages around RL: an offline batch source (`batches.source`) and the terms that train it (docs/stages/)
preset("sft", "SFT: next-token NLL on the assistant's tokens of an offline dataset (batches.dataset)", {
    "batches.source": "sft", "algo.terms": [{"name": "nll"}]})
preset("dpo", "DPO (sigmoid, β 0.1) on preference pairs against the frozen initial policy", {
    "batches.source": "pairs", "algo.terms": [{"name": "dpo", "params": {"beta": 0.1}}]})
preset("ipo", "IPO (length-normalised, τ 0.1) on preference pairs against the frozen initial policy", {
    "batches.source": "pairs", "algo.terms": [{"name": "dpo", "params": {"beta": 0.1, "loss_type": "ipo"}}]})
preset("simpo", "SimPO (β 0.1, γ 0.5, TRL's defaults): reference-free, on average log-probs", {
    "batches.source": "pairs", "algo.terms": [{"name": "simpo"}]})
preset("orpo", "ORPO (λ 0.1): the chosen reply's NLL plus the odds-ratio loss, no reference", {
    "batches.source": "pairs", "algo.terms": [{"name": "orpo"}]})
preset("kto", "KTO (β 0.1): desirable / undesirable rows against the batch's KL reference point", {
    "batches.source": "unpaired", "algo.terms": [{"name": "kto"}]})
preset("reward_model", "Bradley–Terry reward model: a scalar head trained on preference pairs", {
    "batches.source": "pairs", "algo.terms": [{"name": "bradley_terry"}]})
preset("prm", "process reward model: a 2-class step head trained on the step ends of stepwise-labelled traces", {
    "batches.source": "steps", "algo.terms": [{"name": "prm"}]})
preset("gkd", "GKD (GKDConfig's λ 0.5, β 0.5, T 0.9, 128 new tokens): the generalised JSD to a teacher "
              "(algo.terms.gkd.params.model) on a dataset's completions, regenerated by the student at half the steps", {
    "batches.source": "sft", "batches.on_policy": 0.5, "rollout.temperature": 0.9, "rollout.max_new_tokens": 128,
    "algo.terms": [{"name": "gkd", "params": {"beta": 0.5, "temperature": 0.9}}]})
preset("online_dpo", "Online DPO: each prompt's best- and worst-rewarded rollouts as a pair, DPO (β 0.1) against "
                     "the frozen initial policy", {
    "batches.source": "online_pairs", "data.group_filter": "nonzero_std",
    "algo.terms": [{"name": "dpo", "params": {"beta": 0.1}}]})
