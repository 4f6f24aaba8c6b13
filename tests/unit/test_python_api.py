"""The public Python API on a tiny random model: the docs' example runs as written, notebook cells run twice,
a `datasets.Dataset` and a list of dicts train alike, environment classes and evaluation."""
import json
import re
from pathlib import Path

import datasets
import pytest
import torch

import lmrl
from conftest import make_tokenizer
from lmrl.config import ConfigError
from lmrl.envs.environment import Step
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS

DOC = Path(__file__).resolve().parents[2] / "docs" / "python_api.md"
ROWS = [{"question": f"q{i} say 7", "answer": "7", "id": f"r{i}"} for i in range(12)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def quick(tiny_dir, tmp_path, **settings):
    """A two-step config of the tiny model: small groups, short completions, no evaluation."""
    chosen = dict(model__path=tiny_dir, trainer__steps=2, trainer__bf16=False, rollout__prompts_per_step=2,
                  rollout__group_size=4, rollout__max_new_tokens=6, task__system_prompt=None, eval__at_start=False,
                  eval__at_end=False, run__output_dir=str(tmp_path / "runs"), run__progress=False)
    return lmrl.recipe("quickstart", **{**chosen, **settings})


def says_seven(sample):
    return float("7" in sample.info["text"])


def test_the_docs_example_runs_as_written(tiny_dir, tmp_path, monkeypatch, capsys):
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    assert block.count('model__path="default"') == 1
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs_example"}
    exec(compile(block.replace('model__path="default"', f"model__path={tiny_dir!r}"), str(DOC), "exec"), namespace)
    result, scores = namespace["result"], namespace["scores"]
    assert result.steps == 5 and len(result.metric("reward/mean")) == 5
    assert len(result.metric("reward/contains_answer")) == 5 and len(result.metric("reward/format")) == 5
    assert result.eval_before["eval/num_prompts"] == result.eval_after["eval/num_prompts"] == 20
    assert result.config.reward.accuracy_component == "contains_answer"
    assert [(c.name, c.weight) for c in result.config.reward.components] == [("contains_answer", 1.0), ("format", 0.2)]
    assert result.run_dir.parent == Path("runs") and result.checkpoint is not None
    data = Path(result.config.task.dataset)
    assert data.parent == Path("runs") / "datasets" and result.config.task.name == "jsonl"
    trained = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(trained) == 80 and trained[0] == {"question": "What is 0 + 0?", "answer": "0"}
    assert scores["metrics"]["num_prompts"] == 20 and 0.0 <= scores["metrics"]["accuracy"] <= 1.0
    assert "held-out accuracy:" in capsys.readouterr().out


CELL = '''
import lmrl
from lmrl.rewards import REWARD_FNS

def cell_reward(sample):
    return float("7" in sample.info["text"])

@REWARD_FNS.register("cell_registered")
def registered(sample):
    return 0.0

result = lmrl.train(cfg, dataset=rows, rewards=[cell_reward, "cell_registered"])
'''


def test_a_notebook_cell_runs_twice(tiny_dir, tmp_path):
    namespace = {"__name__": "__main__", "cfg": quick(tiny_dir, tmp_path), "rows": ROWS}
    exec(CELL, namespace)
    first, first_fn = namespace["result"], namespace["cell_reward"]
    exec(CELL, namespace)  # the same cell again: new function objects of the same definition
    second = namespace["result"]
    assert namespace["cell_reward"] is not first_fn and REWARD_FNS.get("cell_reward") is namespace["cell_reward"]
    assert REWARD_FNS.get("cell_registered") is namespace["registered"]
    assert second.run_dir != first.run_dir  # a new run directory for the second call within the same second
    assert len(first.metric("reward/cell_reward")) == len(second.metric("reward/cell_reward")) == 2


def test_two_different_objects_under_one_name_are_refused():
    def first(sample):
        return 0.0

    def second(sample):
        return 1.0

    REWARD_FNS.register("api_test_name")(first)
    REWARD_FNS.register("api_test_name")(first)  # the same object again is fine
    with pytest.raises(ValueError, match="'api_test_name' is already registered .*first"):
        REWARD_FNS.register("api_test_name")(second)
    REWARD_FNS.register("api_test_lambda")(lambda sample: 0.0)
    with pytest.raises(ValueError, match="already registered"):
        REWARD_FNS.register("api_test_lambda")(lambda sample: 1.0)  # lambdas are never one definition

    def answer(sample):  # a user function named like the built-in reward
        return 1.0

    with pytest.raises(ValueError, match="'answer' is already registered .*lmrl.rewards.functions"):
        lmrl.api.register_reward(answer)
    with pytest.raises(TypeError, match="lambda"):
        lmrl.api.register_reward(lambda sample: 0.0)


def test_a_dataset_and_a_list_of_dicts_train_alike(tiny_dir, tmp_path):
    cfg = quick(tiny_dir, tmp_path, task__num_eval=4)
    from_list = lmrl.train(cfg, dataset=ROWS, rewards=[says_seven])
    from_dataset = lmrl.train(cfg, dataset=datasets.Dataset.from_list(ROWS), rewards=[says_seven])
    files = [Path(r.config.task.dataset) for r in (from_list, from_dataset)]
    assert files[0] == files[1] and len(files[0].read_text().splitlines()) == 12  # the same rows, the same file
    assert files[0].parent == tmp_path / "runs" / "datasets" and from_list.run_dir != from_dataset.run_dir
    for result in (from_list, from_dataset):
        assert result.config.task.name == "jsonl"
        assert result.config.task.params == {}  # the quickstart's reasoning-gym settings are gone
        assert len(result.metric("reward/says_seven")) == 2
    # the same seed, model and rows: the same run
    assert from_list.metric("reward/mean") == from_dataset.metric("reward/mean")
    with pytest.raises(TypeError, match="one split"):
        lmrl.train(cfg, dataset=datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}))


def test_an_eval_dataset_is_the_held_out_set(tiny_dir, tmp_path):
    cfg = quick(tiny_dir, tmp_path, eval__at_end=True, trainer__steps=1)
    result = lmrl.train(cfg, dataset=ROWS[:8], eval_dataset=ROWS[8:], rewards=[(says_seven, 2.0)])
    assert result.eval_after["eval/num_prompts"] == 4
    held = Path(result.config.task.params["eval_dataset"])
    assert [json.loads(line)["id"] for line in held.read_text().splitlines()] == ["r8", "r9", "r10", "r11"]
    assert result.config.reward.components[0].weight == 2.0
    scores = lmrl.evaluate(cfg, model=tiny_dir, dataset=ROWS[:3], rewards=[says_seven])
    assert scores["metrics"]["num_prompts"] == 3 and sorted(p["uid"] for p in scores["prompts"]) == ["r0", "r1", "r2"]


class SayNumber:
    """Asks for a number; one turn; pays 1 for a reply containing it."""

    def reset(self, row, seed):
        return [{"role": "user", "content": row["question"]}], row["answer"]

    def step(self, reply, state):
        return Step(observation=None, reward=float(state in reply), done=True)


def test_an_environment_class_is_passed_directly(tiny_dir, tmp_path):
    result = lmrl.train(quick(tiny_dir, tmp_path, trainer__steps=1), dataset=ROWS, env=SayNumber)
    assert result.config.env.name == "SayNumber" and result.config.reward.accuracy_component == "env"
    assert len(result.metric("reward/env")) == 1


def test_recipe_takes_overrides_keywords_and_section_dicts():
    by_keyword = lmrl.recipe("quickstart", trainer__steps=5, algo={"preset": "dapo", "eps_high": 0.3})
    by_override = lmrl.recipe("quickstart", ["trainer.steps=5", "algo.preset=dapo", "algo.eps_high=0.3"])
    assert by_keyword.model_dump() == by_override.model_dump()
    assert by_keyword.trainer.steps == 5 and by_keyword.algo.eps_high == 0.3 and by_keyword.trainer.lr == 3e-5
    assert lmrl.recipe("quickstart", run__name="007").run.name == "007"  # a Python value, not YAML
    with pytest.raises(ConfigError, match="did you mean 'trainer.steps'"):
        lmrl.recipe("quickstart", trainer__step=5)


def test_a_resumed_run_must_bring_the_same_rows(tiny_dir, tmp_path):
    cfg = quick(tiny_dir, tmp_path, trainer__steps=1)
    result = lmrl.train(cfg, dataset=ROWS, rewards=[says_seven])
    longer = quick(tiny_dir, tmp_path, trainer__steps=2)
    with pytest.raises(ConfigError, match="task.dataset is .* but the run started with"):
        lmrl.train(longer, dataset=ROWS[:6], rewards=[says_seven], resume=result.run_dir)
    resumed = lmrl.train(longer, dataset=ROWS, rewards=[says_seven], resume=result.run_dir)
    assert resumed.run_dir == result.run_dir and len(resumed.metric("reward/mean")) == 2


def test_a_sharded_runs_checkpoint_is_its_gathered_model(tiny_dir, tmp_path):
    """A sharded learner's checkpoint holds shards and a weightless `model/`: `checkpoint` is its shards gathered
    once into a transformers directory beside them."""
    from transformers import AutoModelForCausalLM

    from lmrl.models.sharded_checkpoint import gather_weights

    result = lmrl.train(quick(tiny_dir, tmp_path, trainer__sharding="fsdp"), dataset=ROWS, rewards=[says_seven])
    step = result.checkpoint.parent
    assert result.checkpoint == step / "gathered" and not list((step / "model").glob("*.safetensors"))
    written = (result.checkpoint / "model.safetensors").stat().st_mtime_ns
    assert result.checkpoint == step / "gathered" and (result.checkpoint / "model.safetensors").stat().st_mtime_ns == written
    loaded = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    whole = AutoModelForCausalLM.from_pretrained(gather_weights(step, tmp_path / "whole")).state_dict()
    assert loaded.keys() == whole.keys() and all(torch.equal(loaded[k], v) for k, v in whole.items())
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    assert max(float((initial[k] - v).abs().max()) for k, v in loaded.items()) > 0  # the trained weights
