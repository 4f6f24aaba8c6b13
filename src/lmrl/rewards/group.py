"""Group rewards: components that need a prompt's whole group (`fn(samples, **params) -> list`).

- `majority_vote` (TTRL): label-free; the group's most frequent answer is the pseudo-label.
- `consensus` (CoRE): label-free; replicator dynamics on an answer/reasoning affinity graph.
- `meds` (MEDS): a stateful class; penalises answers that fall into error clusters recurring
  across steps for the same prompt.
- `novelty` (MINT) lives in `rewards/novelty.py`.

The label-free rewards never read `sample.row["answer"]`; pair them with the `answer`
component at weight 0 to log accuracy against gold without training on it.
"""
from __future__ import annotations

import functools
import math
import re
import threading
import zlib
from collections import Counter

import numpy as np

from lmrl.rewards.compute import GROUP_REWARD_FNS
from lmrl.rewards.functions import answers_match, extract_answer, last_number
from lmrl.types import Sample

GATE_MODES = ("zero", "exclude")


def sample_answer(sample: Sample, pattern: str | None = None, fallback: str = "none") -> str | None:
    """The answer the `answer` reward would grade: text after the last 'Answer:' (or a custom regex)."""
    if fallback not in ("none", "last_number"):
        raise ValueError(f"fallback must be 'none' or 'last_number', got {fallback!r}")
    predicted = extract_answer(sample.text, pattern)
    if predicted is None and fallback == "last_number":
        predicted = last_number(sample.text)
    return predicted


def _same(a: str, b: str, compare: str) -> bool:
    if compare == "match":
        return answers_match(a, b)
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def answer_classes(answers: list[str | None], compare: str = "match") -> list[int | None]:
    """Class id per answer (equal answers share one; None stays None), ids in order of first appearance."""
    if compare not in ("match", "exact"):
        raise ValueError(f"compare must be 'match' or 'exact', got {compare!r}")
    representatives: list[str] = []
    ids: list[int | None] = []
    for a in answers:
        if a is None:
            ids.append(None)
            continue
        found = next((k for k, rep in enumerate(representatives) if _same(a, rep, compare)), None)
        if found is None:
            representatives.append(a)
            found = len(representatives) - 1
        ids.append(found)
    return ids


def _no_verdict(n: int, mode: str) -> list[float | None]:
    if mode not in GATE_MODES:
        raise ValueError(f"below-gate mode must be one of {GATE_MODES}, got {mode!r}")
    return [0.0 if mode == "zero" else None] * n


@GROUP_REWARD_FNS.register("majority_vote", "TTRL: 1 if the answer equals the group's most frequent answer (no gold)")
def majority_vote(samples: list[Sample], pattern: str | None = None, fallback: str = "none",
                  compare: str = "match", min_agreement: float = 0.0, below_agreement: str = "zero",
                  complete_only: bool = False, **_) -> list[float | None]:
    """Pseudo-label = most frequent extracted answer (ties: the first seen); reward 1 for agreeing samples.

    Agreement = label votes / group size (samples without an answer count as dissent). Below
    `min_agreement` the group gets no verdict: all 0 (`below_agreement="zero"`, no learning signal)
    or all None (`"exclude"`: left out of the update and counted in the metrics). With
    `complete_only`, a reply cut off at the token limit casts no vote (its last number is usually
    an intermediate step, and a policy can learn to agree on those).
    """
    ids = answer_classes([None if complete_only and s.finish_reason == "length" else sample_answer(s, pattern, fallback)
                          for s in samples], compare)
    votes = Counter(i for i in ids if i is not None)
    if not votes:
        return _no_verdict(len(samples), below_agreement)
    label, count = votes.most_common(1)[0]
    agreement = count / len(samples)
    for s in samples:
        s.info["majority_vote"] = {"agreement": agreement}
    if agreement < min_agreement:
        return _no_verdict(len(samples), below_agreement)
    return [float(i == label) for i in ids]


# --- CoRE consensus ------------------------------------------------------------------------------

def replicator_dynamics(affinity: np.ndarray, tol: float = 1e-6, max_iter: int = 1000) -> np.ndarray:
    """x <- x * (A x) / (x^T A x) from the barycentre until the L1 change is below `tol`."""
    n = affinity.shape[0]
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        payoff = affinity @ x
        total = float(x @ payoff)
        if total <= 0.0:
            return x
        new = x * payoff / total
        if np.abs(new - x).sum() < tol:
            return new
        x = new
    return x


def consensus_rewards(affinity: np.ndarray, tol: float = 1e-6, max_iter: int = 1000) -> tuple[np.ndarray, np.ndarray, float]:
    """(x*, graded rewards clip((A x*)_i / x*^T A x*, 0, 1), cohesiveness x*^T A x*)."""
    a = np.asarray(affinity, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or (a < 0).any() or not np.allclose(a, a.T):
        raise ValueError("affinity must be a square, symmetric, non-negative matrix")
    a = a.copy()
    np.fill_diagonal(a, 0.0)
    x = replicator_dynamics(a, tol, max_iter)
    cohesiveness = float(x @ a @ x)
    if cohesiveness <= 0.0:
        return x, np.zeros(len(x)), 0.0
    return x, np.clip(a @ x / cohesiveness, 0.0, 1.0), cohesiveness


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def consensus_affinity(samples: list[Sample], ids: list[int | None], answer_weight: float, similarity_weight: float,
                       confidence: str) -> np.ndarray:
    """A_ij = w_a·1[same answer] + w_s·Jaccard(words_i, words_j), optionally × sqrt(c_i c_j); A_ii = 0."""
    n = len(samples)
    same = np.array([[float(ids[i] is not None and ids[i] == ids[j]) for j in range(n)] for i in range(n)])
    a = answer_weight * same
    if similarity_weight:
        words = [_words(s.text) for s in samples]
        a = a + similarity_weight * np.array([[_jaccard(words[i], words[j]) for j in range(n)] for i in range(n)])
    if confidence == "mean_prob":
        c = np.array([math.exp(sum(s.behaviour_logprobs) / max(len(s.behaviour_logprobs), 1)) for s in samples])
        a = a * np.sqrt(np.outer(c, c))
    elif confidence != "none":
        raise ValueError(f"confidence must be 'none' or 'mean_prob', got {confidence!r}")
    np.fill_diagonal(a, 0.0)
    return a


@GROUP_REWARD_FNS.register("consensus", "CoRE: graded affinity to the dominant set found by replicator dynamics (no gold)")
def consensus(samples: list[Sample], pattern: str | None = None, fallback: str = "none", compare: str = "match",
              answer_weight: float = 1.0, similarity_weight: float = 0.0, confidence: str = "none",
              tol: float = 1e-6, max_iter: int = 1000, support: float = 1e-4, min_cohesiveness: float = 0.0,
              below_cohesiveness: str = "zero", **_) -> list[float | None]:
    """Reward r_i = clip((A x*)_i / x*^T A x*, 0, 1); with answer-only affinity this is majority vote.

    Confidence: low for the edge weights, `support` and the cohesiveness gate (reconstructed from
    the abstract); high for the replicator dynamics and its reduction to majority vote.
    """
    if answer_weight < 0 or similarity_weight < 0:
        raise ValueError("answer_weight and similarity_weight must be >= 0")
    ids = answer_classes([sample_answer(s, pattern, fallback) for s in samples], compare)
    x, rewards, cohesiveness = consensus_rewards(
        consensus_affinity(samples, ids, answer_weight, similarity_weight, confidence), tol, max_iter)
    mass: Counter[int] = Counter()
    for i, xi in zip(ids, x):
        if i is not None and xi > support:
            mass[i] += float(xi)
    label = mass.most_common(1)[0][0] if mass else None
    for s, xi in zip(samples, x):
        s.info["consensus"] = {"cohesiveness": cohesiveness, "weight": float(xi), "in_dominant_set": bool(xi > support),
                               "label_class": label}
    if cohesiveness < min_cohesiveness or cohesiveness <= 0.0:
        return _no_verdict(len(samples), below_cohesiveness)
    return [float(r) for r in rewards]


# --- MEDS: memory of recurring errors ------------------------------------------------------------

def hdbscan_labels(vectors: np.ndarray, min_cluster_size: int = 2) -> np.ndarray:
    """HDBSCAN with min_samples=1 (so mutual reachability = Euclidean distance), excess-of-mass
    selection, no single-cluster result; -1 marks noise. Fewer than 2 points: all noise.

    Written out (numpy, O(n^2)) because the memories are small: single-linkage tree from the
    minimum spanning tree, condensed tree, cluster stabilities, then the usual labelling.
    """
    x = np.asarray(vectors, dtype=float)
    n = len(x)
    if n < 2:
        return np.full(n, -1)
    dist = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    # minimum spanning tree (Prim), then single-linkage merges in order of edge length
    in_tree, best, parent_of = np.zeros(n, bool), dist[0].copy(), np.zeros(n, int)
    in_tree[0], edges = True, []
    for _ in range(n - 1):
        j = int(np.argmin(np.where(in_tree, np.inf, best)))
        edges.append((float(best[j]), int(parent_of[j]), j))
        in_tree[j] = True
        closer = dist[j] < best
        best, parent_of = np.where(closer, dist[j], best), np.where(closer, j, parent_of)
    root_of, size = list(range(2 * n - 1)), [1] * n + [0] * (n - 1)
    children: dict[int, tuple[int, int, float]] = {}

    def find(i: int) -> int:
        while root_of[i] != i:
            root_of[i] = root_of[root_of[i]]
            i = root_of[i]
        return i

    for k, (d, a, b) in enumerate(sorted(edges, key=lambda e: e[0])):
        ra, rb, node = find(a), find(b), n + k
        root_of[ra] = root_of[rb] = node
        children[node], size[node] = (ra, rb, d), size[ra] + size[rb]

    def leaves(node: int) -> list[int]:
        stack, out = [node], []
        while stack:
            v = stack.pop()
            if v >= n:
                stack.extend(children[v][:2])
            else:
                out.append(v)
        return out

    # condensed tree rows: (parent cluster, child cluster or point, lambda, child size)
    root = 2 * n - 2
    cluster_of, rows, next_label, todo = {root: n}, [], n + 1, [root]
    while todo:
        node = todo.pop(0)
        left, right, d = children[node]
        lam = 1.0 / d if d > 0 else 1e12
        big = [c for c in (left, right) if size[c] >= min_cluster_size]
        for c in (left, right):
            if len(big) == 2:
                cluster_of[c], next_label = next_label, next_label + 1
                rows.append((cluster_of[node], cluster_of[c], lam, size[c]))
                todo.append(c)
            elif c in big:
                cluster_of[c] = cluster_of[node]
                todo.append(c)
            else:
                rows.extend((cluster_of[node], p, lam, 1) for p in leaves(c))
    birth = {n: 0.0} | {child: lam for _, child, lam, sz in rows if sz > 1}
    stability = dict.fromkeys(birth, 0.0)
    for parent, _, lam, sz in rows:
        stability[parent] += (lam - birth[parent]) * sz
    sub = {c: [child for parent, child, _, sz in rows if parent == c and sz > 1] for c in birth}
    selected = {c: True for c in birth if c != n}
    for c in sorted(selected, reverse=True):
        below = sum(stability[k] for k in sub[c])
        if below > stability[c]:
            selected[c], stability[c] = False, below
        else:
            stack = list(sub[c])
            while stack:
                k = stack.pop()
                selected[k] = False
                stack.extend(sub[k])
    chosen = sorted(c for c, keep in selected.items() if keep)
    up = {child: parent for parent, child, _, _ in rows}
    labels = np.full(n, -1)
    for p in range(n):
        c = up[p]
        while c not in chosen and c != n:
            c = up[c]
        labels[p] = chosen.index(c) if c in chosen else -1
    return labels


@functools.lru_cache(maxsize=65536)
def _token_vector(token: str, dim: int) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(token.encode())).standard_normal(dim)


def _embed(tokens: list[str], dim: int) -> np.ndarray:
    """Sum of fixed random Gaussian vectors per token (random indexing): equal token bags give equal
    vectors, different ones nearly orthogonal ones, with no bucket collisions."""
    return np.sum([_token_vector(t, dim) for t in tokens], axis=0) if tokens else np.zeros(dim)


def meds_penalty(cluster_size: int, coef: float = 0.1, cap: float = 2.0) -> float:
    """P = coef · min(ln(n + 1), cap)."""
    return coef * min(math.log(cluster_size + 1), cap)


def meds_shape(reward: float, correct: bool, penalty: float, target: str = "wrong") -> float:
    """Wrong samples (targets 'wrong'/'both'): r - P; correct samples (targets 'right'/'both'): r / (1 + P)."""
    if target not in ("wrong", "right", "both", "none"):
        raise ValueError(f"target must be wrong, right, both or none, got {target!r}")
    if not correct and target in ("wrong", "both"):
        return reward - penalty
    if correct and target in ("right", "both"):
        return reward / (1.0 + penalty)
    return reward


@GROUP_REWARD_FNS.register("meds", "MEDS: correctness reward minus a penalty for recurring error clusters (memory)")
class MEDS:
    """Memory-Enhanced Dynamic reward Shaping: a memory per (prompt, correctness) of response features.
    An evaluation's samples (`held_out`, set by the scorer) are scored from the memory without joining it.

    Each new response's cluster is predicted by k-NN (cosine) over the stored, clustered features;
    n = that cluster's size in the memory (0 without history). Then the new features are stored and
    the memory re-clustered (HDBSCAN, min_samples=1, on L2-normalised vectors). The returned score
    is the correctness reward shaped by P = coef·min(ln(n+1), cap).

    Features: `answer` (a fixed random vector per extracted answer), `text` (sum of fixed random
    vectors of the completion's word 1-2-grams) or `info:<key>` (a vector the rollout put in `sample.info[key]`, e.g. the paper's
    per-layer answer logits). Correctness comes from the gold answer (like `answer`), or from an
    earlier component named by `correctness_component` (>= 0.5 counts as correct; with
    `majority_vote` the whole reward stays label-free).
    """

    def __init__(self, coef: float = 0.1, cap: float = 2.0, target: str = "wrong", k: int = 3,
                 min_cluster_size: int = 2, feature: str = "answer", dim: int = 64,
                 correctness_component: str | None = None, correct_reward: float = 1.0, wrong_reward: float = -1.0,
                 noise_as_cluster: bool = True, pattern: str | None = None, fallback: str = "none"):
        meds_shape(0.0, False, 0.0, target)
        if feature not in ("answer", "text") and not feature.startswith("info:"):
            raise ValueError(f"feature must be 'answer', 'text' or 'info:<key>', got {feature!r}")
        if k < 1 or min_cluster_size < 2 or dim < 1:
            raise ValueError("meds needs k >= 1, min_cluster_size >= 2 and dim >= 1")
        self.coef, self.cap, self.target, self.k, self.min_cluster_size = coef, cap, target, k, min_cluster_size
        self.feature, self.dim, self.correctness_component = feature, dim, correctness_component
        self.correct_reward, self.wrong_reward, self.noise_as_cluster = correct_reward, wrong_reward, noise_as_cluster
        self.pattern, self.fallback = pattern, fallback
        self.memory: dict[tuple, dict] = {}
        self.held_out = False
        self.lock = threading.Lock()  # a timed-out call may still be running when the next one starts

    def features(self, sample: Sample) -> np.ndarray:
        if self.feature == "answer":
            answer = sample_answer(sample, self.pattern, self.fallback)
            return _embed([" ".join(answer.lower().split()) if answer is not None else "<no answer>"], self.dim)
        if self.feature == "text":
            words = re.findall(r"\w+|[^\w\s]", sample.text.lower())
            return _embed(words + [a + " " + b for a, b in zip(words, words[1:])], self.dim)
        key = self.feature[len("info:"):]
        if key not in sample.info:
            raise ValueError(f"meds feature {self.feature!r}: sample.info has no {key!r}")
        return np.asarray(sample.info[key], dtype=float).ravel()

    def is_correct(self, sample: Sample) -> bool:
        if self.correctness_component is None:
            predicted = sample_answer(sample, self.pattern, self.fallback)
            return predicted is not None and answers_match(predicted, str(sample.row["answer"]))
        value = sample.rewards.get(self.correctness_component)
        if value is None:
            raise ValueError(f"meds: component {self.correctness_component!r} must be listed before meds")
        return value >= 0.5

    def cluster_size(self, slot: dict, vector: np.ndarray) -> int:
        """Size (in the memory) of the cluster the k nearest stored vectors (cosine) vote for."""
        if slot["labels"] is None:
            return 0
        stored = np.stack(slot["vectors"])
        sims = stored @ vector / (np.linalg.norm(stored, axis=1) * np.linalg.norm(vector) + 1e-12)
        nearest = np.argsort(-sims, kind="stable")[: self.k]
        values, counts = np.unique(slot["labels"][nearest], return_counts=True)
        label = int(values[np.argmax(counts)])
        if label == -1 and not self.noise_as_cluster:
            return 0
        return int((slot["labels"] == label).sum())

    def __call__(self, samples: list[Sample]) -> list[float]:
        with self.lock:
            return self._score(samples)

    def reward_state(self) -> dict:
        """The memory (saved in checkpoints, so a resumed run penalises the same clusters)."""
        with self.lock:
            return {"memory": [{"prompt": list(p), "correct": c, "vectors": [v.copy() for v in slot["vectors"]],
                                "labels": None if slot["labels"] is None else slot["labels"].copy()}
                               for (p, c), slot in self.memory.items()]}

    def load_reward_state(self, state: dict) -> None:
        with self.lock:
            self.memory = {(tuple(e["prompt"]), e["correct"]): {"vectors": list(e["vectors"]), "labels": e["labels"]}
                           for e in state["memory"]}

    def _store(self, prompt: tuple, vectors: list[np.ndarray], correct: list[bool]) -> None:
        """Add the vectors to their (prompt, correctness) slots and cluster those slots again."""
        for v, c in zip(vectors, correct):
            self.memory.setdefault((prompt, c), {"vectors": [], "labels": None})["vectors"].append(v)
        for c in set(correct):
            slot = self.memory[(prompt, c)]
            normed = np.stack(slot["vectors"])
            normed = normed / np.maximum(np.linalg.norm(normed, axis=1, keepdims=True), 1e-12)
            slot["labels"] = hdbscan_labels(normed, self.min_cluster_size)

    def _score(self, samples: list[Sample]) -> list[float]:
        prompt = tuple(samples[0].prompt_ids) if samples else ()
        vectors = [self.features(s) for s in samples]
        correct = [self.is_correct(s) for s in samples]
        empty = {"vectors": [], "labels": None}
        sizes = [self.cluster_size(self.memory.get((prompt, c), empty), v) for v, c in zip(vectors, correct)]
        if not self.held_out:  # an evaluation's samples are scored from the memory, not stored in it
            self._store(prompt, vectors, correct)
        out = []
        for s, c, n in zip(samples, correct, sizes):
            penalty = meds_penalty(n, self.coef, self.cap)
            s.info["meds"] = {"cluster_size": n, "penalty": penalty}
            out.append(meds_shape(self.correct_reward if c else self.wrong_reward, c, penalty, self.target))
        return out
