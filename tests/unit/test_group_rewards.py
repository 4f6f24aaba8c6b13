"""Group rewards: majority vote, CoRE consensus, MEDS memory shaping, MINT tactic novelty.

Pins the specs' hand-computed values (CoRE §1.2, MINT §1.16, MEDS algorithms §14) and our own.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmrl.algos.advantages import ADVANTAGES
from lmrl.config import RewardConfig
from lmrl.rewards import GROUP_REWARD_FNS, RewardScorer
from lmrl.rewards.group import MEDS, answer_classes, consensus_rewards, hdbscan_labels, meds_penalty, meds_shape
from lmrl.rewards.novelty import minmax, tactic_counts, tactic_entropy, tactic_kl
from lmrl.types import Group, Sample

majority_vote = GROUP_REWARD_FNS.get("majority_vote")
consensus = GROUP_REWARD_FNS.get("consensus")
novelty = GROUP_REWARD_FNS.get("novelty")


def make(text: str, gold: str | None = "7", prompt=(1, 2), logprobs=(-0.5,), completion_len: int = 5) -> Sample:
    row = {"question": "q"} if gold is None else {"question": "q", "answer": gold}
    return Sample(list(prompt), [3] * completion_len, list(logprobs), text=text, row=row)


def group_of(*answers: str, **kw) -> list[Sample]:
    return [make(f"Answer: {a}", **kw) for a in answers]


# --- majority_vote ------------------------------------------------------------------------------

def test_majority_vote_rewards_the_most_frequent_answer():
    assert majority_vote(group_of("5", "5", "7", "5", "3")) == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_majority_vote_matches_numbers_numerically_and_counts_missing_answers_as_dissent():
    samples = [make("Answer: 12"), make("so it is 12.0"), make("Answer: 12.00"), make("no idea"), make("Answer: 3")]
    assert majority_vote(samples, fallback="last_number") == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert samples[0].info["majority_vote"]["agreement"] == pytest.approx(3 / 5)
    assert majority_vote(samples) == [1.0, 0.0, 1.0, 0.0, 0.0]  # without the fallback, "12.0" has no marker


def test_majority_vote_complete_only_ignores_cut_off_replies():
    samples = [make("so 12"), make("then 12"), make("Answer: 5"), make("it is 5")]
    samples[0].finish_reason = samples[1].finish_reason = "length"
    assert majority_vote(samples, fallback="last_number") == [1.0, 1.0, 0.0, 0.0]  # ties: first seen
    assert majority_vote(samples, fallback="last_number", complete_only=True) == [0.0, 0.0, 1.0, 1.0]


def test_majority_vote_exact_compare_and_custom_pattern():
    samples = [make("#### 4"), make("#### 4.0"), make("#### 4.0"), make("#### x")]
    assert majority_vote(samples, pattern=r"####\s*(\S+)", compare="exact") == [0.0, 1.0, 1.0, 0.0]
    assert majority_vote(samples, pattern=r"####\s*(\S+)", compare="match") == [1.0, 1.0, 1.0, 0.0]


def test_majority_vote_ties_go_to_the_first_answer_seen():
    assert majority_vote(group_of("8", "9", "9", "8")) == [1.0, 0.0, 0.0, 1.0]


def test_majority_vote_gate_gives_zero_or_no_verdict():
    samples = group_of("1", "2", "2", "3", "4")  # agreement 2/5
    assert majority_vote(samples, min_agreement=0.4) == [0.0, 1.0, 1.0, 0.0, 0.0]
    assert majority_vote(samples, min_agreement=0.5) == [0.0] * 5
    assert majority_vote(samples, min_agreement=0.5, below_agreement="exclude") == [None] * 5
    assert majority_vote([make("nothing here")] * 3) == [0.0] * 3
    with pytest.raises(ValueError, match="below-gate"):
        majority_vote(samples, min_agreement=0.9, below_agreement="drop")


def test_majority_vote_never_reads_the_gold_answer():
    answers = ("5", "5", "7", "6")
    with_gold = majority_vote(group_of(*answers, gold="7"))
    wrong_gold = majority_vote(group_of(*answers, gold="not a number"))
    no_gold = majority_vote(group_of(*answers, gold=None))
    assert with_gold == wrong_gold == no_gold == [1.0, 1.0, 0.0, 0.0]


def test_bad_knobs_fail_clearly():
    with pytest.raises(ValueError, match="fallback"):
        majority_vote(group_of("1"), fallback="first_number")
    with pytest.raises(ValueError, match="compare"):
        majority_vote(group_of("1"), compare="fuzzy")


def test_majority_vote_with_a_weight_zero_gold_component_in_the_scorer():
    cfg = RewardConfig(components=[{"name": "majority_vote"}, {"name": "answer", "weight": 0.0}])
    samples = group_of("5", "5", "7", "6", gold="7")
    RewardScorer(cfg).score([Group("g", samples[0].row, samples)])
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 0.0]  # the gold-correct "7" earns nothing
    assert [s.rewards["answer"] for s in samples] == [0.0, 0.0, 1.0, 0.0]  # but accuracy is logged


# --- consensus (CoRE) ---------------------------------------------------------------------------

def test_core_spec_answer_only_case():
    """Spec §1.2: answers [A,A,A,B,B] → x = (1/3,1/3,1/3,0,0), r = [1,1,1,0,0], cohesiveness 2/3."""
    ids = [0, 0, 0, 1, 1]
    a = np.array([[float(i == j) for j in ids] for i in ids])
    x, r, cohesiveness = consensus_rewards(a)
    assert x == pytest.approx([1 / 3] * 3 + [0, 0], abs=1e-6)
    assert r == pytest.approx([1, 1, 1, 0, 0], abs=1e-6)
    assert cohesiveness == pytest.approx(2 / 3, abs=1e-6)
    assert consensus(group_of("A", "A", "A", "B", "B"), compare="exact") == pytest.approx([1, 1, 1, 0, 0], abs=1e-6)


def test_core_spec_confident_minority_wins():
    """Spec §1.2: with A_{B1,B2} = 3 the dynamics converge to x = (0,0,0,1/2,1/2)."""
    ids = [0, 0, 0, 1, 1]
    a = np.array([[float(i == j) for j in ids] for i in ids])
    a[3, 4] = a[4, 3] = 3.0
    x, r, cohesiveness = consensus_rewards(a)
    assert x == pytest.approx([0, 0, 0, 0.5, 0.5], abs=1e-6)
    assert r[3:] == pytest.approx([1, 1], abs=1e-6) and max(r[:3]) < 1e-3
    assert cohesiveness == pytest.approx(1.5, abs=1e-6)


def test_core_reduces_to_majority_vote_with_answer_only_affinity():
    rng = np.random.default_rng(0)
    for _ in range(20):
        answers = [str(v) for v in rng.integers(0, 3, size=7)]
        counts = sorted((answers.count(v) for v in set(answers)), reverse=True)
        if len(counts) > 1 and counts[0] == counts[1]:
            continue  # a tie is a fixed point of the dynamics, not a vote
        got = consensus(group_of(*answers))
        assert got == pytest.approx(majority_vote(group_of(*answers)), abs=1e-4)


def test_core_confidence_lets_a_confident_minority_win():
    unsure = [make("Answer: 5", logprobs=(-2.3, -2.3)) for _ in range(3)]  # mean prob 0.1
    sure = [make("Answer: 9", logprobs=(0.0, 0.0)) for _ in range(2)]  # mean prob 1
    samples = unsure + sure
    r = consensus(samples, confidence="mean_prob")
    assert r[3:] == pytest.approx([1, 1], abs=1e-6) and max(r[:3]) < 1e-3
    assert samples[0].info["consensus"]["label_class"] == 1
    assert majority_vote(samples) == [1, 1, 1, 0, 0]


def test_core_reasoning_similarity_and_gate():
    samples = [make("3 plus 4 is 7. Answer: 7"), make("3 plus 4 is 7 so Answer: 7"), make("Answer: 2"),
               make("3 plus 4 makes 8. Answer: 8")]
    r = consensus(samples, similarity_weight=0.5)
    assert r[0] == pytest.approx(1.0, abs=1e-6) and r[1] == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < r[3] < 1.0  # graded: similar reasoning, other answer
    assert r[2] < r[3]
    assert consensus(samples, min_cohesiveness=5.0) == [0.0] * 4
    assert consensus(samples, min_cohesiveness=5.0, below_cohesiveness="exclude") == [None] * 4
    assert consensus(group_of("1", "2", "3")) == [0.0] * 3  # no edges: no verdict
    with pytest.raises(ValueError, match="symmetric"):
        consensus_rewards(np.array([[0.0, 1.0], [0.0, 0.0]]))


def test_answer_classes():
    assert answer_classes(["1", None, "1.0", "x", "X "]) == [0, None, 0, 1, 1]
    assert answer_classes(["1", "1.0"], compare="exact") == [0, 1]


# --- MEDS ---------------------------------------------------------------------------------------

def test_meds_spec_penalties_scores_and_advantages():
    """Algorithms §14: r = [1,-1,-1,-1], cluster sizes [-, 0, 3, 10] → P = [0, 0, 0.1386, 0.2]."""
    penalties = [0.0] + [meds_penalty(n) for n in (0, 3, 10)]
    assert penalties == pytest.approx([0, 0, 0.1386, 0.2], abs=1e-4)
    scores = [meds_shape(1.0, True, 0.0)] + [meds_shape(-1.0, False, p) for p in penalties[1:]]
    assert scores == pytest.approx([1, -1, -1.1386, -1.2], abs=1e-4)
    adv = ADVANTAGES.get("grpo")(torch.tensor(scores).unsqueeze(1), torch.zeros(4, dtype=torch.long), torch.ones(4, 1))
    assert adv.squeeze(1).tolist() == pytest.approx([1.495, -0.392, -0.523, -0.581], abs=1e-3)
    assert meds_shape(1.0, True, meds_penalty(3), target="both") == pytest.approx(0.878, abs=1e-3)
    assert meds_shape(1.0, True, meds_penalty(3), target="wrong") == 1.0
    assert meds_shape(-1.0, False, 0.5, target="right") == -1.0
    with pytest.raises(ValueError, match="target"):
        meds_shape(1.0, True, 0.1, target="all")


def test_hdbscan_labels_match_hand_worked_clusters():
    """Single linkage with min_cluster_size=2: two tight pairs, one outlier (checked against scikit-learn)."""
    labels = hdbscan_labels(np.array([[0.0], [0.1], [5.0], [5.1], [20.0]]))
    assert labels.tolist() == [0, 0, 1, 1, -1]
    labels = hdbscan_labels(np.array([[0.0], [0.1], [0.3], [5.0], [5.1], [5.15], [20.0]]), min_cluster_size=3)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, -1]
    assert hdbscan_labels(np.array([[1.0, 0.0]])).tolist() == [-1]
    assert hdbscan_labels(np.array([[1.0, 0.0]] * 4)).tolist() == [-1] * 4  # one blob is no cluster


def test_meds_memory_penalises_a_recurring_wrong_answer_across_steps():
    meds = MEDS()
    first = meds(group_of("7", "5", "5", "6", "6"))  # gold 7
    assert first == [1.0, -1.0, -1.0, -1.0, -1.0]  # no history yet
    second_group = group_of("7", "5", "6")
    second = meds(second_group)
    p2 = 0.1 * math.log(3)  # the 3 nearest stored errors vote for the cluster {5, 5} of size 2
    assert second == pytest.approx([1.0, -1 - p2, -1 - p2])
    assert second_group[1].info["meds"]["cluster_size"] == 2
    other_prompt = meds(group_of("5", "5", prompt=(9,)))
    assert other_prompt == [-1.0, -1.0]  # memories are per prompt


def test_meds_memory_survives_a_checkpoint_round_trip_through_the_scorer():
    cfg = RewardConfig(components=[{"name": "meds"}], accuracy_component="meds")
    scorer = RewardScorer(cfg)
    scorer.score([Group(uid="a", row={"question": "q", "answer": "7"}, samples=group_of("7", "5", "5", "6", "6"))])
    restored = RewardScorer(cfg)
    restored.load_state_dict(torch.load(_saved(scorer.state_dict()), weights_only=False))
    groups = [Group(uid="a", row={"question": "q", "answer": "7"}, samples=group_of("7", "5", "6"))]
    restored.score(groups)
    p2 = 0.1 * math.log(3)  # as without the round trip (test above): the memory came back
    assert [x.rewards["meds"] for x in groups[0].samples] == pytest.approx([1.0, -1 - p2, -1 - p2])


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_meds_noise_and_correctness_from_a_component():
    meds = MEDS(noise_as_cluster=False, correctness_component="majority_vote", correct_reward=1.0, wrong_reward=0.0)
    samples = group_of("4", "4", "4", "3")
    for s, v in zip(samples, majority_vote(samples)):
        s.rewards["majority_vote"] = v
    assert meds(samples) == [1.0, 1.0, 1.0, 0.0]
    again = group_of("4", "4", "4", "3")
    for s, v in zip(again, majority_vote(again)):
        s.rewards["majority_vote"] = v
    assert meds(again) == [1.0, 1.0, 1.0, 0.0]  # a lone stored error is noise: no penalty
    with pytest.raises(ValueError, match="listed before"):
        MEDS(correctness_component="missing")(group_of("1"))


def test_meds_info_feature_and_knob_errors():
    meds = MEDS(feature="info:vec", target="both")
    samples = [make("Answer: 1", gold="1"), make("Answer: 1", gold="1")]
    for s in samples:
        s.info["vec"] = [1.0, 0.0, 0.5]
    assert meds(samples) == [1.0, 1.0]
    assert meds(samples) == pytest.approx([1 / (1 + 0.1 * math.log(3))] * 2)  # both stored points are noise: n = 2
    with pytest.raises(ValueError, match="feature"):
        MEDS(feature="hidden")
    with pytest.raises(ValueError, match="has no"):
        MEDS(feature="info:nope")([make("Answer: 1")])


# --- novelty (MINT) -----------------------------------------------------------------------------

NAMES = ["information", "assistance", "advice", "validation", "emotional_expression", "paraphrasing",
         "self_disclosure", "questioning", "reappraisal", "empowerment"]


def test_mint_spec_kl_and_entropy():
    """Spec §1.16: h={validation:2}: c={validation:2} → KL 0; c={advice:2} → KL 2.030; H = 0.693."""
    assert tactic_kl({"validation": 2}, {"validation": 2}, NAMES) == pytest.approx(0.0, abs=1e-12)
    assert tactic_kl({"advice": 2}, {"validation": 2}, NAMES) == pytest.approx(2.030, abs=1e-3)
    assert tactic_entropy({"advice": 1, "validation": 1}) == pytest.approx(0.693, abs=1e-3)
    assert tactic_kl({}, {"validation": 2}, NAMES) == 0.0
    assert tactic_kl({"advice": 50}, {"validation": 50}, NAMES, alpha=1e-6) == 5.0  # capped


def test_minmax_and_tagging():
    assert minmax([1.0, 3.0, 2.0]) == [0.0, 1.0, 0.5]
    assert minmax([2.0, 2.0]) == [0.5, 0.5]
    counts = tactic_counts("It sounds like a hard week. You could try a walk. How do you feel?", {
        "paraphrasing": r"sounds like", "advice": r"you could", "questioning": r"\?"})
    assert counts == {"paraphrasing": 1, "advice": 1, "questioning": 1}


TACTICS = {"advice": r"you could", "validation": r"makes sense"}


def test_novelty_against_the_row_history():
    hist = {"tactic_last_turn_counts": {"validation": 2}}
    samples = [make("That makes sense. It makes sense.", completion_len=10),
               make("You could rest. You could walk.", completion_len=10),
               make("You could rest. That makes sense.", completion_len=400)]
    for s in samples:
        s.row.update(hist)
    # entropy: [0, 0, ln 2] → normalised [0, 0, 1]
    kl = [tactic_kl(c, {"validation": 2}, list(TACTICS)) for c in ({"validation": 2}, {"advice": 2},
                                                                   {"advice": 1, "validation": 1})]
    kl_hat = minmax(kl)
    r = novelty(samples, tactics=TACTICS)
    assert r[0] == pytest.approx(kl_hat[0] + 0.0)
    assert r[1] == pytest.approx(kl_hat[1] + 0.0)
    assert r[2] == pytest.approx((kl_hat[2] + 1.0) * 200 / 400)  # length scaling min(1, 200 / 400)
    assert kl_hat[:2] == [0.0, 1.0]


def test_novelty_group_history_quality_and_label_leak():
    samples = [make("You could rest.", gold=None), make("You could rest.", gold=None),
               make("That makes sense. **Validation** you could rest.", gold=None)]
    for s, q in zip(samples, (0.0, 1.0, 2.0)):
        s.rewards["quality"] = q
    r = novelty(samples, tactics=TACTICS, history="group", quality_component="quality", diversity_weight=0.5)
    names = list(TACTICS)
    kl = minmax([tactic_kl({"advice": 1}, {"advice": 1, "validation": 1}, names),
                 tactic_kl({"advice": 1}, {"advice": 1, "validation": 1}, names),
                 tactic_kl({"advice": 1, "validation": 1}, {"advice": 2}, names)])
    ent = minmax([0.0, 0.0, math.log(2)])
    expected = [q + 0.5 * (k + e) for q, k, e in zip((0.0, 0.5, 1.0), kl, ent)]
    expected[2] -= 2.0  # prints a tactic label
    assert r == pytest.approx(expected)
    with pytest.raises(ValueError, match="history"):
        novelty(samples, tactics=TACTICS, history="previous")
    with pytest.raises(ValueError, match="listed before"):
        novelty(samples, tactics=TACTICS, quality_component="rm")
    with pytest.raises(ValueError, match="has no"):
        novelty(samples, tactics=TACTICS, history="row")


def test_meds_is_built_once_per_scorer_and_remembers_across_calls():
    scorer = RewardScorer(RewardConfig(components=[{"name": "meds", "params": {"coef": 0.5}}]))
    first, second = group_of("7", "5", "5", "6", "6"), group_of("5")
    scorer.score([Group("g", first[0].row, first)])
    scorer.score([Group("g", second[0].row, second)])
    assert [s.reward for s in first] == [1.0, -1.0, -1.0, -1.0, -1.0]
    assert second[0].reward == pytest.approx(-1 - 0.5 * math.log(3))
