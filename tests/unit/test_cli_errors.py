"""Errors a person can act on: one line naming the file, key or setting; a dry run that checks what a run would."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import write_toy_task
from lmrl import cli
from lmrl.config import ConfigError
from lmrl.loading import load_config


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) <= 2, err
    return err


def test_recipe_with_a_yaml_syntax_error_names_file_line_and_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  steps: 3\n  lr: [1e-5\nrollout:\n  group_size: 4\n")
    assert cli.main(["train", str(bad), "--dry-run"]) == 2
    err = one_line_error(capsys)
    assert f"{bad}:4:" in err and "YAML syntax error: expected ',' or ']'" in err


def test_malformed_override_is_one_line(capsys):
    assert cli.main(["train", "trainer.betas=[0.9, 0.99", "--dry-run"]) == 2
    assert "override 'trainer.betas=[0.9, 0.99': the value is not valid YAML" in one_line_error(capsys)


def test_missing_recipe_file_says_it_does_not_exist(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "missing.yaml"]) == 2
    assert "recipe file missing.yaml does not exist" in one_line_error(capsys)


def test_gspo_loss_without_its_aggregation_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"algo.loss=gspo is defined with algo.aggregation=seq_mean_token_mean, "
                                          r"but algo.preset=grpo brings algo.aggregation=token_mean"):
        load_config("quickstart", ["algo.loss=gspo"])
    assert load_config("quickstart", ["algo.loss=gspo", "algo.aggregation=token_mean"]).algo.aggregation == "token_mean"
    assert load_config("quickstart", ["algo.preset=gspo"]).algo.aggregation == "seq_mean_token_mean"


def test_dry_run_checks_the_model_path(tmp_path, capsys):
    assert cli.main(["train", f"model.path={tmp_path / 'nowhere'}", "--dry-run"]) == 2
    assert "nowhere" in one_line_error(capsys)


def test_dry_run_checks_the_dataset_fields(tmp_path, tiny_model_dir, capsys):
    data = write_toy_task(tmp_path / "toy.jsonl")
    common = [f"model.path={tiny_model_dir}", "task.name=jsonl", f"task.dataset={data}"]
    assert cli.main(["train", *common, "task.answer_field=solution", "--dry-run"]) == 2
    assert "lacks field(s) ['solution']" in capsys.readouterr().err
    assert cli.main(["train", *common, "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "first 16 training rows load" in captured.err and "task:" in captured.out


def test_help_does_not_import_torch():
    """`lmrl --help` answers at once: nothing heavy is imported to build the parser."""
    code = "import sys, lmrl.cli; lmrl.cli.parser(); print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_dry_run_says_what_a_list_override_replaced(tiny_model_dir, tmp_path, capsys):
    data = write_toy_task(tmp_path / "toy.jsonl")
    common = [f"model.path={tiny_model_dir}", "task.name=jsonl", f"task.dataset={data}", "--dry-run"]
    assert cli.main(["train", "quickstart", "reward.components=[{name: format}, {name: answer, weight: 0.5}]",
                     *common]) == 0
    err = capsys.readouterr().err
    assert ("reward.components: override replaced the recipe's list [answer{fallback: last_number}] with "
            "[format, answer(weight: 0.5)]") in " ".join(err.split())
    assert cli.main(["train", "quickstart", "reward.components.answer.weight=0.5", *common]) == 0
    captured = capsys.readouterr()
    assert "replaced" not in captured.err
    assert "  - name: answer\n    weight: 0.5\n    params:\n      fallback: last_number\n" in captured.out


def test_a_list_entry_is_changed_by_name_and_a_wrong_name_is_refused():
    cfg = load_config("quickstart", ["reward.components.answer.params.fallback=none"])
    assert [(c.name, c.params) for c in cfg.reward.components] == [("answer", {"fallback": "none"})]
    assert cfg.notes == ()
    default = load_config(None, ["reward.components.answer.weight=2"])  # the default list, entered by name
    assert [(c.name, c.weight) for c in default.reward.components] == [("answer", 2.0)]
    with pytest.raises(ConfigError, match=r"reward.components: the list has no entry named 'anwser'; "
                                          r"did you mean 'answer'\? it has: answer"):
        load_config("quickstart", ["reward.components.anwser.weight=0.5"])
    with pytest.raises(ConfigError, match=r"'components' is a list of named entries"):
        load_config("quickstart", ["reward.components.answer=1"])


@pytest.mark.parametrize("override, nearest", [
    ("trainer.optim.lrr=1e-5", "trainer.lr"), ("reward.componets=[]", "reward.components"),
    ("trainer.kl_coef=0.1", "algo.kl_coef"), ("model.lora.rr=8", "model.lora.r"),
    ("reward.components=[{name: answer, wieght: 2}]", "reward.components[0].weight"),
    ("trainer.stop_when=[{metrc: accuracy, above: 0.5}]", "trainer.stop_when[0].metric"),
])
def test_a_nested_unknown_key_names_the_nearest_valid_one(override, nearest):
    with pytest.raises(ConfigError, match=rf"; did you mean '{re.escape(nearest)}'\?$"):
        load_config("quickstart", [override])
