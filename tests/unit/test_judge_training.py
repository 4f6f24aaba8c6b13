"""Training a judge by RL: the judge rows written from recorded rollouts and preference pairs, the `grrm_rm`
reward (spec values, and that a judge under optimisation cannot forge it), EVOLM's `evolm_generator`."""
import json

import pytest

from conftest import ScriptedJudge
from lmrl.config import TaskConfig
from lmrl.data.judge_rows import grrm_rows_from_pairs, grrm_rows_from_rollouts, rubric_rows
from lmrl.data.replay import rollout_records
from lmrl.envs.tasks import TaskError, jsonl_task
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.judges import grrm_prompt
from lmrl.task_files import main as task_files
from lmrl.types import Group, Sample

REF = {"A": 9, "B": 5, "C": 4}


def judged(reply, ref=REF):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=reply,
                  row={"question": "judge prompt", "answer": "", "reference_scores": ref})


def grrm_rm(reply, ref=REF):
    sample = judged(reply, ref)
    return REWARD_FNS.get("grrm_rm")(sample), sample.info["metrics"]["grrm_rm/unparsed"]


def test_grrm_rm_spec_values_from_a_reply():
    assert grrm_rm("B and C tie.\nRanking: A > B = C\nA: 8, B: 5, C: 5") == (pytest.approx(0.6667 + 0.4667, abs=1e-4),
                                                                              0.0)
    assert grrm_rm("<think>hmm</think>Ranking: A > B > C\nA: 9, B: 5, C: 4") == (2.0, 0.0)
    assert grrm_rm("Ranking: C > B > A\nA: 0, B: 5, C: 10") == (0.0, 0.0)  # all pairs reversed, margins off by >2


CONTRADICTION = "Ranking: A > B > C\nA: 8, B: 5, C: 5"  # read, but the ranking contradicts the scores


@pytest.mark.parametrize("reply", [
    CONTRADICTION,
    "Ranking: A > B = C\nA: 8, B: 5, C: 5, D: 1",     # an extra candidate in the score line
    "Ranking: A > B = C > D\nA: 8, B: 5, C: 5",       # an extra candidate in the ranking
    "Ranking: A > B\nA: 8, B: 5",                     # a missing candidate
    "Ranking: A > B = C\nA: 8, B: 5, B: 5",           # a repeated label, C missing
    "Ranking: A > A = C\nA: 8, B: 5, C: 5",           # a repeated label in the ranking
    "Ranking: A > B = C\nA: 8, B: 5, C: 5, A: 9",     # a repeated label in the score line
    "Ranking: A, B, C\nA: 8, B: 5, C: 5",             # a ranking without > or =
    "Ranking: A > b = C\nA: 8, B: 5, C: 5",           # a malformed label
    "A: 8, B: 5, C: 5",                               # no ranking line
    "Ranking: A > B = C\nA: 8, B: 5, C: 11",          # a score off the 0-10 scale
])
def test_a_forged_or_malformed_judgement_scores_zero(reply):
    assert grrm_rm(reply) == (0.0, float(reply != CONTRADICTION))


def test_grrm_rm_refuses_a_row_without_reference_scores():
    for ref in (None, {"A": 3}, {"A": "9", "B": 1}, {"a": 1, "b": 2}):
        with pytest.raises(ValueError, match="reference_scores"):
            REWARD_FNS.get("grrm_rm")(judged("Ranking: A > B\nA: 1, B: 0", ref))


def recorded(tmp_path, groups_rewards, step=1, question="Explain tides {i}."):
    """A rollouts.jsonl as a run writes it (`rollout_records`): one group per list of (text, reward)."""
    groups = []
    for i, scored in enumerate(groups_rewards):
        row = {"question": question.format(i=i), "answer": "x"}
        samples = [Sample(prompt_ids=[1, 2], completion_ids=[3], behaviour_logprobs=[-0.5], text=t, reward=r,
                          rewards={"answer": r}, row=row) for t, r in scored]
        groups.append(Group(uid=f"q{i}", row=row, samples=samples))
    path = tmp_path / f"rollouts-{step}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rollout_records(step, groups)))
    return path


GROUPS = [[("the moon pulls", 1.0), ("wind", 0.0), ("the moon", 0.5), ("wind", 0.0)],
          [("same", 1.0), ("same", 1.0), ("  ", 0.0)],
          [("gravity of moon and sun", 1.0), ("magic", 0.0), ("fish", 0.0), ("the sea moves", 0.5),
           ("no idea", 0.0), ("moon", 1.0)]]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_judge_rows_from_recorded_rollouts(tmp_path):
    rows, skipped = grrm_rows_from_rollouts(records(recorded(tmp_path, GROUPS)), seed=0)
    assert len(rows) == 2 and skipped == {"fewer than 2 distinct replies": 1}
    first = rows[0]
    assert sorted(first["candidates"]) == ["the moon", "the moon pulls", "wind"]  # duplicates merged
    gold = {"the moon pulls": 10, "wind": 0, "the moon": 5}
    assert first["reference_scores"] == {k: gold[t] for k, t in zip("ABC", first["candidates"])}
    assert first["question"] == grrm_prompt("Explain tides 0.", first["candidates"])
    assert first["answer"] == ", ".join(f"{k}: {v}" for k, v in first["reference_scores"].items())
    assert len(rows[1]["candidates"]) == 4 and set(rows[1]["candidates"]) <= {t for t, _ in GROUPS[2]}
    again, _ = grrm_rows_from_rollouts(records(recorded(tmp_path, GROUPS)), seed=0)
    assert again == rows  # seeded
    orders = {tuple(grrm_rows_from_rollouts(records(recorded(tmp_path, GROUPS)), seed=s)[0][0]["candidates"])
              for s in range(8)}
    assert len(orders) > 2  # the order is shuffled, not the recorded one


def test_the_judge_prompt_holds_no_reference_score(tmp_path):
    """A reply cannot copy the reference: the prompt is the same whatever the recorded rewards were."""
    flipped = [[(t, 1.0 - r) for t, r in g] for g in GROUPS]
    rows, _ = grrm_rows_from_rollouts(records(recorded(tmp_path, GROUPS)), seed=3)
    (tmp_path / "flipped").mkdir()
    other, _ = grrm_rows_from_rollouts(records(recorded(tmp_path / "flipped", flipped)), seed=3)
    for row, twin in zip(rows, other):
        assert row["question"] == twin["question"] and row["reference_scores"] != twin["reference_scores"]
        assert row["answer"] not in row["question"] and "reward" not in row["question"]


def test_judge_rows_refuse_bad_input(tmp_path):
    with pytest.raises(TaskError, match="outside"):
        grrm_rows_from_rollouts(records(recorded(tmp_path, [[("a", 2.0), ("b", 0.0)]])))
    with pytest.raises(TaskError, match="rollouts"):
        grrm_rows_from_rollouts([{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match="max_candidates"):
        grrm_rows_from_rollouts([], max_candidates=1)


def test_judge_rows_from_preference_pairs():
    pairs = [{"prompt": "Name a planet.", "chosen": "Mars", "rejected": "The sun"},
             {"chosen": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello!"}],
              "rejected": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Go away."}]}]
    rows = grrm_rows_from_pairs(pairs, seed=0)
    for row, (chosen, rejected) in zip(rows, [("Mars", "The sun"), ("Hello!", "Go away.")]):
        scores = dict(zip(row["candidates"], row["reference_scores"].values()))
        assert scores == {chosen: 7, rejected: 3}
    assert rows[1]["prompt"] == "Hi?"
    with pytest.raises(TaskError, match="different"):
        grrm_rows_from_pairs([{"prompt": "p", "chosen": "x", "rejected": "x"}])
    with pytest.raises(ValueError, match="rejected_score < chosen_score"):
        grrm_rows_from_pairs(pairs, chosen_score=3, rejected_score=3)


def test_rubric_rows_contrast_a_newer_and_an_older_reply(tmp_path):
    old = recorded(tmp_path, [[("wind", 0.0)], [("magic", 0.0)]], step=1)
    new = recorded(tmp_path, [[("the moon pulls", 1.0)], [("magic", 1.0)], [("fresh", 1.0)]], step=9)
    rows, skipped = rubric_rows(records(new), records(old))
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in rows] == [("Explain tides 0.", "the moon pulls", "wind")]
    assert skipped == {"identical replies": 1, "not in the earlier rollouts": 1}
    assert rows[0]["question"].endswith("Prompt:\nExplain tides 0.") and "wind" not in rows[0]["question"]
    one_run = records(old) + records(new)
    rows, skipped = rubric_rows(one_run, one_run, one_run=True)
    assert [(r["chosen_step"], r["rejected_step"]) for r in rows] == [(9, 1)]
    assert skipped["recorded at one step only"] == 1


def evolm_sample(rubric, row=None):
    row = row or {"question": "Write a rubric", "answer": "", "prompt": "Explain tides.", "chosen": "the moon pulls",
                  "rejected": "wind"}
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=rubric, row=row)


def test_evolm_generator_spec_values_with_a_frozen_judge():
    judge = ScriptedJudge(lambda text, _: "Score: 0.8" if "the moon pulls" in text else "Score: 0.5")
    indicator = REWARD_FNS.get("evolm_generator")(judge=judge, low=0, high=1)
    assert indicator(evolm_sample("<think>x</think>- names the cause")) == 1.0
    assert len(judge.calls) == 2 and all("Rubric:\n- names the cause" in c for c, _ in judge.calls)
    margin = REWARD_FNS.get("evolm_generator")(judge=judge, low=0, high=1, margin=True)
    assert margin(evolm_sample("- names the cause")) == pytest.approx(0.3)
    reversed_judge = ScriptedJudge(lambda text, _: "Score: 0.5" if "the moon pulls" in text else "Score: 0.8")
    assert REWARD_FNS.get("evolm_generator")(judge=reversed_judge, low=0, high=1)(evolm_sample("- r")) == 0.0
    empty = evolm_sample("<think>only thoughts</think>")
    assert indicator(empty) == 0.0 and empty.info["metrics"]["evolm_generator/empty_rubric"] == 1.0
    assert len(judge.calls) == 4  # the empty rubric asked nothing
    with pytest.raises(ValueError, match="chosen"):
        indicator(evolm_sample("- r", {"question": "q", "answer": "", "prompt": "p"}))


def test_task_files_write_rows_the_jsonl_task_reads(tmp_path, capsys):
    out = tmp_path / "judge.jsonl"
    assert task_files(["judge_rows", str(out), "--rollouts", str(recorded(tmp_path, GROUPS)), "--seed", "1"]) == 0
    assert "2 judge rows" in capsys.readouterr().out
    task = jsonl_task(TaskConfig(name="jsonl", dataset=str(out), num_eval=0))
    assert len(task.train) == 2 and task.train[0]["question"].startswith("Here are 3 candidate responses")
    assert isinstance(task.train[0]["reference_scores"], dict)
    rubric = tmp_path / "rubric.jsonl"
    one_run = tmp_path / "one_run.jsonl"
    one_run.write_text(recorded(tmp_path, [[("wind", 0.0)]], step=1).read_text()
                       + recorded(tmp_path, [[("moon", 1.0)]], step=5).read_text())
    assert task_files(["rubric_rows", str(rubric), "--current", str(one_run)]) == 0
    assert json.loads(rubric.read_text())["chosen"] == "moon"
    for argv, message in ((["judge_rows", str(out)], "give one source"),
                          (["judge_rows", str(out), "--rollouts", str(out)], "no 'rollouts' list"),
                          (["rubric_rows", str(rubric), "--current", str(recorded(tmp_path, [[("a", 1.0)]]))],
                           "no rubric rows"),
                          (["judge_rows", str(out), "--pairs", str(tmp_path / "missing.jsonl")], "missing.jsonl")):
        with pytest.raises(SystemExit):
            task_files(argv)
        assert message in capsys.readouterr().err


def test_half_point_scores_cannot_hedge_between_two_margins():
    """A margin of 2.5 would round to 2 or 3, full credit either way: the trained judge's scores are whole numbers."""
    from lmrl.rewards.judge_client import JudgeResponseError, parse_letter_scores

    with pytest.raises(JudgeResponseError, match="whole number"):
        parse_letter_scores("Ranking: A > B\nA: 7.5, B: 5", "AB", exact=True)
    assert parse_letter_scores("A: 7.5, B: 5", "AB") == {"A": 7.5, "B": 5.0}  # judge_grrm reads leniently


def test_judge_grrm_keeps_its_prompt_and_asks_for_a_ranking_only_when_told():
    from lmrl.rewards.judges import GRRM, GRRM_RANKED, GrrmReward

    assert "Ranking" not in GRRM and "Ranking" in GRRM_RANKED
    assert GrrmReward(judge=object.__new__(type("J", (), {"chat": lambda self, m: ""}))).template == GRRM
    assert GrrmReward(judge=object.__new__(type("J", (), {"chat": lambda self, m: ""})), template="ranked").template \
        == GRRM_RANKED
