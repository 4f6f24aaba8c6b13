"""The command line reads overrides wherever they stand, says its version, and suggests the nearest kind."""
from __future__ import annotations

import json

import pytest
import yaml

import lmrl
from conftest import make_tokenizer, write_toy_task
from lmrl import cli
from lmrl.eval.compare import Arm, Run, Unit
from lmrl.models import tiny_llama


@pytest.fixture
def toy_overrides(tmp_path) -> list[str]:
    tok = make_tokenizer()
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    data = write_toy_task(tmp_path / "toy.jsonl")
    return [f"model.path={tmp_path / 'model'}", "task.name=jsonl", f"task.dataset={data}"]


def test_train_takes_overrides_after_an_option(toy_overrides, capsys):
    argv = ["train", "gspo", toy_overrides[0], "--dry-run", *toy_overrides[1:], "trainer.steps=2"]
    assert cli.main(argv) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["trainer"]["steps"] == 2 and resolved["task"]["name"] == "jsonl"
    assert resolved["algo"]["preset"] == "gspo"


def test_eval_takes_overrides_after_an_option(monkeypatch, capsys):
    import lmrl.eval.suite as suite

    seen = {}

    def fake_run_eval(cfg, probe=None):
        seen["cfg"] = cfg
        return {"metrics": {"accuracy": 0.25}}

    monkeypatch.setattr(suite, "run_eval", fake_run_eval)
    assert cli.main(["eval", "quickstart", "--model", "default", "task.num_eval=3", "trainer.seed=4"]) == 0
    cfg = seen["cfg"]
    assert (cfg.task.num_eval, cfg.trainer.seed, cfg.model.path) == (3, 4, "default")
    assert "eval/accuracy: 0.2500" in capsys.readouterr().out


def test_an_argument_that_is_no_override_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "quickstart", "--dry-run", "stray"])
    assert exit_.value.code == 2 and "unrecognized arguments: stray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["report", "runs/x", "trainer.steps=2"])  # report takes no overrides


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"lmrl {lmrl.__version__}"


def test_list_suggests_the_nearest_kind(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["list", "reward"])
    assert exit_.value.code == 2 and "no kind 'reward'; did you mean 'rewards'?" in capsys.readouterr().err
    assert cli.main(["list", "rewards"]) == 0
    assert "answer" in capsys.readouterr().out


def test_compare_prints_its_warnings_on_the_console(monkeypatch, tmp_path, capsys):
    import lmrl.eval.compare as compare

    def aggregate(records):
        return {"accuracy": sum(r["ok"] for r in records) / len(records)}

    def run(name, ok, samples):
        records = [{"uid": f"p{i}", "ok": float(ok)} for i in range(8)]
        return Run(name, aggregate(records), {"prompts": Unit(records, aggregate)}, settings={"samples": samples})

    arms = {"a": Arm("a", [run("a", 0, 1)]), "b": Arm("b", [run("b", 1, 4)])}
    monkeypatch.setattr(compare, "parse_arm", arms.__getitem__)
    assert cli.main(["compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "99"]) == 0
    console = capsys.readouterr()
    warning = "the runs were evaluated with different samples (1, 4)"
    assert warning in json.loads((tmp_path / "compare.json").read_text())["warnings"][0]
    assert (console.out + console.err).count(warning) == 1
