"""Every entry point that runs the policy puts it on the device `trainer.device` resolves to: training
stages, `lmrl eval`, `lmrl.evaluate`, the abstention evaluation and the task-file commands through
`envs.pieces.build_pieces`, `lmrl serve --device` through the same resolver. With the resolver
answering "meta", the model each entry point would generate with (or serve) is on meta."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import toy_run_config
from lmrl import cli
from lmrl.engines import HFEngine

META = torch.device("meta")


class Generating(Exception):
    """Raised where an entry point first generates (or starts serving): the model's device is recorded."""


@pytest.fixture
def devices_seen(monkeypatch):
    """The devices of the models the entry points generate with, the resolver answering "meta"."""
    seen: list[torch.device] = []
    monkeypatch.setattr("lmrl.envs.pieces.resolve_device", lambda setting="auto": META)
    monkeypatch.setattr("lmrl.models.device.resolve_device", lambda setting="auto": META)

    def generate(self, *args, **kwargs):
        seen.append(next(self.model.parameters()).device)
        raise Generating

    def build_server(model, *args, **kwargs):
        seen.append(next(model.parameters()).device)
        raise Generating

    monkeypatch.setattr(HFEngine, "generate", generate)
    monkeypatch.setattr("lmrl.serve.build_server", build_server)
    return seen


@pytest.fixture
def recipe(tmp_path, tiny_model_dir):
    """The toy run on the saved tiny model, as a recipe file."""
    cfg = toy_run_config(tmp_path, 1, model={"path": str(tiny_model_dir)})
    path = tmp_path / "toy.yaml"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    return path


def test_training_stages_put_the_model_on_the_resolved_device(recipe, devices_seen):
    from lmrl.loading import load_config
    from lmrl.loops import build_stages

    stages = build_stages(load_config(str(recipe)))
    assert next(stages.model.parameters()).device == META
    assert next(stages.engine.model.parameters()).device == META
    assert next(stages.learner.model.parameters()).device == META


def test_lmrl_eval_generates_on_the_resolved_device(recipe, devices_seen):
    with pytest.raises(Generating):
        cli.main(["eval", str(recipe)])
    assert devices_seen == [META]


def test_python_evaluate_generates_on_the_resolved_device(recipe, devices_seen):
    import lmrl
    from lmrl.loading import load_config

    with pytest.raises(Generating):
        lmrl.evaluate(load_config(str(recipe)))
    assert devices_seen == [META]


def test_lmrl_serve_serves_on_the_resolved_device(tiny_model_dir, devices_seen):
    with pytest.raises(Generating):
        cli.main(["serve", str(tiny_model_dir), "--device", "cuda"])
    assert devices_seen == [META]


def test_the_abstention_evaluation_generates_on_the_resolved_device(recipe, devices_seen):
    from lmrl.eval.abstention import main

    with pytest.raises(Generating):
        main([str(recipe)])
    assert devices_seen == [META]


def test_peer_rollouts_are_generated_on_the_resolved_device(recipe, tiny_model_dir, tmp_path, devices_seen):
    from lmrl.task_files import main

    with pytest.raises(Generating):
        main(["peers", str(recipe), str(tmp_path / "peers.jsonl"), "--model", str(tiny_model_dir), "--rows", "2"])
    assert devices_seen == [META]


def test_the_hint_search_generates_on_the_resolved_device(tmp_path, tiny_model_dir, devices_seen):
    from lmrl.task_files import main

    task = tmp_path / "hinted.jsonl"
    task.write_text("".join(json.dumps({"question": f"q{i} say it", "answer": "7", "hints": ["say 7", "seven"]})
                            + "\n" for i in range(16)))
    cfg = toy_run_config(tmp_path, 1, dataset=task, num_eval=2, num_train=8, model={"path": str(tiny_model_dir)})
    recipe = tmp_path / "hinted.yaml"
    recipe.write_text(json.dumps(cfg.model_dump(mode="json")))
    with pytest.raises(Generating):
        main(["hints", str(recipe), str(tmp_path / "hints.jsonl"), "--rows", "1", "--samples", "2"])
    assert devices_seen == [META]


def test_step_labels_are_generated_on_the_resolved_device(recipe, tmp_path, devices_seen):
    from lmrl.task_files import main

    with pytest.raises(Generating):
        main(["steps", str(recipe), str(tmp_path / "steps.jsonl"), "--prompts", "1", "--solutions", "2"])
    assert devices_seen == [META]
