"""A new run never writes into another run's directory: it refuses (naming --resume and run.overwrite),
or with run.overwrite=true deletes that run first; auto-named runs never collide."""
import json

import pytest

from lmrl import cli
from lmrl.loading import build_config
from lmrl.loops.run_dir import RunDir


def config(tmp_path, **run):
    return build_config({"run": {"output_dir": str(tmp_path / "runs"), "name": "A", **run}})


def old_run(path):
    """What a finished run leaves: its config, two metric rows and a checkpoint at step 2."""
    (path / "checkpoints" / "step-000002" / "model").mkdir(parents=True)
    (path / "config.yaml").write_text("trainer: {steps: 2}\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    return path


def test_a_new_run_into_a_used_directory_is_refused_naming_both_ways_out(tmp_path):
    run = old_run(tmp_path / "runs" / "A")
    with pytest.raises(FileExistsError) as err:
        RunDir.new(config(tmp_path))
    message = str(err.value)
    assert str(run) in message and f"lmrl train --resume {run}" in message and "run.overwrite=true" in message
    assert (run / "metrics.jsonl").read_text().count("\n") == 2  # nothing touched


def test_overwrite_deletes_the_old_run_and_keeps_other_files(tmp_path):
    run = old_run(tmp_path / "runs" / "A")
    (run / "tensorboard").mkdir()
    (run / "data").mkdir()
    (run / "data" / "train.jsonl").write_text("{}\n")
    fresh = RunDir.new(config(tmp_path, overwrite=True))
    assert fresh.path == run and sorted(p.name for p in run.iterdir()) == ["data"]
    assert (run / "data" / "train.jsonl").read_text() == "{}\n"


def test_a_deletion_killed_halfway_is_finished_by_the_next_overwrite(tmp_path):
    run = old_run(tmp_path / "runs" / "A")
    (run / ".overwritten-1" / "checkpoints").mkdir(parents=True)  # what a killed overwrite left
    with pytest.raises(FileExistsError):  # config.yaml and metrics.jsonl are still there
        RunDir.new(config(tmp_path))
    RunDir.new(config(tmp_path, overwrite=True))
    assert list(run.iterdir()) == []


def test_a_directory_without_run_files_may_be_used(tmp_path):
    (tmp_path / "runs" / "A").mkdir(parents=True)
    assert RunDir.new(config(tmp_path)).path == tmp_path / "runs" / "A"
    (tmp_path / "runs" / "A" / ".config.yaml.tmp").write_text("half")  # a run killed while writing its config
    (tmp_path / "runs" / "A" / "notes.txt").write_text("mine")
    assert RunDir.new(config(tmp_path)).path == tmp_path / "runs" / "A"


def test_auto_named_runs_of_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(time, "strftime", lambda fmt: "20250101-000000")
    cfg = build_config({"recipe": "toy", "run": {"output_dir": str(tmp_path / "runs")}})
    first = RunDir.new(cfg)
    first.write_config(cfg)
    second = RunDir.new(cfg)
    assert (first.path.name, second.path.name) == ("toy-20250101-000000", "toy-20250101-000000-2")


def test_lmrl_train_refuses_before_any_model_loads(tmp_path, capsys):
    run = old_run(tmp_path / "runs" / "A")
    args = ["train", f"run.output_dir={tmp_path / 'runs'}", "run.name=A", f"model.path={tmp_path / 'no-model'}"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "no-model" not in err
    assert cli.main([*args, "--dry-run"]) == 2  # the dry run checks what the run would
    assert "already holds a run" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text().count("\n") == 2
