"""Experiment trackers: config checks, the fan-out, and each real tracker read back from its own files."""
from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest

from lmrl.config import ConfigError
from lmrl.loading import build_config
import lmrl.trackers as trackers_mod
from lmrl.trackers import TRACKERS, Trackers, check_trackers, clean_metrics, sample_table

CONFIG = {"recipe": "toy", "task": {"name": "jsonl", "params": {}, "system_prompt": None},
          "trainer": {"lr": 0.003, "betas": [0.9, 0.999]}, "run": {"trackers": ["x"]}}
METRICS_1 = {"loss": 1.5, "eval/pass@1": 0.25, "skipped": None, "nan": float("nan"), "inf": float("inf"),
             "note": "text", "count": 3}
SAMPLES = [{"split": "train", "prompt": "what is 2+2?", "completion": "4 | sure\nAnswer: 4", "reward": 1.0,
            "gold": "4", "excluded": None},
           {"split": "train", "prompt": "what is 3+3?", "completion": "7", "reward": 0.0, "gold": "6",
            "excluded": "timeout"}]


def test_config_field_defaults_to_no_trackers_and_takes_a_list():
    assert build_config({}).run.trackers == []
    assert build_config({"run": {"trackers": ["tensorboard", "mlflow"]}}).run.trackers == ["tensorboard", "mlflow"]


def test_registry_holds_the_three_trackers():
    assert {"tensorboard", "wandb", "mlflow"} <= set(TRACKERS.names())


def test_unknown_and_duplicate_names_are_config_errors():
    with pytest.raises(ConfigError, match=r"run.trackers: unknown tracker 'tensorbord'; did you mean 'tensorboard'"):
        check_trackers(["tensorbord"])
    with pytest.raises(ConfigError, match="listed twice"):
        check_trackers(["mlflow", "mlflow"])


def test_missing_package_names_the_extra(monkeypatch):
    real = trackers_mod.importlib.util.find_spec
    monkeypatch.setattr(trackers_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"run.trackers: wandb needs .*pip install 'lmrl\[wandb\]'"):
        Trackers.from_config(["wandb"], Path("unused"), {})


def test_clean_metrics_and_sample_table():
    assert clean_metrics(METRICS_1) == {"loss": 1.5, "eval/pass@1": 0.25, "count": 3.0}
    columns, data = sample_table(7, [{"reward": float("nan"), "extra": [1, 2], "prompt": "p"}])
    assert columns == ["step", "prompt", "reward", "extra"]
    assert data == [[7, "p", None, "[1, 2]"]]


def test_no_trackers_is_a_no_op(tmp_path):
    with Trackers.from_config([], tmp_path / "run", CONFIG) as t:
        assert not t and t.names == []
        t.log(1, METRICS_1)
        t.log_samples(1, SAMPLES)
    assert not (tmp_path / "run").exists()


class Recorder:
    def __init__(self, fail_on: str | None = None):
        self.calls, self.fail_on = [], fail_on

    def start(self, run_dir, config):
        self.calls.append(("start",))

    def log(self, step, metrics):
        if self.fail_on == "log":
            raise OSError("disk full")
        self.calls.append(("log", step, metrics))

    def log_samples(self, step, rows):
        self.calls.append(("log_samples", step, rows))

    def close(self):
        self.calls.append(("close",))


def test_fan_out_skips_bad_values_and_drops_a_failing_tracker(capsys):
    good, bad = Recorder(), Recorder(fail_on="log")
    t = Trackers({"good": good, "bad": bad})
    t.log(3, METRICS_1)
    t.log(4, {"only": None})  # nothing left to log: not forwarded
    t.log_samples(3, SAMPLES)
    t.close()
    t.close()  # closing twice is harmless
    assert good.calls == [("log", 3, {"loss": 1.5, "eval/pass@1": 0.25, "count": 3.0}),
                          ("log_samples", 3, SAMPLES), ("close",)]
    assert bad.calls == [("close",)]  # dropped after its first failure, and closed
    assert "bad.log failed (OSError: disk full); bad is turned off" in capsys.readouterr().err
    assert t.names == []


# --- TensorBoard -------------------------------------------------------------------------------------


def test_tensorboard_scalars_and_sample_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    t = Trackers.from_config(["tensorboard"], run, CONFIG)
    t.log(1, METRICS_1)
    t.log(2, {"loss": 1.0, "nan": float("nan")})
    t.log_samples(2, SAMPLES)
    t.close()

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["count", "eval/pass@1", "loss"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.5), (2, 1.0)]
    text = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}
    [(step, table)] = text["samples/text_summary"]
    assert step == 2
    lines = table.splitlines()
    assert lines[0] == "| step | split | prompt | completion | reward | gold | excluded |"
    assert lines[2] == "| 2 | train | what is 2+2? | 4 \\| sure<br>Answer: 4 | 1.0 | 4 |  |"
    assert lines[3].endswith("| 0.0 | 6 | timeout |")
    assert '"lr": 0.003' in text["config/text_summary"][0][1]


# --- Weights & Biases (offline) ----------------------------------------------------------------------


def wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header, then LevelDB-style
    chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks, each record a
    `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def finished_wandb_records(path: Path, timeout_s: float = 60.0) -> list:
    """The records once the log holds the run's exit record: wandb-core (a separate process) may still
    be writing the file for a moment after `run.finish()` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_wandb_logs_offline_without_an_api_key(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc from `wandb login`
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")

    run = tmp_path / "toy-run"
    t = Trackers.from_config(["wandb"], run, CONFIG)
    t.log(1, METRICS_1)
    t.log_samples(1, SAMPLES)
    t.log(2, {"loss": 1.0, "skipped": None})
    t.close()
    assert "logging offline" in capsys.readouterr().err

    [offline] = list((run / "wandb").glob("offline-run-*"))
    run_id = (run / "wandb" / "lmrl_run_id").read_text()
    records = finished_wandb_records(offline / f"run-{run_id}.wandb")
    [info] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (info.run_id, info.display_name, info.project) == (run_id, "toy-run", "lmrl")
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert config["trainer"] == {"lr": 0.003, "betas": [0.9, 0.999]}
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            history.append({k: v for k, v in items.items() if not k.startswith("_") or k == "_step"})
    assert history[0]["_step"] == 1 and history[0]["loss"] == 1.5 and history[0]["eval/pass@1"] == 0.25
    assert history[0]["count"] == 3 and not {"skipped", "nan", "inf", "note"} & set(history[0])
    assert history[0]["samples/_type"] == "table-file"
    assert history[1] == {"_step": 2, "loss": 1.0}
    table = json.loads((offline / "files" / history[0]["samples/path"]).read_text())
    assert table["columns"] == ["step", "split", "prompt", "completion", "reward", "gold", "excluded"]
    assert table["data"][0] == [1, "train", "what is 2+2?", "4 | sure\nAnswer: 4", 1.0, "4", None]


# --- MLflow (local SQLite store) ---------------------------------------------------------------------


def test_mlflow_local_store_metrics_params_samples_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    from mlflow.tracking import MlflowClient

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    run = tmp_path / "toy-run"
    t = Trackers.from_config(["mlflow"], run, CONFIG)
    t.log(1, METRICS_1)
    t.log_samples(1, SAMPLES[:1])
    t.log(2, {"loss": 1.0, "nan": math.nan})
    t.log_samples(2, SAMPLES[1:])
    t.log_samples(2, SAMPLES[:1])  # a second table at the same step (an evaluation after the last step)
    t.close()

    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow' / 'mlflow.db'}")
    run_id = (run / "mlflow" / "lmrl_run_id").read_text()
    info = client.get_run(run_id)
    assert info.info.run_name == "toy-run" and info.info.status == "FINISHED"
    assert info.info.artifact_uri.startswith((run / "mlflow" / "artifacts").resolve().as_uri())
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 1.5), (2, 1.0)]
    assert set(info.data.metrics) == {"loss", "eval/pass_1", "count"}  # '@' is not allowed in MLflow names
    assert info.data.params["trainer.lr"] == "0.003" and info.data.params["task.system_prompt"] == "null"
    assert {a.path for a in client.list_artifacts(run_id)} == {"config.json", "samples"}
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == [
        "samples/step_000001.json", "samples/step_000002.json", "samples/step_000002_2.json"]
    rows = []
    for name in ("step_000001.json", "step_000002.json"):
        table = json.loads(Path(client.download_artifacts(run_id, f"samples/{name}", str(tmp_path / "dl"))).read_text())
        rows += [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(r["step"], r["prompt"], r["completion"], r["reward"], r["gold"], r["excluded"]) for r in rows] == [
        (1, "what is 2+2?", "4 | sure\nAnswer: 4", 1.0, "4", None), (2, "what is 3+3?", "7", 0.0, "6", "timeout")]
    config = json.loads(Path(client.download_artifacts(run_id, "config.json", str(tmp_path / "dl"))).read_text())
    assert config == CONFIG

    resumed = Trackers.from_config(["mlflow"], run, CONFIG)  # a resumed run continues the same MLflow run
    resumed.log(3, {"loss": 0.5})
    resumed.close()
    assert (run / "mlflow" / "lmrl_run_id").read_text() == run_id
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2, 3]
