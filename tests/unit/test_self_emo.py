"""SELF-EMO by hand: the smoothed IoU of the spec, the recogniser's parse and its hostile cases, the group
consistency bonus, and an episode with a scripted recogniser role (flywheel, fluency gate, collusion metric)."""
from __future__ import annotations

import pytest

from lmrl.config import TaskConfig
from lmrl.envs.emotion_lines import LINES
from lmrl.envs.roles import register_role_clients
from lmrl.envs.self_emo import (EXPLICIT, LABELS, SelfEmoEnv, emotion_consistency, emotion_iou, parse_labels,
                                self_emo_task, smoothed_iou)
from lmrl.types import Sample


def said(text, labels):
    return Sample([], [], [], "stop", text=text, row={"labels": labels}, role="recogniser")


def test_the_specs_values():
    assert smoothed_iou({"joy", "surprise"}, {"joy"}, alpha=0.0) == 0.5  # |P∩G| = 1, |P∪G| = 2
    assert smoothed_iou({"joy", "surprise"}, {"joy"}) == pytest.approx(2 / 3)  # (1 + 1)/(2 + 1) = 0.6667


def test_the_recogniser_is_paid_for_what_it_names_after_its_marker_only():
    assert parse_labels("Emotions: Joy, surprise.") == {"joy", "surprise"}
    assert parse_labels("I think sadness. Emotions: anger") == {"anger"}  # the last marker's labels only
    assert parse_labels("joy, surprise") is None and parse_labels("Emotions: happy") is None
    assert emotion_iou(said("Emotions: joy", ["joy"])) == 1.0
    assert emotion_iou(said("Emotions: joy, joy, joy", ["joy", "surprise"])) == pytest.approx(2 / 3)  # (1+1)/(2+1)
    # hostile: naming every label does not score like the right one: (1 + 1)/(6 + 1)
    assert emotion_iou(said("Emotions: " + ", ".join(LABELS), ["joy"])) == pytest.approx(2 / 7)
    assert emotion_iou(said("", ["joy"])) == 0.0  # smoothing would pay an empty answer 1/2: it is unparsable, 0
    assert emotion_iou(said("Emotions: joyful", ["joy"])) == 0.0  # a label word, not a label
    assert emotion_iou(said("Emotions: joy", None)) is None  # a generated line outside the flywheel: no verdict


def test_the_group_bonus_goes_to_the_modal_set():
    group = [said("Emotions: joy", ["joy"]), said("Emotions: joy", ["joy"]),
             said("Emotions: joy, surprise", ["joy"]), said("no idea", ["joy"])]
    assert emotion_consistency(group, gamma=0.1) == pytest.approx([0.05, 0.05, 0.0, 0.0])  # 0.1 · 2/4
    tie = [said("Emotions: fear", ["fear"]), said("Emotions: anger", ["fear"]), said("x", None)]
    fear, anger, outside = emotion_consistency(tie)  # a tie: ("anger",) sorts first; 0.1 · 1/3
    assert fear == 0.0 and anger == pytest.approx(1 / 30) and outside is None
    assert emotion_consistency([said("?", ["joy"])]) == [0.0]


def test_the_task_ships_lines_that_do_not_name_their_emotions():
    assert 40 <= len(LINES) <= 80
    for context, line, labels in LINES:
        assert labels and set(labels) <= set(LABELS) and not EXPLICIT.search(line) and not EXPLICIT.search(context)
    data = self_emo_task(TaskConfig(name="self_emo", num_train=40, num_eval=8))
    assert len(data.train) == 40 and len(data.eval) == 8 and data.train[0]["labels"] == ["joy", "surprise"]
    with pytest.raises(ValueError, match="48 rows"):
        self_emo_task(TaskConfig(name="self_emo", num_train=48, num_eval=8))


class ScriptedRecogniser:
    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def chat(self, messages, max_tokens=None, temperature=None, seed=None, row=None, group=None):
        self.calls.append({"prompt": messages[-1]["content"], "seed": seed, "row": row, "group": group})
        return self.replies.pop(0)


@pytest.fixture
def episode():
    row = self_emo_task(TaskConfig(name="self_emo", num_train=1, num_eval=0)).train[0]  # target joy, surprise

    def play(reply, replies):
        recogniser = ScriptedRecogniser(replies)
        register_role_clients({"recogniser": recogniser})
        env = SelfEmoEnv(recogniser={"role": "recogniser"})
        messages, state = env.reset(row, seed=3)
        return messages, env.step(reply, state), recogniser

    yield play
    register_role_clients({})


def test_an_episode_pays_the_responder_the_recognisers_iou_and_feeds_the_flywheel(episode):
    messages, step, rec = episode("We won the whole thing, can you believe it?",
                                  ["Emotions: joy", "Emotions: joy, surprise"])
    assert "expresses: joy, surprise" in messages[0]["content"]
    assert step.done and step.reward == 1.0  # IoU_1({joy, surprise}, {joy, surprise}) = 3/3, fluent
    gold, generated = rec.calls
    assert gold["row"] == {"labels": ["joy", "surprise"], "kind": "gold"} and gold["group"] == "self_emo-0/gold"
    assert generated["row"]["labels"] == ["joy", "surprise"]  # 1.0 >= 0.8: the line enters the flywheel
    assert [gold["seed"], generated["seed"]] == [3 * 131 + 1, 3 * 131 + 2]
    assert "They hired me!" in gold["prompt"] and "can you believe it?" in generated["prompt"]
    for call in rec.calls:  # hostile: the recogniser is never told the set it is paid for
        asked = call["prompt"].split("Choose from:")[0]
        assert not any(label in asked.lower() for label in LABELS)
    assert step.info["metrics"] == {"env/iou": 1.0, "env/fluent": 1.0, "env/accepted": 1.0,
                                    "env/explicit_emotion": 0.0, "env/gold_iou": pytest.approx(2 / 3)}


def test_the_gate_the_flywheel_and_the_collusion_metric(episode):
    _, step, rec = episode("I am so happy and surprised today", ["Emotions: joy", "Emotions: joy"])
    assert step.reward == pytest.approx(2 / 3) and step.info["metrics"]["env/explicit_emotion"] == 1.0  # (1+1)/(2+1)
    assert rec.calls[1]["row"]["labels"] is None  # 0.67 < 0.8: outside the flywheel
    assert emotion_iou(said("Emotions: joy", rec.calls[1]["row"]["labels"])) is None
    _, step, _ = episode("Emotions: joy, surprise", ["Emotions: joy", "Emotions: joy, surprise"])
    assert step.reward == 0.0 and step.info["metrics"]["env/iou"] == 1.0  # hostile: an answer planted for the
    # recogniser to copy is not a line of dialogue (gate 0)
    _, step, _ = episode("Wow", ["Emotions: joy", "Emotions: joy, surprise"])
    assert step.reward == 0.0 and step.info["metrics"]["env/fluent"] == 0.0  # one word < min_words 3
    with pytest.raises(ValueError, match="recogniser must be"):
        SelfEmoEnv()
