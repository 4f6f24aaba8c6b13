"""Reward components as Ray tasks (`reward.workers: ray`): the same scores as in process, and a hung
component's task is killed at its timeout, the sample excluded, the scorer still working."""
from __future__ import annotations

import time

import pytest

from lmrl.config import RewardConfig
from lmrl.rewards import RewardScorer
from lmrl.types import Group, Sample

ray = pytest.importorskip("ray", reason="the ray extra is installed by .ci/run")

REWARDS = '''
import time


def has_seven(sample, **_):
    return float("7" in sample.info["text"])


def hangs_on_nine(sample, **_):
    if "9" in sample.info["text"]:
        time.sleep(600)
    return 1.0
'''


def groups():
    texts = ["a 7", "no", "9 hangs", "77"]
    return [Group(uid="g", row={"question": "q"},
                  samples=[Sample([1], [2], [0.0], text=t) for t in texts])]


def scorer(tmp_path, workers, name):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    component = f"{path}:{name}"
    return RewardScorer(RewardConfig(components=[{"name": component, "timeout_s": 8.0}], accuracy_component=component,
                                     workers=workers, concurrency=2))


def test_ray_tasks_score_like_the_process_and_a_hung_task_is_killed(tmp_path):
    local, remote = groups(), groups()
    scorer(tmp_path, "threads", "has_seven").score(local)
    scorer(tmp_path, "ray", "has_seven").score(remote)
    assert [x.reward for x in remote[0].samples] == [x.reward for x in local[0].samples] == [1.0, 0.0, 0.0, 1.0]

    hung = groups()
    start = time.monotonic()
    metrics = scorer(tmp_path, "ray", "hangs_on_nine").score(hung)
    assert time.monotonic() - start < 60
    assert [x.excluded is not None for x in hung[0].samples] == [False, False, True, False]
    assert metrics["excluded"] == 0.25
