"""Proxy-refresh pipelines (docs/pipelines.md#refresh) on a tiny model: the two stages repeat per round with their
references renamed; a policy stage whose drop rule fires is rolled back to its best evaluated checkpoint and the
rollouts sampled from there join the next reward model's data; a round that holds ends the pipeline."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import contains_seven, save_tiny_model, write_toy_task
from lmrl import cli
from lmrl.config import ConfigError, StopRule
from lmrl.loading import load_recipe
from lmrl.loops.refresh import best_checkpointed, over_optimised_at
from lmrl.rewards import REWARD_FNS


def fading(sample, **_):
    """A reward that falls as the policy trains: 1 / (1 + the version of the weights that sampled it)."""
    return 1.0 / (1.0 + max(sample.policy_version or [0]))


def test_the_spec_case_rolls_back_to_the_best_evaluation():
    """§5.1: E = [0.50, 0.58, 0.61, 0.57, 0.55] at steps 1..5 with P rising, δ = 0.03: fires at the fourth
    evaluation (step 4) and rolls back to the third (step 3); without a checkpoint there, to the best one kept."""
    rule = StopRule(metric="eval/accuracy", drop=0.03, while_rising="eval/reward/reward_model")
    evals = [(t + 1, {"eval/accuracy": e, "eval/reward/reward_model": float(t)})
             for t, e in enumerate([0.50, 0.58, 0.61, 0.57, 0.55])]
    fired = over_optimised_at(rule, evals)
    assert fired == 4
    assert best_checkpointed(rule, evals, fired, {1, 2, 3, 4, 5}) == 3
    assert best_checkpointed(rule, evals, fired, {2, 4}) == 2
    assert best_checkpointed(rule, evals, fired, {5}) is None


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> dict:
    """The tiny model, the toy task and a seed of labelled rollouts (a 2-step toy run's rollouts.jsonl)."""
    folder = tmp_path_factory.mktemp("refresh")
    for name, fn in (("contains_7", contains_seven), ("fading", fading)):
        if name not in REWARD_FNS:
            REWARD_FNS.register(name, "toy reward for tests")(fn)
    shared = {
        "model": {"path": str(save_tiny_model(folder / "model"))},
        "task": {"name": "jsonl", "dataset": str(write_toy_task(folder / "toy.jsonl")), "system_prompt": None,
                 "num_eval": 4, "num_train": 56},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "temperature": 1.5},
        "trainer": {"lr": 3e-3, "bf16": False, "seed": 1, "threads": 1},
        "run": {"progress": False},
    }
    tree = {**shared, "reward": {"components": [{"name": "contains_7"}, {"name": "fading", "weight": 0.0}],
                                 "accuracy_component": "contains_7"},
            "trainer": {**shared["trainer"], "steps": 2}, "eval": {"at_start": False, "at_end": False},
            "run": {**shared["run"], "output_dir": str(folder / "runs"), "name": "seed", "save_rollouts": True,
                    "checkpoint_every": 0}}
    (folder / "seed.yaml").write_text(yaml.safe_dump(tree))
    assert cli.main(["train", str(folder / "seed.yaml")]) == 0
    return {"shared": shared, "rollouts": folder / "runs" / "seed" / "rollouts.jsonl"}


def refresh_recipe(tmp_path: Path, seed: dict, drop: float, rounds: int = 2, **policy) -> Path:
    rm = {"algo.preset": "reward_model", "batches": {"source": "rollout_pairs", "dataset": str(seed["rollouts"]),
                                                     "params": {"rank_by": "contains_7"}, "size": 4},
          "trainer.steps": 2, "eval": {"at_start": False, "at_end": False}, "run.checkpoint_every": 0}
    rl = {"reward": {"components": [{"name": "reward_model", "params": {"path": {"from": "rm"}, "tokens": "sample"}},
                                    {"name": "contains_7", "weight": 0.0}, {"name": "fading", "weight": 0.0}],
                     "accuracy_component": "contains_7"},
          "trainer.steps": 3, "trainer.stop_when": [{"metric": "eval/reward/fading", "drop": drop}],
          "eval": {"every": 1, "at_start": False, "at_end": True},
          "run": {"checkpoint_every": 1, "keep_checkpoints": 3, "save_rollouts": True}, **policy}
    tree = {"description": "refresh test", **seed["shared"],
            "run": {**seed["shared"]["run"], "output_dir": str(tmp_path / "runs"), "name": "refresh"},
            "refresh": {"rounds": rounds, "feedback_groups": 2},
            "stages": [{"name": "rm", "overrides": rm}, {"name": "rl", "overrides": rl}]}
    path = tmp_path / "refresh.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_a_refresh_pipeline_repeats_its_stages_with_their_references_renamed(tmp_path, seed):
    pipe = load_recipe(str(refresh_recipe(tmp_path, seed, drop=0.0, rounds=3)))
    assert pipe.labels == ["rm-1", "rl-1", "rm-2", "rl-2", "rm-3", "rl-3"]
    assert [(s.role, s.round) for s in pipe.stages[:2]] == [("reward_model", 1), ("policy", 1)]
    rl2, rm2 = pipe.stages[3], pipe.stages[2]
    assert rl2.tree["reward"]["components"][0]["params"]["path"] == {"from": "rm-2"}
    assert rl2.model_from == "rl-1" and pipe.stages[1].model_from is None
    assert rm2.tree["batches"]["dataset"] == {"from": "rl-1", "file": "feedback.jsonl"}
    assert rm2.config.model.path == pipe.stages[0].config.model.path  # every reward model starts afresh


@pytest.mark.parametrize("change, message", [
    ({"trainer.stop_when": []}, "one trainer.stop_when rule with `drop`"),
    ({"run": {"checkpoint_every": 1, "keep_checkpoints": 3, "save_rollouts": False}}, "run.save_rollouts=true"),
    ({"run": {"checkpoint_every": 1, "keep_checkpoints": 1, "save_rollouts": True}}, "keep every checkpoint"),
    ({"reward": {"components": [{"name": "contains_7"}], "accuracy_component": "contains_7"}}, "never reads"),
    ({"rollout.max_staleness": 1}, "max_staleness must be unset"),
    ({"rollout.prompts_per_step": 1}, "the groups of one step"),
    ({"reward.accuracy_component": "fading"}, "rank its pairs by the gold component"),
])
def test_a_policy_stage_that_cannot_be_refreshed_is_refused(tmp_path, seed, change, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(str(refresh_recipe(tmp_path, seed, drop=0.0, **change)))


def test_a_best_before_the_first_step_rolls_back_to_the_starting_weights():
    """The evaluation before step 1 counts: E = {0: .70, 2: .66, 4: .65, 6: .60}, δ = 0.03, fires at step 2
    (0.66 < 0.70 − 0.03), the live rule and the replay alike, and the best is the start (step 0)."""
    rule = StopRule(metric="eval/accuracy", drop=0.03)
    evals = [(step, {"eval/accuracy": e}) for step, e in [(0, 0.70), (2, 0.66), (4, 0.65), (6, 0.60)]]
    assert over_optimised_at(rule, evals) == 2
    assert best_checkpointed(rule, evals, 2, {0, 2, 4, 6}) == 0


def test_an_over_optimised_round_rolls_back_and_feeds_the_next_reward_model(tmp_path, seed):
    """`fading` falls at every evaluation, so the drop rule (δ = 0) fires at step 2 of each policy stage: the stage
    is exported from its step-1 checkpoint and its step-2 rollouts (sampled by those weights) join the data."""
    assert cli.main(["train", str(refresh_recipe(tmp_path, seed, drop=0.0))]) == 0
    root = tmp_path / "runs" / "refresh"
    record = json.loads((root / "pipeline.json").read_text())
    assert [(s["label"], s["status"], s["steps"]) for s in record["stages"]] == \
        [("rm-1", "done", 2), ("rl-1", "done", 2), ("rm-2", "done", 2), ("rl-2", "done", 2)]
    rl1, rm2, rl2 = (root / "stages" / name for name in ("02-rl-1", "03-rm-2", "04-rl-2"))
    assert record["stages"][1]["refresh"] == {"over_optimised": True, "at_step": 2, "rolled_back_to": 1,
                                              "best": 0.5, "feedback_groups": 2,
                                              "feedback_total": len(seed["rollouts"].read_text().splitlines()) + 2}
    assert (rl1 / "model" / "lmrl_checkpoint.txt").read_text() == "step-000001"
    fed = [json.loads(line) for line in (rl1 / "feedback.jsonl").read_text().splitlines()]
    assert fed[:-2] == [json.loads(line) for line in seed["rollouts"].read_text().splitlines()]
    assert [r["step"] for r in fed[-2:]] == [2, 2]
    assert all(set(x["rewards"]) == {"reward_model", "contains_7", "fading"} for r in fed[-2:] for x in r["rollouts"])
    rm2_cfg, rl2_cfg = (yaml.safe_load((d / "config.yaml").read_text()) for d in (rm2, rl2))
    assert rm2_cfg["batches"]["dataset"] == str(rl1 / "feedback.jsonl")
    assert rl2_cfg["model"]["path"] == str(rl1 / "model")
    assert rl2_cfg["reward"]["components"][0]["params"]["path"] == str(rm2 / "model")

    before = (rl2 / "metrics.jsonl").read_text()
    assert cli.main(["train", "--resume", str(root)]) == 0  # a finished refresh pipeline resumes as done
    assert json.loads((root / "pipeline.json").read_text()) == record
    assert (rl2 / "metrics.jsonl").read_text() == before


def test_a_dry_run_checks_every_round(tmp_path, seed, capsys):
    assert cli.main(["train", str(refresh_recipe(tmp_path, seed, drop=0.0)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(label in out for label in ("rm-1", "rl-1", "rm-2", "rl-2"))


def test_a_round_that_holds_ends_the_pipeline(tmp_path, seed):
    assert cli.main(["train", str(refresh_recipe(tmp_path, seed, drop=1.0))]) == 0
    record = json.loads((tmp_path / "runs" / "refresh" / "pipeline.json").read_text())
    assert [(s["label"], s["status"]) for s in record["stages"]] == \
        [("rm-1", "done"), ("rl-1", "done"), ("rm-2", "skipped"), ("rl-2", "skipped")]
    assert record["stages"][1]["refresh"] == {"over_optimised": False}
    rl1 = tmp_path / "runs" / "refresh" / "stages" / "02-rl-1"
    assert (rl1 / "model" / "lmrl_checkpoint.txt").read_text() == "step-000003"
    assert cli.main(["report", str(tmp_path / "runs" / "refresh")]) == 0  # skipped stages have no logs to join


def test_a_fall_from_the_first_evaluation_rolls_back_to_the_starting_model(tmp_path, seed):
    """With the evaluation before step 1 (eval.at_start), `fading` is best there: the live rule fires at step 1,
    the stage's model/ is the model it started from, and the feedback is step 1's rollouts (sampled by it)."""
    path = refresh_recipe(tmp_path, seed, drop=0.0, rounds=1, eval={"every": 1, "at_start": True, "at_end": True})
    assert cli.main(["train", str(path)]) == 0
    record = json.loads((tmp_path / "runs" / "refresh" / "pipeline.json").read_text())
    assert record["stages"][1]["steps"] == 1
    assert record["stages"][1]["refresh"]["rolled_back_to"] == 0 and record["stages"][1]["refresh"]["at_step"] == 1
    rl1 = tmp_path / "runs" / "refresh" / "stages" / "02-rl-1"
    assert (rl1 / "model" / "lmrl_checkpoint.txt").read_text() == "start"
    start = Path(seed["shared"]["model"]["path"])
    assert (rl1 / "model" / "model.safetensors").read_bytes() == (start / "model.safetensors").read_bytes()
    fed = [json.loads(line) for line in (rl1 / "feedback.jsonl").read_text().splitlines()]
    assert [r["step"] for r in fed[-2:]] == [1, 1]
