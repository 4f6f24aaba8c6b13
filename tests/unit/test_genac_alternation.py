"""GenAC critic/actor alternation: the critic rows built by a task from an actor stage's recorded rollouts, the
local critic client (the policy's own weights generating in the run's process), and the shipped pipeline's wiring."""
import json

import pytest

from conftest import save_tiny_model
from lmrl.config import TaskConfig
from lmrl.envs import TASKS, TaskError
from lmrl.loading import load_recipe
from lmrl.loops.pipeline import placed
from lmrl.rewards.judges import make_judge
from lmrl.rewards.local_judge import LocalJudgeClient


def recorded(step, question, texts, correct):
    return {"step": step, "question": question,
            "rollouts": [{"text": t, "rewards": {"answer": float(c)}} for t, c in zip(texts, correct)]}


def test_the_critic_rows_task_reads_a_rollouts_file(tmp_path):
    source = tmp_path / "rollouts.jsonl"
    records = [recorded(1, "Q1", ["a1", "b1"], [1, 0]), recorded(2, "Q1", ["c1-secret", "d1-secret"], [1, 1]),
               recorded(2, "Q2", ["e2"], [0])]
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = TASKS.get("critic_rows")(TaskConfig(name="critic_rows", dataset=str(source), num_eval=0))
    rows = sorted(data.train, key=lambda r: r["uid"])
    assert [r["success_rate"] for r in rows] == [0.5, 1.0, 0.0]  # each group's own share correct
    later = rows[1]["question"]  # Q1's second group shows the first group's attempts, never its own
    assert "Attempt 1 (correct):\na1" in later and "Attempt 2 (wrong):\nb1" in later and "secret" not in later
    assert all("(none yet)" in r["question"] for r in (rows[0], rows[2]))
    with pytest.raises(TaskError, match="unknown task.params"):
        TASKS.get("critic_rows")(TaskConfig(name="critic_rows", dataset=str(source), params={"kk": 2}))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"step": 1, "question": "Q", "rollouts": [{"text": "x", "rewards": {}}]}) + "\n")
    with pytest.raises(TaskError, match="no critic rows"):
        TASKS.get("critic_rows")(TaskConfig(name="critic_rows", dataset=str(empty)))


def test_a_local_critic_generates_in_process_with_the_client_cache(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    client = make_judge({"model_path": str(model), "max_tokens": 4})
    assert isinstance(client, LocalJudgeClient)
    messages = [{"role": "user", "content": "value?"}]
    first = client.chat(messages)
    assert isinstance(first, str) and client.chat(messages) == first  # greedy (temperature 0), then cached
    assert client.stats["requests"] == 1 and client.stats["cache_hits"] == 1
    assert client.chat_many([messages, [{"role": "user", "content": "other"}]])[0] == first
    with pytest.raises(ValueError, match="unknown judge client option"):
        make_judge({"model_path": str(model), "max_tokns": 4})
    with pytest.raises(ValueError, match="model_path"):
        LocalJudgeClient(model_path="")


def test_the_alternating_pipeline_chains_actor_and_critic_rounds(tmp_path):
    pipe = load_recipe("genac_alternating")
    assert pipe.labels == ["actor-1", "critic-1", "actor-2", "critic-2", "actor-3"]
    for i, stage in enumerate(pipe.stages):
        cfg = placed(pipe, i, tmp_path)
        names = [c.name for c in cfg.reward.components]
        if stage.label.startswith("actor"):
            assert cfg.algo.advantage == "mc_step" and names == ["answer", "genac_value"]
            critic = cfg.reward.components[1].params["critic"]["model_path"]
            # the critic is the policy as the round starts: the previous (critic) stage's final weights
            want = "default" if i == 0 else str(tmp_path / f"stages/{i:02d}-{pipe.labels[i - 1]}/model")
            assert critic == want and stage.model_from == (pipe.labels[i - 1] if i else None)
            assert cfg.run.save_rollouts
        else:
            assert names == ["genac_critic"] and cfg.task.name == "critic_rows" and cfg.algo.advantage != "mc_step"
            assert cfg.task.dataset == str(tmp_path / f"stages/{i:02d}-{pipe.labels[i - 1]}/rollouts.jsonl")
            assert cfg.task.system_prompt is None and stage.model_from == pipe.labels[i - 1]
            assert cfg.task.params == {"k": 4}  # the quickstart's generator settings are no critic_rows knobs
