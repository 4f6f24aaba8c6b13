"""Your own code from the CLI: `file.py:name` in any key that takes a registered name."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import save_tiny_model
from lmrl import cli
from lmrl.config import TaskConfig
from lmrl.data import SAMPLERS
from lmrl.envs.tasks import load_task
from lmrl.registry import UserCodeError
from lmrl.rewards import REWARD_FNS
from lmrl.rewards.compute import find_component

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> tuple[str, list[str]]:
    """The custom-reward file and the command exactly as the README shows them."""
    text = README.read_text()
    code = re.search(r"```python\n(# my_rewards\.py\n.*?)```", text, re.S).group(1)
    command = re.search(r'^lmrl train "reward\.components=\[\{name: my_rewards\.py.*$', text, re.M).group(0)
    return code, shlex.split(command)


def test_readme_custom_reward_example_runs_as_written(tmp_path, monkeypatch):
    code, command = readme_example()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(code)
    assert command[:2] == ["lmrl", "train"]
    small = [f"model.path={save_tiny_model(tmp_path / 'model')}", "trainer.steps=1", "rollout.prompts_per_step=2",
             "rollout.group_size=2", "rollout.max_new_tokens=4", "eval.at_start=false", "eval.at_end=false",
             "task.num_train=8", "task.num_eval=1", "run.output_dir=runs", "run.name=readme", "run.progress=false",
             "trainer.bf16=false"]
    assert cli.main([*command[1:], *small]) == 0
    row = json.loads((tmp_path / "runs" / "readme" / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/my_rewards.py:short_and_right" in row and "reward/answer" in row


def test_plain_function_decorated_group_reward_task_and_sampler(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "helpers.py").write_text("LIMIT = 3\n")
    (tmp_path / "mine.py").write_text('''
from helpers import LIMIT                     # the file's directory is importable
from lmrl.envs.tasks import TaskData
from lmrl.rewards import GROUP_REWARD_FNS


def shorter(sample, **_):
    return float(len(sample.info["text"]) < LIMIT)


@GROUP_REWARD_FNS.register("mine_vote")
def vote(samples, **_):
    return [1.0 for _ in samples]


def rows(cfg):
    data = [{"uid": str(i), "question": f"q{i}", "answer": str(i)} for i in range(6)]
    return TaskData(data[:4], data[4:])


class FirstRows:
    def __init__(self, rows, seed=0):
        self.rows = rows

    def next_prompts(self, n):
        return self.rows[:n]
''')
    fn, per_group = find_component("mine.py:shorter")
    assert not per_group and fn.__name__ == "shorter"
    fn, per_group = find_component("mine.py:vote")
    assert per_group and fn([1, 2]) == [1.0, 1.0]
    assert [r["uid"] for r in load_task(TaskConfig(name="mine.py:rows")).train] == ["0", "1", "2", "3"]
    assert SAMPLERS.get("mine.py:FirstRows")([{"a": 1}, {"a": 2}]).next_prompts(1) == [{"a": 1}]
    assert "mine.py:vote" not in SAMPLERS  # registered as a group reward: it is not a sampler
    with pytest.raises(KeyError, match="its file registers it as a group reward function"):
        SAMPLERS.get("mine.py:vote")


def test_user_code_errors_name_the_file_and_the_problem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError, match=r"nothere\.py:f: no file .*nothere\.py"):
        "nothere.py:f" in REWARD_FNS
    (tmp_path / "typo.py").write_text("def short_and_right(sample):\n    return 1.0\n")
    with pytest.raises(UserCodeError, match=r"has no 'short_and_rigth'; did you mean short_and_right"):
        REWARD_FNS.get("typo.py:short_and_rigth")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UserCodeError, match=r"broken\.py: importing it failed: SyntaxError"):
        REWARD_FNS.get("broken.py:f")


def test_cli_reports_user_code_errors_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "reward.components=[{name: gone.py:f}]", "reward.accuracy_component=gone.py:f",
                     "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "gone.py:f: no file" in err and "Traceback" not in err
