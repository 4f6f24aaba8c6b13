"""Distillation from a separate teacher model: the `teacher_kl` and `gkd` terms and the providers of their inputs.

The student samples its own completions (the rollouts of an RL step); a frozen teacher, any causal LM that
shares the student's tokenizer, loaded once per run from the term's `model` setting (or, for `teacher_kl`,
served over HTTP at its `endpoint`: `inputs.served_teacher`), scores the very same token ids, and the term
is the per-token reverse KL D(π ‖ π_T) of the sampled tokens: with the `k1` estimator its gradient is
(log π − log π_T)·∇log π, the policy gradient of the per-token reward log π_T − log π with discount 0
(spec §4.2 (b), the sampled-token form of on-policy distillation). It joins the policy-gradient loss under
the method's aggregation, so an outcome reward may train beside it.

`gkd` is GKD's generalised Jensen–Shannon divergence JSD_β over the full vocabulary at every trained token
(spec §4.1, `algos.preference_losses.generalized_jsd`), the teacher's logits against the student's: on the
policy's rollouts it is on-policy distillation (GKD's λ = 1), on an offline dataset (`batches.source: sft`)
supervised distillation on its completions (λ = 0), and with `batches.on_policy: λ` GKD's per-step mix of the
two (`loops.offline`). The batch
holds the teacher's logits of every position, [B, T, V] floats: memory grows with the vocabulary.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lmrl.algos.aggregation import AggScale, token_mean
from lmrl.algos.preference_losses import generalized_jsd
from lmrl.algos.teacher import DISTILL_ESTIMATORS
from lmrl.algos.terms import TERMS, masked_mean
from lmrl.algos.losses import LossInputs
from lmrl.inputs.registry import PROVIDERS, InputContext
from lmrl.inputs.served_teacher import ServedTeacher, check_endpoint
from lmrl.models import load_model, load_tokenizer
from lmrl.types import Batch


class TeacherModel:
    """A frozen causal LM (the `model` setting: a directory, a .gguf file, a hub id, or "default")."""

    def __init__(self, model: str, **_):
        self.path = model
        self.model = load_model(model).eval().requires_grad_(False)
        self.tokenizer = load_tokenizer(model)
        self.checked = False

    def check_tokenizer(self, tokenizer) -> None:
        """Teacher and student must give the same ids to the same text (their log-probs are compared per token)."""
        if not self.checked and self.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"the teacher_kl term's teacher {self.path} has another tokenizer than the student; "
                             "token-level distillation needs the same vocabulary")
        self.checked = True

    def logprobs(self, batch: Batch, learner, tokenizer) -> torch.Tensor:
        """[B, T-1] the teacher's log-probs of the batch's generated tokens, at the learner's temperature."""
        self.check_tokenizer(tokenizer)
        return learner.logprobs(batch, model=self.model)


def build_teacher_model(model: str | None = None, endpoint: dict | None = None) -> TeacherModel | ServedTeacher:
    """`teacher_kl`'s teacher: loaded from `model`, or served at `endpoint`."""
    return ServedTeacher(endpoint) if endpoint is not None else TeacherModel(model)


def check_model_path(model: str | None) -> str | None:
    if model is None:
        return "set params.model, the teacher: a transformers directory, a .gguf file or a hub id"
    if model != "default" and not Path(model).expanduser().exists() and "/" not in model:
        return f"model: no such file or directory {model!r}"
    return None


def check_teacher_model(cfg, model: str | None = None, endpoint: dict | None = None, estimator: str = "k1",
                        **_) -> str | None:
    """Why `teacher_kl` cannot run (a teacher neither loaded nor served, or both; a model that does not exist
    here; an endpoint beside a sampling temperature other than 1; not a k1/k3 estimator), or None."""
    if estimator not in DISTILL_ESTIMATORS:
        return f"estimator must be one of {sorted(DISTILL_ESTIMATORS)} (got {estimator!r})"
    if endpoint is None:
        return check_model_path(model)
    if model is not None:
        return "give the teacher as params.model (loaded in the run) or params.endpoint (served), not both"
    if cfg.rollout.temperature != 1.0:
        return (f"a served teacher's log-probs are at temperature 1 (an echoed prompt's, as OpenAI-compatible servers "
                f"give them), while rollout.temperature={cfg.rollout.temperature:g} scales the student's and an "
                "in-process teacher's; sample at rollout.temperature=1 or load the teacher with params.model")
    return check_endpoint(endpoint)


def check_gkd_teacher(cfg, model: str | None = None, endpoint: dict | None = None, **_) -> str | None:
    """Why `gkd` cannot run: its teacher must be loaded in the run (a served one gives no full distribution)."""
    if endpoint is not None:
        return ("gkd compares the teacher's whole distribution at every position, which an OpenAI-compatible endpoint "
                "does not serve (it gives the log-probs of given tokens); load the teacher with params.model, or "
                "distil the sampled tokens with teacher_kl, which takes params.endpoint")
    return check_model_path(model)


@TERMS.register("teacher_kl", "reverse KL to a separate frozen teacher model on the policy's own tokens "
                "(on-policy distillation)", inputs={"logp", "teacher_model_logp"}, provided={"teacher_model_logp"},
                settings={"model": None, "endpoint": None}, builds=build_teacher_model, check=check_teacher_model,
                on_policy=True)
def teacher_kl(inputs: LossInputs, mask: torch.Tensor, estimator: str = "k1"):
    value = DISTILL_ESTIMATORS[estimator](inputs.logp, inputs.extras["teacher_model_logp"])
    return value, {"teacher_kl": masked_mean(value, mask)}


@PROVIDERS.register("teacher_model_logp", "a separate frozen teacher model's log-probs of the batch's own tokens, "
                    "loaded or served (the teacher_kl term)", needs={"learner", "tokenizer", "algorithm"})
def teacher_model_logprobs(batch: Batch, ctx: InputContext) -> None:
    teacher: TeacherModel | ServedTeacher = ctx.algorithm.built["teacher_kl"]
    batch.extras["teacher_model_logp"] = teacher.logprobs(batch, ctx.learner, ctx.tokenizer)


@TERMS.register("gkd", "GKD: the generalised JSD(β) to a separate frozen teacher over the full vocabulary, per "
                "trained token", inputs={"logits", "teacher_logits"}, provided={"teacher_logits"},
                settings={"model": None, "endpoint": None}, builds=TeacherModel, check=check_gkd_teacher,
                denominator="tokens")
def gkd(inputs: LossInputs, mask: torch.Tensor, beta: float = 0.5, temperature: float = 0.9):
    """JSD_β(p_T, p_S) per token (β = 0: forward KL, β = 1: reverse KL), summed over the trained tokens and divided
    by their number (TRL's `generalized_jsd_loss`, "batchmean" over tokens); GKDConfig's β 0.5 and T 0.9."""
    value = generalized_jsd(inputs.extras["logits"], inputs.extras["teacher_logits"], beta, temperature)
    return value, {"gkd/jsd": float(token_mean(value.detach(), mask, AggScale.of(mask)))}


@PROVIDERS.register("teacher_logits", "a separate frozen teacher model's full-vocabulary logits at each position "
                    "of the batch's own tokens (the gkd term)", needs={"learner", "tokenizer", "algorithm"})
def teacher_model_logits(batch: Batch, ctx: InputContext) -> None:
    teacher: TeacherModel = ctx.algorithm.built["gkd"]
    teacher.check_tokenizer(ctx.tokenizer)
    batch.extras["teacher_logits"] = ctx.learner.model_outputs(batch, {"logits"}, model=teacher.model)["logits"]
