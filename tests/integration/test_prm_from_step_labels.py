"""The process-reward-model chain on a tiny model, as docs/stages/step_labels.md and process_reward_model.md
run it: Math-Shepherd labels of the policy's own solutions (`python -m lmrl.task_files steps`), a `prm` stage
trained on that file, its export, and the `process_reward_model` reward scoring a reply with it."""
from __future__ import annotations

import json

from conftest import make_tokenizer, toy_run_config, write_toy_task
from lmrl import cli
from lmrl.loading import build_config
from lmrl.loops.pipeline import export_final
from lmrl.models import tiny_llama
from lmrl.rewards.process_reward import ProcessRewardScore
from lmrl.task_files import main
from lmrl.types import Sample


def test_step_labels_of_the_policy_train_a_prm_that_scores_replies(tmp_path):
    tok = make_tokenizer(list("ab7 \n"), template=None)  # a random model writes new lines (steps) and 7s often
    policy = tmp_path / "policy"
    tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0).save_pretrained(policy)
    tok.save_pretrained(policy)
    cfg = toy_run_config(tmp_path, 1, dataset=write_toy_task(tmp_path / "toy.jsonl"), rollout={"max_new_tokens": 12})
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(json.dumps(cfg.model_dump(mode="json")))
    labels = tmp_path / "steps.jsonl"
    assert main(["steps", str(recipe), str(labels), "--model", str(policy), "--prompts", "8", "--solutions", "2",
                 "--k", "2", "--max-steps", "3"]) == 0
    rows = [json.loads(line) for line in labels.read_text().splitlines()]
    assert len(rows) == 16 and any(0 < x < 1 for r in rows for x in r["labels"])  # soft Math-Shepherd labels

    tree = {**cfg.model_dump(mode="json"), "model": {"path": str(policy)}, "algo": {"preset": "prm"},
            "batches": {"source": "steps", "dataset": str(labels), "size": 4, "num_eval": 4},
            "trainer": {"steps": 3, "lr": 3e-3, "bf16": False, "seed": 1}, "eval": {"at_start": False, "at_end": True},
            "run": {"output_dir": str(tmp_path / "runs"), "name": "prm", "progress": False, "checkpoint_every": 0}}
    tree.pop("reward")
    prm_cfg = build_config(tree)
    assert cli.main(["train", str(_written(tmp_path / "prm.yaml", tree))]) == 0
    run_dir = tmp_path / "runs" / "prm"
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("prm/loss" in r for r in logged) == 3 and any("eval/prm/loss" in r for r in logged)
    export = export_final(prm_cfg, run_dir)

    reward = ProcessRewardScore(str(export), aggregate="min")
    sample = Sample(prompt_ids=[], completion_ids=[], behaviour_logprobs=[], text=rows[0]["completions"][0] + "\n" + "7",
                    row={"question": rows[0]["prompt"]})
    score = reward(sample)
    assert 0.0 < score < 1.0 and len(sample.info["prm"]) == 2
    assert score == min(sample.info["prm"])


def _written(path, tree):
    path.write_text(json.dumps(tree))
    return path
