"""PARED: a reward learned from demonstrations by a logistic discriminator over a few reply features.

Projected Alignment Reward Estimated from Demonstrations (arXiv abstract [96] of the spec list). Each
reply y is mapped to a small feature vector φ(y) (its length in tokens, format checks, judge or rubric
scores: any per-sample reward component); a linear discriminator D(y) = σ(wᵀφ(y) + b) is trained to
tell the demonstrations (label 1) from the policy's own replies (label 0), and the reward is its logit
r(y) = wᵀφ(y) + b = log D/(1 − D). The weights w say, per feature, what the demonstrations have that
the policy lacks: the reward is explicit and inspectable. Training alternates: each group is scored by
the current (w, b), then the discriminator takes `disc_steps` gradient steps on demonstrations vs that
group; the policy's GRPO step follows.

Confidence low: reconstructed from the abstract alone (the loss normalisation, the L2 form, the
optimiser, how demonstrations are drawn and the feature set are lmrl's choices; docs/rewards/pared.md).

What a reply can and cannot do: its features are computed from the reply alone (its text and token
ids, and only the task-row fields named in `row_fields`, by default the question, never the gold
answer); the demonstrations come from the task rows or a file, never from a reply; a reply reaches
the discriminator's state only as a negative example.
"""
from __future__ import annotations

import inspect
import json
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lmrl.rewards.compute import GROUP_REWARD_FNS, find_component
from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

OPTIMIZERS = ("adam", "sgd")
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


# --- the discriminator, as pure functions -------------------------------------------------------

def pared_logits(features: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    """r = φ w + b per row of `features` (n × d): the reward, and the discriminator's logit."""
    return np.asarray(features, dtype=float) @ np.asarray(w, dtype=float) + float(b)


def discriminator_probability(logits: np.ndarray) -> np.ndarray:
    """D = σ(r), the probability that a reply is a demonstration."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=float)))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def discriminator_loss(w: np.ndarray, b: float, demos: np.ndarray, policy: np.ndarray, l2: float = 0.0) -> float:
    """L = mean_demos[−log σ(r)] + mean_policy[−log(1 − σ(r))] + l2·‖w‖² (each class weighs the same,
    whatever the number of demonstrations and samples; the bias is not penalised)."""
    w = np.asarray(w, dtype=float)
    demo_term = -_log_sigmoid(pared_logits(demos, w, b)).mean()
    policy_term = -_log_sigmoid(-pared_logits(policy, w, b)).mean()
    return float(demo_term + policy_term + l2 * w @ w)


def discriminator_gradient(w: np.ndarray, b: float, demos: np.ndarray, policy: np.ndarray,
                           l2: float = 0.0) -> tuple[np.ndarray, float]:
    """(∂L/∂w, ∂L/∂b) of `discriminator_loss`: ∂L/∂r = −(1 − σ(r))/n_demo on a demonstration, σ(r)/n_policy
    on a policy sample."""
    demos, policy = np.asarray(demos, dtype=float), np.asarray(policy, dtype=float)
    d_demo = -(1.0 - discriminator_probability(pared_logits(demos, w, b))) / len(demos)
    d_policy = discriminator_probability(pared_logits(policy, w, b)) / len(policy)
    grad_w = demos.T @ d_demo + policy.T @ d_policy + 2.0 * l2 * np.asarray(w, dtype=float)
    return grad_w, float(d_demo.sum() + d_policy.sum())


def initial_optimizer_state(dim: int) -> dict:
    """Adam's moments (over w and b, b last) and step count, all zero."""
    return {"m": np.zeros(dim + 1), "v": np.zeros(dim + 1), "t": 0}


def discriminator_update(w: np.ndarray, b: float, demos: np.ndarray, policy: np.ndarray, steps: int = 1,
                         lr: float = 0.05, l2: float = 0.0, optimizer: str = "adam",
                         state: dict | None = None) -> tuple[np.ndarray, float, dict]:
    """`steps` full-batch steps on `discriminator_loss` (plain gradient descent, or Adam with β = (0.9,
    0.999), ε = 1e-8): the new (w, b, optimiser state). Deterministic; the inputs are not modified."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    params = np.append(np.asarray(w, dtype=float), float(b))
    state = initial_optimizer_state(len(params) - 1) if state is None else {
        "m": np.array(state["m"], dtype=float), "v": np.array(state["v"], dtype=float), "t": int(state["t"])}
    for _ in range(steps):
        grad_w, grad_b = discriminator_gradient(params[:-1], params[-1], demos, policy, l2)
        grad = np.append(grad_w, grad_b)
        if optimizer == "sgd":
            params = params - lr * grad
            continue
        (beta1, beta2), state["t"] = ADAM_BETAS, state["t"] + 1
        state["m"] = beta1 * state["m"] + (1 - beta1) * grad
        state["v"] = beta2 * state["v"] + (1 - beta2) * grad * grad
        m_hat, v_hat = state["m"] / (1 - beta1 ** state["t"]), state["v"] / (1 - beta2 ** state["t"])
        params = params - lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
    return params[:-1], float(params[-1]), state


def argmax_r(features: np.ndarray, w: np.ndarray, b: float) -> int:
    """Inference-time reranking: the index of the candidate with the highest reward (the first on ties)."""
    return int(np.argmax(pared_logits(features, w, b)))


# --- features of a reply -------------------------------------------------------------------------

def reply_view(sample: Sample, row_fields: tuple[str, ...]) -> Sample:
    """What a feature may read of a reply: its text, token ids and finish reason, and of its task row
    only `row_fields` (no gold answer, no other component's reward, no info the rollout recorded)."""
    return Sample(prompt_ids=list(sample.prompt_ids), completion_ids=list(sample.completion_ids),
                  behaviour_logprobs=[], finish_reason=sample.finish_reason, text=sample.text,
                  row={k: sample.row[k] for k in row_fields if k in sample.row})


class Feature:
    """One named feature: the built-in `reply_tokens` (min(tokens / max, 1)) or a registered per-sample
    reward component by name with its params (`key` picks one value of a component returning a dict).
    `build=False` only checks the entry (a stateful component, e.g. a reward model, is not built)."""

    def __init__(self, entry: str | dict, build: bool = True):
        entry = {"name": entry} if isinstance(entry, str) else dict(entry)
        unknown = set(entry) - {"name", "params", "label", "key"}
        if "name" not in entry or unknown:
            raise ValueError(f"a pared feature is a name or {{name, params, label, key}}, got {entry!r}")
        self.name, self.params, self.key = entry["name"], dict(entry.get("params") or {}), entry.get("key")
        self.label = entry.get("label") or (f"{self.name}/{self.key}" if self.key else self.name)
        self.score = self._reply_tokens() if self.name == "reply_tokens" else self._component(build)

    def _reply_tokens(self) -> Callable[[Sample], float]:
        unknown = set(self.params) - {"max"}
        if unknown or not float(self.params.get("max", 256)) > 0:
            raise ValueError(f"pared feature reply_tokens takes one param, max > 0; got {self.params}")
        top = float(self.params.get("max", 256))
        return lambda sample: min(sample.num_generated / top, 1.0)

    def _component(self, build: bool) -> Callable[[Sample], Any] | None:
        try:
            target, per_group = find_component(self.name)
        except KeyError:
            raise ValueError(f"pared feature {self.name!r} is neither reply_tokens nor a registered per-sample "
                             f"reward component ({', '.join(REWARD_FNS.names())})") from None
        if per_group:
            raise ValueError(f"pared feature {self.name!r} scores whole groups; a feature is a per-sample component")
        built = inspect.isclass(target)
        REWARD_FNS.check_knobs(self.name, self.params, passed=0 if built else 1)
        if built:
            return target(**self.params) if build else None
        return lambda sample, fn=target, params=self.params: fn(sample, **params)

    def __call__(self, sample: Sample) -> float:
        try:
            value = self.score(sample)
        except KeyError as err:
            raise ValueError(f"pared feature {self.label!r} reads {err} of the task row, which pared does not show "
                             f"its features (they see the reply and the row fields named in row_fields: "
                             f"{sorted(sample.row)})") from None
        if isinstance(value, dict):
            if self.key not in value:
                raise ValueError(f"pared feature {self.label!r}: the component returns {sorted(value)}; "
                                 "name one with `key`")
            value = value[self.key]
        if value is None or isinstance(value, bool) or not np.isfinite(float(value)):
            raise ValueError(f"pared feature {self.label!r} gave {value!r} on a reply; a feature must be a number")
        return float(value)


def read_demonstrations(path: str) -> list[dict]:
    """The replies of a JSON-lines file, one {"text": ..., optional row fields} per line."""
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{i + 1}: a demonstration is {{\"text\": ...}}, got {line[:80]!r}")
            rows.append(row)
    if not rows:
        raise ValueError(f"pared demonstrations_file {path} holds no demonstrations")
    return rows


# --- the group reward --------------------------------------------------------------------------

@GROUP_REWARD_FNS.register("pared", "PARED: the logit of a discriminator of demonstrations vs the policy's replies "
                           "over named reply features (trained as it scores)")
class PARED:
    """Scores each group with the current (w, b), r = wᵀφ + b, then updates the discriminator on
    `demos_per_update` demonstrations (label 1) against the group's replies (label 0).

    Demonstrations: `demonstration`, a template over the task row's fields (the syntax of
    `task.demonstration`, e.g. "Answer: {answer}"), gives each row's reference completion, which joins the
    pool the first time a group of that row is scored; or `demonstrations_file`, a JSON-lines file of
    {"text": ...}. Their features are computed once, on the text tokenised by `tokenizer` (the policy's:
    a model path as `model.path` takes it, or a tokenizer object) and ended with EOS, as a sampled reply
    is. Demonstrations are drawn uniformly with replacement by a generator seeded with `seed`.
    """

    def __init__(self, features: list, tokenizer: Any, demonstration: str | None = None,
                 demonstrations_file: str | None = None, disc_steps: int = 1, lr: float = 0.05, l2: float = 0.01,
                 demos_per_update: int = 8, seed: int = 0, optimizer: str = "adam",
                 row_fields: list[str] = ("question",)):
        self.check_params(features, demonstration, demonstrations_file, disc_steps, lr, l2, demos_per_update,
                          optimizer)
        self.features = [Feature(entry) for entry in features]
        self.template, self.row_fields = demonstration, tuple(row_fields)
        self.disc_steps, self.lr, self.l2, self.optimizer = disc_steps, lr, l2, optimizer
        self.demos_per_update, self.seed = demos_per_update, seed
        self.tokenizer = _tokenizer(tokenizer)
        self.held_out = False  # set by the scorer while it scores an evaluation: score, do not learn
        self.lock = threading.Lock()  # a timed-out call may still be running when the next one starts
        self.load_reward_state(self.initial_state())
        if demonstrations_file is not None:
            for i, row in enumerate(read_demonstrations(demonstrations_file)):
                self._add_demo(f"file:{i}", row["text"], row)

    @staticmethod
    def check_params(features: list, demonstration: str | None = None, demonstrations_file: str | None = None,
                     disc_steps: int = 1, lr: float = 0.05, l2: float = 0.01, demos_per_update: int = 8,
                     optimizer: str = "adam", **_) -> None:
        """Refuse, before any model loads, knobs that cannot make a reward: no features, an unknown one, no
        demonstrations (or two sources of them), a step size or count out of range."""
        if not features:
            raise ValueError("pared needs at least one feature, e.g. [{name: reply_tokens, params: {max: 256}}]")
        if (demonstration is None) == (demonstrations_file is None):
            raise ValueError("pared needs demonstrations: either `demonstration`, a template over the task row's "
                             "fields (as task.demonstration, e.g. 'Answer: {answer}'), or `demonstrations_file`, a "
                             "JSON-lines file of {\"text\": ...}")
        if demonstrations_file is not None and not Path(demonstrations_file).is_file():
            raise ValueError(f"pared demonstrations_file {demonstrations_file!r}: no such file")
        if disc_steps < 0 or lr <= 0 or l2 < 0 or demos_per_update < 1:
            raise ValueError("pared needs disc_steps >= 0, lr > 0, l2 >= 0 and demos_per_update >= 1")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"pared optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        labels = [Feature(entry, build=False).label for entry in features]
        if len(set(labels)) != len(labels):
            raise ValueError(f"pared features need distinct labels, got {labels}")

    def initial_state(self) -> dict:
        dim = len(self.features)
        return {"w": [0.0] * dim, "b": 0.0, "optimizer": initial_optimizer_state(dim), "updates": 0,
                "sampler": np.random.default_rng(self.seed).bit_generator.state, "pool": []}

    def featurize(self, sample: Sample) -> np.ndarray:
        """φ(y), computed from the reply alone (`reply_view`)."""
        view = reply_view(sample, self.row_fields)
        return np.array([feature(view) for feature in self.features])

    def weights(self) -> dict[str, float]:
        """w per feature label, and the bias under "bias": the reward, readable."""
        return {f.label: float(v) for f, v in zip(self.features, self.w)} | {"bias": self.b}

    def rerank(self, samples: list[Sample]) -> Sample:
        """The candidate the current reward ranks first (inference-time reranking, best of n)."""
        with self.lock:
            return samples[argmax_r(np.stack([self.featurize(s) for s in samples]), self.w, self.b)]

    def __call__(self, samples: list[Sample]) -> list[float]:
        with self.lock:
            return self._score(samples)

    def reward_state(self) -> dict:
        """(w, b), the optimiser's moments, the update count, the demonstration sampler and pool (saved in
        checkpoints, so a resumed run scores and updates as the uninterrupted one)."""
        with self.lock:
            return {"w": self.w.tolist(), "b": self.b, "updates": self.updates,
                    "optimizer": {"m": self.opt["m"].tolist(), "v": self.opt["v"].tolist(), "t": self.opt["t"]},
                    "sampler": self.sampler.bit_generator.state,
                    "pool": [{"key": k, "features": v.tolist()} for k, v in self.pool.items()]}

    def load_reward_state(self, state: dict) -> None:
        if len(state["w"]) != len(self.features):
            raise ValueError(f"pared state has {len(state['w'])} weights, the config {len(self.features)} features")
        with self.lock:
            self._load(state)

    def _load(self, state: dict) -> None:
        self.w, self.b, self.updates = np.array(state["w"], dtype=float), float(state["b"]), int(state["updates"])
        opt = state["optimizer"]
        self.opt = {"m": np.array(opt["m"], dtype=float), "v": np.array(opt["v"], dtype=float), "t": int(opt["t"])}
        self.sampler = np.random.default_rng()
        self.sampler.bit_generator.state = state["sampler"]
        self.pool = {e["key"]: np.array(e["features"], dtype=float) for e in state["pool"]}  # key -> φ

    def _add_demo(self, key: str, text: str, row: dict) -> None:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        demo = Sample(prompt_ids=list(row.get("prompt_ids", [])), completion_ids=ids,
                      behaviour_logprobs=[0.0] * len(ids), text=text, row=row)
        self.pool[key] = self.featurize(demo)

    def _row_demo(self, row: dict) -> None:
        key = f"row:{row.get('uid', '')}:{row.get('prompt', row.get('question', ''))}"
        if key in self.pool:
            return
        try:
            text = self.template.format(**row)
        except (KeyError, IndexError, AttributeError) as err:
            raise ValueError(f"pared demonstration={self.template!r} reads {err}, which the task row lacks "
                             f"(it has: {', '.join(sorted(row))})") from None
        self._add_demo(key, text, row)

    def _score(self, samples: list[Sample]) -> list[float]:
        if self.template is not None and samples and not self.held_out:
            self._row_demo(samples[0].row)
        phi = np.stack([self.featurize(s) for s in samples])
        logits = pared_logits(phi, self.w, self.b)
        before = self.weights()
        negatives = phi[[s.origin.sampled for s in samples]]
        loss = None
        if self.pool and len(negatives) and self.disc_steps and not self.held_out:  # an evaluation only scores
            drawn = self.sampler.integers(len(self.pool), size=self.demos_per_update)
            demos = np.stack(list(self.pool.values()))[drawn]
            loss = discriminator_loss(self.w, self.b, demos, negatives, self.l2)
            self.w, self.b, self.opt = discriminator_update(self.w, self.b, demos, negatives, self.disc_steps,
                                                            self.lr, self.l2, self.optimizer, self.opt)
            self.updates += 1
        for s, r in zip(samples, logits):
            s.info["pared"] = {"weights": before, "logit": float(r), "D": float(discriminator_probability(r)),
                               "updates": self.updates, "disc_loss": loss, "demos": len(self.pool)}
        return [float(r) for r in logits]


def _tokenizer(tokenizer: Any):
    """A tokenizer object as given, or loaded from a model argument (path, .gguf, hub id, "default")."""
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer
    from lmrl.models.loading import load_tokenizer

    return load_tokenizer(tokenizer)
