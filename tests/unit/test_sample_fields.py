"""`Sample.text` and `Sample.row` are typed fields; user code reading `info["text"]` / `info["row"]` sees them."""
from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from lmrl.data.demonstrations import SAMPLE_SOURCES
from lmrl.data.guidance import replayed
from lmrl.data.replay import rollout_records
from lmrl.envs.episodes import Episode
from lmrl.loading import build_config
from lmrl.rewards import GROUP_REWARD_FNS, REWARD_FNS, RewardScorer
from lmrl.types import Group, Origin, Sample

ROW = {"uid": "u", "question": "What is 3 + 4?", "answer": "7", "prompt_ids": [1, 2]}

USER_REWARDS = '''
SEEN = []


def right(sample, **_):
    """A reward as users write it: the reply and the task row from `sample.info`."""
    SEEN.append((sample.info["text"], sample.info.get("row")))
    return float(sample.info["row"]["answer"] in sample.info["text"])
'''


def sample(text: str = "Answer: 7", row: dict | None = None, **kw) -> Sample:
    return Sample([1, 2], [5, 6], [-0.5, -0.25], text=text, row=ROW if row is None else row, **kw)


def seen_through_info(x: Sample) -> tuple:
    return x.info["text"], x.info["row"], x.info.get("text"), x.info.get("row")


def test_info_reads_and_writes_the_fields():
    x = sample(info={"metrics": {"env/turns": 1.0}})
    assert seen_through_info(x) == (x.text, x.row, x.text, x.row) and x.info["row"] is x.row
    assert "text" in x.info and "row" in x.info and x.info["metrics"] == {"env/turns": 1.0}
    assert dict(x.info) == {"text": "Answer: 7", "row": ROW, "metrics": {"env/turns": 1.0}} and len(x.info) == 3
    x.info["text"] = "Answer: 8"
    assert x.text == "Answer: 8"
    x.text = "Answer: 9"
    assert x.info["text"] == "Answer: 9"
    bare = Sample([1], [2], [0.0])
    assert (bare.text, bare.row, bare.info["text"], bare.info["row"]) == ("", {}, "", {})


def test_text_and_row_live_only_in_the_fields():
    with pytest.raises(ValueError, match=r"Sample.info\['text'\] is the field Sample.text: pass text="):
        Sample([1], [2], [0.0], info={"text": "7"})
    with pytest.raises(ValueError, match=r"Sample.info\['row'\] is the field Sample.row"):
        Sample([1], [2], [0.0], info={"row": ROW})
    with pytest.raises(TypeError, match="cannot be deleted"):
        del sample().info["row"]


def test_user_reward_and_group_reward_read_the_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fields_rewards.py").write_text(USER_REWARDS)
    group_seen = []

    def texts_and_rows(samples, **_):
        group_seen.extend((s.info["text"], s.info["row"]) for s in samples)
        return [float(s.info["row"]["answer"] in s.info["text"]) for s in samples]

    monkeypatch.setitem(GROUP_REWARD_FNS._items, "fields_group", texts_and_rows)
    cfg = build_config({"reward": {"components": [{"name": "fields_rewards.py:right"}, {"name": "fields_group"}],
                                   "accuracy_component": "fields_rewards.py:right"}}).reward
    samples = [sample("Answer: 7"), sample("Answer: 8")]
    RewardScorer(cfg).score([Group("u", ROW, samples)])
    user_seen = REWARD_FNS.get("fields_rewards.py:right").__globals__["SEEN"]
    assert user_seen == group_seen == [("Answer: 7", ROW), ("Answer: 8", ROW)]
    assert [x.rewards for x in samples] == [{"fields_rewards.py:right": 1.0, "fields_group": 1.0},
                                            {"fields_rewards.py:right": 0.0, "fields_group": 0.0}]


def test_copies_keep_the_fields_and_info_reads_the_copy():
    x = sample(info={"metrics": {"m": 1.0}})
    y = dataclasses.replace(x, text="Answer: 8")
    assert (y.text, y.info["text"], y.info["row"]) == ("Answer: 8", "Answer: 8", ROW)
    assert x.info["text"] == "Answer: 7" and y.info["metrics"] is x.info["metrics"]
    for z in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):  # the async queue's checkpoint pickles samples
        assert z == x and seen_through_info(z) == (x.text, x.row, x.text, x.row)
        z.text = "changed"
        assert z.info["text"] == "changed" and x.info["text"] == "Answer: 7"


def test_recorded_rollouts_replay_with_their_text_and_row():
    (record,) = json.loads(json.dumps(rollout_records(3, [Group("u", ROW, [sample("Answer: 7", reward=1.0)])])))
    source = SAMPLE_SOURCES.get("replay")(build_config({"data": {"demonstrations": "replay"}}), None, None)
    (group,), _ = source([Group(record["uid"], record, [sample("fresh", record)])])
    (back,) = group.samples
    assert back.origin is Origin.REPLAYED and back.text == back.info["text"] == "Answer: 7"
    assert back.row is record and back.info["row"]["answer"] == "7"


def test_guided_replay_and_episode_samples_set_the_fields():
    guided_row = {**ROW, "question": "What is 3 + 4? Hint: count on."}
    original = replayed(sample("Answer: 7", guided_row, info={"metrics": {"m": 1.0}}), ROW, [1, 2], Origin.GUIDED)
    assert seen_through_info(original) == ("Answer: 7", ROW, "Answer: 7", ROW)
    assert original.info["guided_prompt"] == guided_row["question"] and original.info["metrics"] == {"m": 1.0}
    episode = Episode(row=ROW, seed=0, prompt_ids=[1], ids=[5, 6], mask=[1, 1], logprobs=[-0.5, -0.5],
                      versions=[0, 0], turn_rewards=[1.0], replies=["Answer: 7"], turn_lengths=[2], turn_starts=[0])
    played = episode.to_sample()
    assert seen_through_info(played) == ("Answer: 7", ROW, "Answer: 7", ROW) and played.info["env_return"] == 1.0


def test_a_sample_pickled_before_text_and_row_were_fields_unpickles_with_them():
    import pickle

    from lmrl.types import Sample

    sample = Sample([1], [2, 3], [-0.5, -0.5], text="7", row={"answer": "7"}, info={"metrics": {"m": 1.0}})
    state = dict(sample.__dict__)  # as an earlier version pickled it: the two values inside a plain info dict
    del state["text"], state["row"]
    state["info"] = {"text": "7", "row": {"answer": "7"}, "metrics": {"m": 1.0}}
    old = Sample.__new__(Sample)
    old.__dict__.update(state)
    payload = pickle.dumps(old)  # pickles the plain __dict__ of the old layout
    again = pickle.loads(payload)
    assert (again.text, again.row) == ("7", {"answer": "7"})
    assert again.info["text"] == "7" and again.info["metrics"] == {"m": 1.0} and len(again.info) == 3
    new = pickle.loads(pickle.dumps(sample))
    assert (new.text, new.row, dict(new.info)) == ("7", {"answer": "7"}, dict(sample.info))
