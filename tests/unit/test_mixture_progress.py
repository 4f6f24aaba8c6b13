"""Mixture shares by learning progress (`mixture.sampling: progress`): the weights over three steps by hand, the
window sliding, the floor, the score a task's progress follows, and the largest share a task is checked for."""
import pytest

from lmrl.config import MixtureConfig
from lmrl.data.mixture import LearningProgress, task_score
from lmrl.envs.mixture import MixtureEntry, most_share
from lmrl.types import Group, Sample

PRIOR = {"a": 0.5, "b": 0.5}  # weights 1 and 1


def progress(**knobs) -> LearningProgress:
    knobs = {"progress_window": 2, "progress_smoothing": 0.5, "progress_floor": 0.2, **knobs}
    return LearningProgress(MixtureConfig(sampling="progress", **knobs), ["a", "b"])


def test_the_weights_over_three_steps_by_hand():
    lp = progress()
    # step 1: a 0.25, b 0.5; one score each, progress 0, m = 0 -> the weight shares
    lp.observe("a", 0.25), lp.observe("b", 0.5)
    assert lp.shares(PRIOR) == PRIOR
    # step 2: a 0.5 (|0.5 - 0.25| = 0.25, m_a = 0.5·0 + 0.5·0.25 = 0.125), b 0.5 (m_b = 0)
    # p_a = 0.2·0.5 + 0.8·0.125/0.125 = 0.9, p_b = 0.2·0.5 + 0 = 0.1
    lp.observe("a", 0.5), lp.observe("b", 0.5)
    assert lp.shares(PRIOR) == pytest.approx({"a": 0.9, "b": 0.1})
    # step 3: window 2 keeps three scores: a [0.25, 0.5, 0.5] -> 0.25, m_a = 0.0625 + 0.125 = 0.1875;
    # b [0.5, 0.5, 0.0] -> 0.5, m_b = 0 + 0.25 = 0.25; Σm = 0.4375
    # p_a = 0.1 + 0.8·0.1875/0.4375 = 0.442857, p_b = 0.1 + 0.8·0.25/0.4375 = 0.557143
    lp.observe("a", 0.5), lp.observe("b", 0.0)
    assert lp.shares(PRIOR) == pytest.approx({"a": 0.442857, "b": 0.557143}, abs=1e-6)
    assert lp.ema == pytest.approx({"a": 0.1875, "b": 0.25})
    # step 4: a's 0.25 leaves the window: [0.5, 0.5, 0.5] -> 0, m_a = 0.09375
    lp.observe("a", 0.5)
    assert lp.history["a"] == [0.5, 0.5, 0.5] and lp.ema["a"] == pytest.approx(0.09375)


def test_the_floor_keeps_a_task_without_progress_drawn_and_a_resumed_state_is_the_same():
    lp = progress(progress_floor=0.1, progress_window=1)
    for score in (0.0, 1.0, 0.0):  # a moves, b never does
        lp.observe("a", score), lp.observe("b", 0.3)
    # b's share is its floor 0.1·0.5 = 0.05, a the rest
    assert lp.shares(PRIOR) == pytest.approx({"a": 0.95, "b": 0.05})
    assert progress(progress_floor=1.0).shares(PRIOR) == PRIOR  # floor 1: the weights alone
    again = progress(progress_floor=0.1, progress_window=1)
    again.load_state_dict(lp.state_dict())
    lp.observe("b", 0.9), again.observe("b", 0.9)
    assert again.shares(PRIOR) == lp.shares(PRIOR) and again.history == lp.history


def sample(reward, correct=None):
    s = Sample(prompt_ids=[1], completion_ids=[2], behaviour_logprobs=[0.0], text="x", row={})
    s.reward = reward
    if correct is not None:
        s.rewards = {"answer": float(correct)}
    return s


def test_a_task_score_is_its_accuracy_else_its_mean_reward():
    graded = [Group("g1", {}, [sample(0.2, 1), sample(0.7, 0)]), Group("g2", {}, [sample(0.1, 1), sample(0.0, 1)])]
    assert task_score(graded, "answer") == 0.75  # 3 of 4 correct, whatever the rewards
    ungraded = [Group("g", {}, [sample(0.2), sample(0.6)])]
    assert task_score(ungraded, "answer") == pytest.approx(0.4)  # no verdict: the mean reward
    excluded = sample(1.0, 1)
    excluded.excluded = "reward error"
    assert task_score([Group("g", {}, [excluded])], "answer") is None


def test_the_largest_share_a_task_may_get_is_its_floor_plus_the_rest():
    tasks = [MixtureEntry("a", 3.0, None), MixtureEntry("b", 1.0, None)]
    # weight share of b 1/4; floor 0.2: 0.2·0.25 + 0.8 = 0.85
    assert most_share(MixtureConfig(sampling="progress"), tasks[1], tasks) == pytest.approx(0.85)
    assert most_share(MixtureConfig(), tasks[1], tasks) == 0.25
