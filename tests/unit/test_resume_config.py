"""`lmrl train --resume RUN` continues RUN under its own config; only settings safe mid-run may change."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmrl import cli
from lmrl.config import ConfigError, check_resume_config, config_to_yaml
from lmrl.loading import load_config, load_run_config


def make_run(tmp_path: Path, recipe: str = "gspo", overrides: tuple[str, ...] = ("trainer.steps=6",)) -> Path:
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    cfg = load_config(recipe, [*overrides, f"run.output_dir={tmp_path / 'runs'}", "run.name=mine"])
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    return run


def test_resume_loads_the_runs_own_config_not_the_quickstart(tmp_path):
    run = make_run(tmp_path, "gspo", ("trainer.steps=6", "trainer.lr=7e-6"))
    cfg = load_run_config(run)
    assert (cfg.algo.preset, cfg.algo.loss, cfg.trainer.steps, cfg.trainer.lr) == ("gspo", "gspo", 6, 7e-6)


def test_resume_may_extend_steps_and_change_reporting(tmp_path):
    run = make_run(tmp_path)
    cfg = load_run_config(run, ["trainer.steps=20", "eval.every=5", "run.checkpoint_every=2", "run.progress=false"])
    assert (cfg.trainer.steps, cfg.eval.every, cfg.run.checkpoint_every, cfg.algo.loss) == (20, 5, 2, "gspo")


@pytest.mark.parametrize("override", ["algo.loss=ppo_clip", "trainer.lr=1e-3", "rollout.group_size=4",
                                      "run.name=other", "run.output_dir=elsewhere", "model.path=/x"])
def test_resume_refuses_a_change_that_alters_the_run(tmp_path, override):
    run = make_run(tmp_path)
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} cannot change when resuming .*trainer.steps"):
        load_run_config(run, [override])


def test_library_resume_with_a_different_config_names_the_key(tmp_path):
    run = make_run(tmp_path)
    saved = load_run_config(run)
    check_resume_config(saved, load_run_config(run, ["trainer.steps=9"]), run)  # allowed
    other = load_config("quickstart", ["trainer.steps=6", f"run.output_dir={tmp_path / 'runs'}", "run.name=mine"])
    with pytest.raises(ConfigError, match=r"algo.aggregation is 'token_mean' but the run started with "
                                          r"'seq_mean_token_mean'"):
        check_resume_config(saved, other, run)


def test_cli_resume_passes_the_runs_config_to_train(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    seen = {}
    monkeypatch.setattr("lmrl.loops.train", lambda cfg, resume: seen.update(cfg=cfg, resume=resume) or _Result(run))
    assert cli.main(["train", "--resume", str(run), "trainer.steps=12"]) == 0
    assert seen["resume"] == run and seen["cfg"].algo.loss == "gspo" and seen["cfg"].trainer.steps == 12
    assert cli.main(["train", "--resume", "trainer.steps=13", "run.output_dir=" + str(tmp_path / "runs"),
                     "run.name=mine"]) == 0  # bare --resume: the latest run, found by output_dir and name
    assert seen["resume"] == run and seen["cfg"].trainer.steps == 13


def test_cli_resume_refuses_unsafe_override_and_recipe(tmp_path, capsys):
    run = make_run(tmp_path)
    assert cli.main(["train", "--resume", str(run), "algo.loss=ppo_clip"]) == 2
    assert "algo.loss cannot change when resuming" in capsys.readouterr().err
    assert cli.main(["train", "dapo", "--resume", str(run)]) == 2
    assert "drop the recipe 'dapo'" in capsys.readouterr().err


class _Result:
    def __init__(self, run):
        self.run_dir, self.train_seconds, self.eval_before, self.eval_after = run, 0.0, {}, {}
        self.stopped = None
