"""Pipelines on a tiny model: stages chain their weights, resume after an interruption ends as the
uninterrupted pipeline does, `--dry-run` checks every stage, report and compare show the stages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import contains_seven, save_tiny_model, write_toy_task
from lmrl import cli
from lmrl.config import ConfigError
from lmrl.eval.compare import load_run
from lmrl.eval.report import write_report
from lmrl.eval.stage_logs import joined_logs
from lmrl.loading import load_recipe
from lmrl.loops import loop
from lmrl.loops.run_dir import RunDir
from lmrl.rewards import REWARD_FNS


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """The keys every stage shares: the tiny model, the toy task and reward, small steps, no progress bar."""
    folder = tmp_path_factory.mktemp("pipeline")
    if "contains_7" not in REWARD_FNS:
        REWARD_FNS.register("contains_7", "toy reward for tests")(contains_seven)
    return {
        "model": {"path": str(save_tiny_model(folder / "model"))},
        "task": {"name": "jsonl", "dataset": str(write_toy_task(folder / "toy.jsonl")), "system_prompt": None,
                 "num_eval": 4, "num_train": 56},
        "reward": {"components": [{"name": "contains_7"}], "accuracy_component": "contains_7"},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4},
        "trainer": {"steps": 2, "lr": 3e-3, "bf16": False, "seed": 1, "threads": 1},
        "eval": {"at_start": False, "at_end": False},
        "run": {"progress": False, "checkpoint_every": 2},
    }


def write_pipeline(tmp_path: Path, shared: dict, stages: list[dict], name: str = "pipe") -> Path:
    tree = {"description": "test pipeline", **shared, "run": {**shared["run"], "output_dir": str(tmp_path / "runs"),
                                                             "name": name}, "stages": stages}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def test_two_stages_chain_their_weights_into_one_run_directory(tmp_path, shared, monkeypatch):
    built = {}
    real_build = loop.build_stages

    def recording_build(cfg, *args, **kwargs):
        stages = real_build(cfg, *args, **kwargs)
        built[cfg.run.name] = {k: v.detach().clone() for k, v in stages.model.state_dict().items()}
        return stages

    monkeypatch.setattr(loop, "build_stages", recording_build)
    path = write_pipeline(tmp_path, shared, [{"name": "a"}, {"name": "b", "overrides": {"trainer.steps": 3}}])
    assert cli.main(["train", str(path)]) == 0

    root = tmp_path / "runs" / "pipe"
    record = json.loads((root / "pipeline.json").read_text())
    assert [(s["label"], s["dir"], s["status"], s["steps"]) for s in record["stages"]] == \
        [("a", "stages/01-a", "done", 2), ("b", "stages/02-b", "done", 3)]
    assert "reward/mean" in record["stages"][1]["metrics"]
    first, second = root / "stages" / "01-a", root / "stages" / "02-b"
    assert yaml.safe_load((second / "config.yaml").read_text())["model"]["path"] == str(first / "model")
    final_a = weights(first / "checkpoints" / "step-000002" / "model")
    assert set(built["02-b"]) >= set(final_a)
    assert all(torch.equal(built["02-b"][k], final_a[k]) for k in final_a)  # stage b loaded stage a's final weights
    assert not all(torch.equal(built["01-a"][k], final_a[k]) for k in final_a)  # and stage a did train

    rows, boundaries = joined_logs(root)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3, 4, 5]
    assert [r["stage"] for r in rows if "reward/mean" in r] == ["a", "a", "b", "b", "b"]
    assert boundaries == [(0, "a"), (2, "b")]
    page = write_report(root).read_text()
    assert "<h2>Stages</h2>" in page and "stages/02-b" in page
    assert cli.main(["report", str(second)]) == 0  # a stage is a run directory of its own


def three_stages(shared: dict) -> list[dict]:
    return [{"name": "a"}, {"name": "b", "overrides": {"trainer": {"steps": 4}, "algo": {"preset": "gspo"}}},
            {"name": "c", "overrides": {"eval.at_end": True}}]


def test_resume_after_an_interruption_in_stage_two_equals_the_uninterrupted_pipeline(tmp_path, shared, monkeypatch,
                                                                                      capsys):
    full = write_pipeline(tmp_path, shared, three_stages(shared), name="full")
    assert cli.main(["train", str(full)]) == 0

    cut = write_pipeline(tmp_path, shared, three_stages(shared), name="cut")
    real_log = RunDir.log

    def killed_at_step_3_of_stage_b(self, step, metrics):
        if self.path.name == "02-b" and step == 3:
            raise KeyboardInterrupt("killed")
        real_log(self, step, metrics)

    monkeypatch.setattr(RunDir, "log", killed_at_step_3_of_stage_b)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", str(cut)])
    root = tmp_path / "runs" / "cut"
    record = json.loads((root / "pipeline.json").read_text())
    assert [s["status"] for s in record["stages"]] == ["done", "running", "pending"]
    assert (root / "stages" / "02-b" / "checkpoints" / "step-000002").is_dir()  # where stage b resumes from
    logged = (root / "stages" / "02-b" / "metrics.jsonl").read_text()
    monkeypatch.setattr(RunDir, "log", real_log)
    assert cli.main(["train", "--resume", str(root), "trainer.lr=1e-2"]) == 2  # the run's settings stay
    assert cli.main(["train", "--resume", str(root), "--dry-run"]) == 0
    assert "stage 1 a: done" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(root)]) == 0

    record = json.loads((root / "pipeline.json").read_text())
    assert [s["status"] for s in record["stages"]] == ["done", "done", "done"]
    ended, expected = weights(root / "stages" / "03-c" / "model"), weights(tmp_path / "runs" / "full" / "stages"
                                                                           / "03-c" / "model")
    assert all(torch.equal(ended[k], expected[k]) for k in expected)
    steps = [json.loads(line)["step"] for line in (root / "stages" / "02-b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # no step lost or logged twice
    assert (root / "stages" / "02-b" / "metrics.jsonl").read_text().startswith(logged)  # steps 1-2 not run again

    compared = [load_run(tmp_path / "runs" / name) for name in ("full", "cut")]
    assert compared[0].metrics["c/accuracy"] == compared[1].metrics["c/accuracy"]  # stages lined up by label
    assert compared[0].metrics["accuracy"] == compared[0].metrics["c/accuracy"]  # the last stage is the result
    assert compared[0].curves["reward/mean"] == compared[1].curves["reward/mean"]
    assert compared[0].curves["reward/mean"][0] == list(range(1, 9))
    assert cli.main(["compare", str(tmp_path / "runs" / "full"), str(root), "--out", str(tmp_path / "cmp"),
                     "--bootstrap", "50"]) == 0


def test_dry_run_checks_every_stage_before_any_model_loads(tmp_path, shared, capsys):
    path = write_pipeline(tmp_path, shared, three_stages(shared))
    assert cli.main(["train", str(path), "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "# stage 1: a" in out.out and "# stage 3: c" in out.out
    assert "the final weights of stage b" in out.out
    assert out.err.count("checked:") == 3
    assert not (tmp_path / "runs").exists()

    bad = three_stages(shared)
    bad[1]["overrides"]["trainer"]["lrr"] = 1e-3
    assert cli.main(["train", str(write_pipeline(tmp_path, shared, bad, name="bad")), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "stage 'b' (2 of 3)" in err and "trainer.lrr" in err and "trainer.lr'" in err


def test_overrides_reach_every_stage_or_the_one_they_name(tmp_path, shared):
    path = write_pipeline(tmp_path, shared, [*three_stages(shared)[:2],
                                             {"name": "c", "overrides": {"model": {"path": {"from": "a"}}}}])
    pipe = load_recipe(str(path), ["trainer.lr=1e-4", "stages.b.trainer.lr=2e-4", "stages.c.trainer.steps=5",
                                   f"model.path={shared['model']['path']}"])  # the first stage's model
    assert [s.config.trainer.lr for s in pipe.stages] == [1e-4, 2e-4, 1e-4]
    assert [s.config.trainer.steps for s in pipe.stages] == [2, 4, 5]
    assert [s.config.algo.loss for s in pipe.stages] == ["ppo_clip", "gspo", "ppo_clip"]
    assert [s.model_from for s in pipe.stages] == [None, "a", "a"]
    assert pipe.stages[2].config.model.path == shared["model"]["path"]  # validated with the chain's first model
    with pytest.raises(ConfigError, match="no stage 'bb'; did you mean 'b'"):
        load_recipe(str(path), ["stages.bb.trainer.lr=1e-4"])
    with pytest.raises(ConfigError, match="must name an earlier stage"):
        load_recipe(str(path), ["stages.a.model.path={from: c}"])


def test_a_pipeline_from_python(tmp_path, shared):
    import lmrl

    path = write_pipeline(tmp_path, shared, [{"name": "a"}, {"name": "b"}])
    pipe = lmrl.recipe(str(path), stages__b__trainer__steps=1)
    result = lmrl.train(pipe)
    assert result.run_dir == tmp_path / "runs" / "pipe"
    assert result.model == result.stages["b"] / "model" and (result.model / "model.safetensors").is_file()
    assert [m.get("step") for m in result.metrics.values()] == [None, None]
    assert json.loads((result.run_dir / "pipeline.json").read_text())["stages"][1]["steps"] == 1


def test_list_stages_names_the_batch_sources_and_the_shipped_pipelines(capsys):
    assert cli.main(["list", "stages"]) == 0
    out = capsys.readouterr().out
    assert "batches.source=rollouts" in out and "pipeline_demo" in out and "grpo, gspo" in out
