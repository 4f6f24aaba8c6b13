"""STC critique consistency: the spec's two values through the scorer, the parser, hostile replies, step F1."""
import time

import pytest

from lmrl.config import RewardComponent, RewardConfig
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.rewards.critique import parse_critiqued_steps, step_critique_f1, critique_f1_of_samples
from lmrl.types import Group, Sample


def sample(text, gold="12", **row):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text,
                  row={"question": "What is 5 + 7?", "answer": gold, **row})


def steps(*verdicts, answer="12"):
    body = "".join(f"<step>Step {i}: add.</step><critique>verdict: {v}; checked.</critique>\n"
                   for i, v in enumerate(verdicts))
    return body + f"Answer: {answer}"


def scored(text, gold="12", **params):
    cfg = RewardConfig(components=[RewardComponent(name="answer"),
                                   RewardComponent(name="critique_consistency", params=params)])
    s = sample(text, gold)
    RewardScorer(cfg).score([Group(uid="g", row=s.row, samples=[s])])
    return s


def test_spec_wrong_answer_flagged_step_scores_half():
    s = scored(steps("correct", "correct", "incorrect", answer="13"))
    assert s.rewards["answer"] == 0.0
    assert s.rewards["critique_consistency/consistency"] == pytest.approx(0.5)
    assert s.rewards["critique_consistency/format"] == 0.0
    assert s.reward == pytest.approx(0.5)


def test_spec_right_answer_with_a_flagged_step_scores_one():
    s = scored(steps("correct", "incorrect"))
    assert s.rewards["answer"] == 1.0 and s.rewards["critique_consistency/consistency"] == 0.0
    assert s.reward == pytest.approx(1.0)


def test_consistent_right_answer_and_knobs():
    assert scored(steps("correct", "correct")).reward == pytest.approx(1.5)
    assert scored(steps("correct", "incorrect"), signed=True).reward == pytest.approx(0.5)  # 1 - 0.5
    assert scored(steps("incorrect", "correct"), aggregate="last").reward == pytest.approx(1.5)
    assert scored(steps("correct", "correct"), lam=2.0).reward == pytest.approx(3.0)
    with pytest.raises(ValueError, match="aggregate"):
        REWARD_FNS.get("critique_consistency")(sample(steps("correct")), aggregate="mean")


def test_all_steps_flagged_on_a_wrong_answer_is_consistent():
    s = scored(steps("incorrect", "incorrect", "incorrect", answer="99"))
    assert s.rewards["critique_consistency/consistency"] == pytest.approx(0.5) and s.reward == pytest.approx(0.5)


def test_critiques_without_steps_lose_format_and_consistency():
    text = "<critique>verdict: correct; fine.</critique><critique>verdict: correct;</critique>Answer: 12"
    s = scored(text)
    assert s.rewards["critique_consistency/format"] == -1.0
    assert s.rewards["critique_consistency/consistency"] == 0.0
    assert s.reward == pytest.approx(0.0)  # 1 (answer) - 1 (format)


def test_a_step_without_its_critique_costs_one():
    text = "<step>5 + 7 = 12</step><critique>verdict: correct;</critique><step>so 12</step>Answer: 12"
    assert scored(text).reward == pytest.approx(0.0)
    assert scored("Answer: 12").reward == pytest.approx(0.0)  # no step at all
    assert scored("").reward == pytest.approx(-1.0)


def test_verdicts_hidden_inside_step_text_are_not_read():
    text = "<step>verdict: correct. 5 + 7 = 13</step><critique>verdict: incorrect; off by one.</critique>Answer: 13"
    reply = parse_critiqued_steps(text)
    assert reply.well_formed and reply.verdicts == [0]
    assert scored(text).reward == pytest.approx(0.5)  # wrong answer, flagged: consistent
    wrapped = "<step>x <critique>verdict: correct</critique></step><critique>verdict: correct</critique>Answer: 13"
    assert scored(wrapped).rewards["critique_consistency/format"] == -1.0  # a critique nested in a step


def test_repeated_verdicts_cannot_game_the_product():
    # a second verdict inside one critique makes it unreadable: no consistency credit either way
    text = ("<step>5 + 7 = 13</step><critique>verdict: incorrect; verdict: correct; verdict: correct</critique>"
            "Answer: 13")
    assert parse_critiqued_steps(text).verdicts == [None]
    s = scored(text)
    assert s.rewards["critique_consistency/consistency"] == 0.0 and s.reward == 0.0
    # extra critiques after one step break the alternation
    doubled = "<step>a</step><critique>verdict: correct</critique><critique>verdict: correct</critique>Answer: 12"
    assert scored(doubled).rewards["critique_consistency/format"] == -1.0
    # a verdict that is not the critique's first words does not count
    late = "<step>a</step><critique>looks fine. verdict: correct</critique>Answer: 12"
    assert parse_critiqued_steps(late).verdicts == [None] and scored(late).reward == pytest.approx(1.0)


def test_unclosed_and_stray_tags_are_malformed():
    for text in ["<step>a</step><critique>verdict: correct Answer: 12",
                 "<step>a<critique>verdict: correct</critique>Answer: 12",
                 "<step>a</step> so <critique>verdict: correct</critique>Answer: 12",
                 "<step>a</step><critique>verdict: correct</critique></step>Answer: 12"]:
        assert not parse_critiqued_steps(text).well_formed, text
        assert scored(text).rewards["critique_consistency/format"] == -1.0


def test_tags_and_verdicts_are_case_insensitive_and_tail_is_the_final_answer():
    reply = parse_critiqued_steps("<STEP>a</STEP>\n<Critique> Verdict: Correct; ok</Critique>\nAnswer: 12")
    assert reply.well_formed and reply.verdicts == [1] and reply.tail.strip() == "Answer: 12"


def test_grader_must_run_first():
    with pytest.raises(ValueError, match="list 'answer' before critique_consistency"):
        REWARD_FNS.get("critique_consistency")(sample(steps("correct")))


def test_one_megabyte_reply_is_parsed_quickly():
    text = steps(*["correct"] * 20000) + "x" * (1 << 20)
    started = time.perf_counter()
    s = scored(text)
    assert time.perf_counter() - started < 5.0
    assert s.rewards["critique_consistency/format"] == 0.0
    assert s.rewards["critique_consistency/consistency"] in (0.0, 0.5)


def test_step_critique_f1_hand_computed():
    # steps: (flagged, wrong) = (T,T) (F,T) (T,F) (F,F) | (T,T) → tp 2, fp 1, fn 1 → F1 = 4/6
    assert step_critique_f1([[0, 1, 0, 1], [0]], [[False, False, True, True], [False]]) == pytest.approx(2 / 3)
    assert step_critique_f1([[1, 1]], [[True, True]]) == 1.0
    assert step_critique_f1([[1]], [[True, False]]) == 0.0  # a missing verdict does not flag the wrong step
    assert step_critique_f1([[None, 0]], [[False, False]]) == pytest.approx(2 / 3)


def test_critique_f1_of_samples_reads_row_labels():
    labelled = sample(steps("incorrect", "correct"), step_labels=[False, True])
    assert critique_f1_of_samples([labelled, sample(steps("correct"))]) == 1.0
    assert critique_f1_of_samples([sample(steps("correct"))]) is None
