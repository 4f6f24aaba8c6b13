"""GenAC: the spec's critic reward and advantages, the critic's in-context rollouts, their checkpointed state, its rows."""
import json

import pytest
import torch

from conftest import ScriptedJudge
from lmrl.algos import ADVANTAGES
from lmrl.config import ConfigError, RewardComponent, RewardConfig
from lmrl.loading import build_config
from lmrl.rewards import REWARD_FNS, RewardScorer
from lmrl.data.judge_rows import critic_rows_from_rollouts
from lmrl.rewards.genac import critic_reward, parse_value
from lmrl.task_files import main as task_files
from lmrl.types import Group, Sample


def sample(text, question="What is 2 + 2?", gold="4", **row):
    return Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text,
                  row={"question": question, "answer": gold, **row})


def group(texts, question="What is 2 + 2?"):
    samples = [sample(t, question) for t in texts]
    return Group(uid=question, row=samples[0].row, samples=samples)


def scorer(critic, k=4, samples=1):
    return RewardScorer(RewardConfig(components=[
        RewardComponent(name="answer"),
        RewardComponent(name="genac_value", weight=0.0, params={"critic": critic, "k": k, "samples": samples})]))


def test_spec_critic_reward():
    assert critic_reward(0.7, sum([1, 0, 1, 1]) / 4) == pytest.approx(-0.0025)
    assert critic_reward(None, 0.75) == -1.0


def test_spec_advantages_from_the_value_component():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.ones(4, 3)
    token_rewards = torch.zeros(4, 3)
    token_rewards[:, -1] = rewards
    components = torch.tensor([[1.0, 0.7], [0.0, 0.7], [1.0, 0.7], [1.0, 0.7]])
    adv = ADVANTAGES.get("genac")(token_rewards, torch.zeros(4, dtype=torch.long), mask,
                                  reward_components=components, reward_component_names=["answer", "genac_value"])
    assert adv[:, 0].tolist() == pytest.approx([0.3, -0.7, 0.3, 0.3])
    assert torch.equal(adv[:, 0:1].expand(4, 3), adv)
    with pytest.raises(ValueError, match="add {name: genac_value, weight: 0}"):
        ADVANTAGES.get("genac")(token_rewards, torch.zeros(4, dtype=torch.long), mask,
                                reward_components=components, reward_component_names=["answer", "other"])


def test_the_scorer_gives_every_sample_the_critic_value_and_keeps_it_out_of_the_reward():
    critic = ScriptedJudge(lambda prompt, _: "Half the attempts fail.\nValue: 0.7")
    g = group(["Answer: 4", "Answer: 5", "Answer: 4", "Answer: 4"])
    scorer(critic).score([g])
    assert [s.rewards["genac_value"] for s in g.samples] == [0.7] * 4
    assert [s.reward for s in g.samples] == [1.0, 0.0, 1.0, 1.0]
    assert len(critic.calls) == 1 and "(none yet)" in critic.calls[0][0] and "What is 2 + 2?" in critic.calls[0][0]


def test_the_critic_sees_the_k_most_recent_rollouts_of_the_prompt_with_outcomes():
    critic = ScriptedJudge(lambda prompt, _: "Value: 0.5")
    s = scorer(critic, k=2)
    s.score([group(["Answer: 4 first", "Answer: 5 second"])])
    s.score([group(["Answer: 7"], question="What is 3 + 4?")])  # another prompt: its own context
    assert "(none yet)" in critic.calls[1][0]
    s.score([group(["Answer: 4 third"])])
    shown = critic.calls[2][0]
    assert "Attempt 1 (correct):\nAnswer: 4 first" in shown and "Attempt 2 (wrong):\nAnswer: 5 second" in shown
    s.score([group(["x"])])
    assert "third" in critic.calls[3][0] and "first" not in critic.calls[3][0]  # only the k = 2 most recent
    s.score([group(["held out reply"])], held_out=True)
    s.score([group(["y"])])
    assert "held out reply" not in critic.calls[5][0]  # an evaluation's groups are not remembered


def test_a_resumed_critic_context_is_the_uninterrupted_one(tmp_path):
    def run(steps, resume_from=None):
        critic = ScriptedJudge(lambda prompt, _: "Value: 0.25")
        s = scorer(critic)
        if resume_from is not None:
            s.load_state_dict(torch.load(resume_from, weights_only=True))
        for texts in steps:
            s.score([group(texts)])
        return s, critic

    first = [["Answer: 4", "Answer: 6"], ["Answer: 5"]]
    later = [["Answer: 4 again"], ["Answer: 1"]]
    whole, whole_critic = run(first + later)
    half, _ = run(first)
    torch.save(half.state_dict(), tmp_path / "state.pt")
    resumed, resumed_critic = run(later, resume_from=tmp_path / "state.pt")
    assert resumed.state_dict() == whole.state_dict()
    assert [c[0] for c in resumed_critic.calls] == [c[0] for c in whole_critic.calls[2:]]


def test_an_unreadable_value_excludes_the_sample_and_samples_are_averaged():
    g = group(["Answer: 4"])
    scorer(ScriptedJudge(lambda prompt, _: "Value: 1.7")).score([g])
    assert g.samples[0].excluded is not None and "genac_value" in g.samples[0].info["reward_errors"]
    votes = iter(["Value: 0.2", "Value: 0.6"])
    critic = ScriptedJudge(lambda prompt, _: next(votes))
    g = group(["Answer: 4"])
    scorer(critic, samples=2).score([g])
    assert g.samples[0].rewards["genac_value"] == pytest.approx(0.4)
    assert [c[1] for c in critic.calls] == [{"seed": 0}, {"seed": 1}]


def test_critic_side_reward_and_hostile_replies():
    fn = REWARD_FNS.get("genac_critic")
    assert fn(sample("I think.\nValue: 0.7", success_rate=0.75)) == pytest.approx(-0.0025)
    assert fn(sample("Value: 0.9 ... no, Value: 0.75", success_rate=0.75)) == 0.0  # the last value counts
    for reply in ["Value: 1.5", "Value: -0.1", "probably high", "", "Value: 1e-1", "Value: nan", "Value: 0.7.5"]:
        s = sample(reply, success_rate=0.75)
        assert fn(s) == -1.0 and s.info["metrics"]["genac_critic/unparsed"] == 1.0
    assert parse_value("<think>Value: 0.1</think>Value: 0.3") == 0.3
    assert parse_value("So my estimate: Value: **0.70**.") == 0.7
    with pytest.raises(ValueError, match="success_rate"):
        fn(sample("Value: 0.5"))
    with pytest.raises(ValueError, match="success_rate"):
        fn(sample("Value: 0.5", success_rate=3))


def recorded(step, texts, correct, question="Q1"):
    return {"uid": f"{question}@{step}", "step": step, "question": question, "answer": "4",
            "rollouts": [{"text": t, "rewards": {"answer": float(c)}, "reward": float(c)}
                         for t, c in zip(texts, correct)]}


def test_critic_rows_show_the_previous_group_and_hide_their_target(tmp_path):
    records = [recorded(2, ["c1-secret", "d1-secret"], [1, 1]), recorded(1, ["a1", "b1"], [1, 0]),
               {"step": 1, "question": "Q2", "rollouts": [{"text": "x", "rewards": {}}]}]
    rows, skipped = critic_rows_from_rollouts(records, k=4)
    assert [r["success_rate"] for r in rows] == [0.5, 1.0]  # in step order
    assert "(none yet)" in rows[0]["question"]
    assert "Attempt 1 (correct):\na1" in rows[1]["question"] and "Attempt 2 (wrong):\nb1" in rows[1]["question"]
    assert all("secret" not in r["question"] and "1.0" not in r["question"] for r in rows)
    assert skipped == {"no rollout scored by 'answer'": 1}
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert task_files(["critic_rows", str(tmp_path / "rows.jsonl"), "--rollouts", str(source)]) == 0
    written = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert written == rows
    graded = REWARD_FNS.get("genac_critic")(sample("Value: 0.5", success_rate=written[1]["success_rate"]))
    assert graded == pytest.approx(-0.25)


def test_the_config_check_accepts_the_wiring_and_refuses_a_misspelt_knob():
    tree = {"reward": {"components": [{"name": "answer"}, {"name": "genac_value", "weight": 0}]},
            "algo": {"advantage": "genac", "advantage_params": {"value_component": "genac_value"}}}
    assert build_config(tree).algo.advantage == "genac"
    tree["algo"]["advantage_params"] = {"value_componnt": "genac_value"}
    with pytest.raises(ConfigError, match="value_component"):
        build_config(tree)


def test_the_grader_must_come_first():
    critic = ScriptedJudge(lambda prompt, _: "Value: 0.5")
    alone = RewardScorer(RewardConfig(components=[RewardComponent(name="genac_value", params={"critic": critic})],
                                      accuracy_component="genac_value"), report=lambda message: None)
    g = group(["Answer: 4"])
    alone.score([g])
    assert "list it before genac_value" in g.samples[0].info["reward_errors"]["genac_value"]
    assert critic.calls == []  # refused before the critic is asked


def test_the_algorithm_hands_the_estimator_the_component_names():
    from types import SimpleNamespace

    from lmrl.algos.gather import gather, optional_inputs

    fn = ADVANTAGES.get("genac")
    required = ADVANTAGES.spec("genac").requires
    batch = SimpleNamespace(context={"reward_component_names": ["answer", "genac_value"]},
                            row_extras={"reward_components": torch.tensor([[1.0, 0.25]])}, extras={})
    inputs = {**optional_inputs(fn, required, batch, {}), **gather(required, batch)}
    assert set(inputs) == {"reward_components", "reward_component_names"}
    adv = fn(torch.tensor([[0.0, 1.0]]), torch.zeros(1, dtype=torch.long), torch.ones(1, 2), **inputs)
    assert adv.tolist() == [[0.75, 0.75]]
