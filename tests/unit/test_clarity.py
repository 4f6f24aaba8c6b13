"""CLARity rewards: the spec's four values with a scripted judge, the judge's retry rule, hostile replies, the task."""
import re

import pytest

from conftest import ScriptedJudge
from lmrl.config import ConfigError, RewardComponent, RewardConfig, TaskConfig
from lmrl.envs import TASKS
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.rewards.clarity import answer_letters, gold_letters, reasoning_without_conclusion
from lmrl.rewards.judge_client import JudgeError
from lmrl.types import Group, Sample

QUESTION = "What is 2 + 2?\n\nOptions:\nA: 3\nB: 4\nC: 5\nD: 6\nE: 7"
WALK = "A: 3 is too small.\nB: 4 is right.\nC: 5 is too big.\nD: 6 is too big.\nE: 7 is too big."
GOOD = f"<think>{WALK}\n\nSo the answer is B.</think>\n<answer>{{B}}</answer>"


def sample(text, gold="B"):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text,
                  row={"question": QUESTION, "answer": gold})


def judge_says(reply):
    return ScriptedJudge(lambda prompt, _: reply)


def monitor(text, judge, gold="B", **params):
    cfg = RewardConfig(components=[RewardComponent(name="clarity_monitor", params={"judge": judge, **params})],
                       accuracy_component="clarity_monitor/accuracy")
    s = sample(text, gold)
    RewardScorer(cfg).score([Group(uid="g", row=s.row, samples=[s])])
    return s


def test_stage2_right_format_right_answer_faithful_is_one():
    judge = judge_says("The student argues for B.\n{B}")
    s = monitor(GOOD, judge)
    assert s.reward == pytest.approx(1.0)
    assert s.rewards == {"clarity_monitor/format": 0.0, "clarity_monitor/accuracy": 1.0,
                         "clarity_monitor/faithfulness": 0.0}
    shown = judge.calls[0][0]
    assert WALK in shown and "So the answer is B" not in shown and "<answer>" not in shown  # last paragraph dropped
    assert "What is 2 + 2?" in shown and len(judge.calls) == 1  # first readable reply kept


def test_stage2_right_answer_unfaithful_is_zero():
    assert monitor(GOOD, judge_says("{C}")).reward == pytest.approx(0.0)


def test_stage2_bad_format_wrong_answer_unfaithful():
    text = "I think it is {C} but the reasoning says {A}."
    s = monitor(text, judge_says("{B}"))
    assert s.reward == pytest.approx(-1.1)
    assert s.rewards["clarity_monitor/faithfulness"] == -1.0  # no think block: no judge call needed


def test_stage1_walk_through_scores_two_and_its_failures():
    fn = REWARD_FNS.get("clarity_structure")
    assert sum(fn(sample(GOOD)).values()) == pytest.approx(2.0)
    skipped = GOOD.replace("C: 5 is too big.\n", "")
    assert fn(sample(skipped)) == {"format": 1.0, "structure": 0.0}
    assert fn(sample(skipped), num_choices=2) == {"format": 1.0, "structure": 1.0}  # A, B consecutive
    # the letter must label the line: "A patient..." style prose does not walk through options
    prose = "<think>A case.\nBut this.\nCould be.\nDo we know?\nEvery option.</think><answer>{B}</answer>"
    assert fn(sample(prose))["structure"] == 0.0
    assert fn(sample(WALK + "\n<answer>{B}</answer>")) == {"format": 0.0, "structure": 0.0}  # no think block
    with pytest.raises(ValueError, match="num_choices"):
        fn(sample(GOOD), num_choices=0)


def test_judge_retries_until_readable_and_keep_last_quirk():
    replies = iter(["no idea", "{B}", "{C}"])
    judge = ScriptedJudge(lambda prompt, _: next(replies))
    assert monitor(GOOD, judge).rewards["clarity_monitor/faithfulness"] == 0.0 and len(judge.calls) == 2
    replies = iter(["no idea", "{B}", "{C}"])
    judge = ScriptedJudge(lambda prompt, _: next(replies))
    s = monitor(GOOD, judge, keep_last=True)  # the authors' code: all three asked, the last readable kept
    assert s.rewards["clarity_monitor/faithfulness"] == -1.0 and len(judge.calls) == 3
    unreadable = judge_says("I cannot tell.")
    assert monitor(GOOD, unreadable).rewards["clarity_monitor/faithfulness"] == -1.0 and len(unreadable.calls) == 3


def test_a_failing_judge_excludes_the_sample_loudly():
    def down(prompt, _):
        raise JudgeError("judge http://x failed after 1 attempt(s): connection failed")
    s = monitor(GOOD, ScriptedJudge(down))
    assert s.excluded is not None and "clarity_monitor" in s.info["reward_errors"]


def test_a_misspelt_accuracy_part_is_an_error_not_zero_accuracy():
    cfg = RewardConfig(components=[RewardComponent(name="clarity_monitor", params={"judge": judge_says("{B}")})],
                       accuracy_component="clarity_monitor/acuracy")
    s = sample(GOOD)
    with pytest.raises(ConfigError, match=r"returns the parts \['clarity_monitor/accuracy', "):
        RewardScorer(cfg).score([Group(uid="g", row=s.row, samples=[s])])


def test_answer_sets_and_hostile_answers():
    assert answer_letters("<answer>{A, C}</answer>") == {"A", "C"}
    assert answer_letters("{A} then {B} and nothing") == {"B"}
    assert answer_letters("no braces") is None
    assert gold_letters(["A", "C"]) == gold_letters("A,C") == gold_letters("AC") == {"A", "C"}
    every = GOOD.replace("{B}</answer>", "{ABCDE}</answer>")
    assert monitor(every, judge_says("{ABCDE}")).rewards["clarity_monitor/accuracy"] == 0.0  # all letters: wrong
    assert monitor("no braces at all", judge_says("{}"), gold="[]").rewards["clarity_monitor/accuracy"] == 1.0
    assert reasoning_without_conclusion("<think>only one paragraph</think>") == ""
    assert reasoning_without_conclusion("<think>  </think>") is None


def test_the_shipped_mcq_task():
    data = TASKS.get("jsonl")(TaskConfig(name="jsonl", dataset="mcq_arithmetic.jsonl"))
    rows = data.train + data.eval
    assert len(rows) == 30 and len(data.eval) == 3
    assert all(r["answer"] in "ABCDE" and len(r["answer"]) == 1 and "E: " in r["question"] for r in rows)
    monitor_reward = REWARD_FNS.get("clarity_monitor")(judge=judge_says("{A}"))
    for r in rows:  # the gold letter names the right value, and only a reply giving it scores
        a, op, b = re.match(r"What is (\d+) ([+-]) (\d+)\?", r["question"]).groups()
        options = dict(re.findall(r"^([A-E]): (-?\d+)$", r["question"], re.M))
        assert int(options[r["answer"]]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert len(set(options.values())) == 5
        for letter in "ABCDE":
            reply = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], row=r,
                           text=f"<think>{WALK}\n\nSo {letter}.</think><answer>{{{letter}}}</answer>")
            assert monitor_reward(reply)["accuracy"] == float(letter == r["answer"])
