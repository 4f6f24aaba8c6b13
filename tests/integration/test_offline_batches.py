"""The offline batch source on a tiny model: a user's own source (`batches.source: file.py:name`) trains by the
terms of `algo.terms` alone, in an order that is a function of the step (a resumed run continues exactly), with
the held-out rows' loss at each evaluation."""
import json

import pytest
import torch

from conftest import make_tokenizer, toy_run_config
from lmrl.config import ConfigError
from lmrl.loops.offline import step_groups
from lmrl.models import tiny_llama

SOURCE = '''
import json
from lmrl.data import OfflineData
from lmrl.types import Group, Origin, Sample


def token_rows(cfg, tokenizer, task_rows, task_eval_rows):
    rows = [json.loads(line) for line in open(cfg.batches.dataset)]
    groups = [Group(f"row-{i}", r, [Sample(r["prompt"], r["completion"], [0.0] * len(r["completion"]),
                                           origin=Origin.DEMONSTRATION, loss_mask=r.get("mask"))])
              for i, r in enumerate(rows)]
    return OfflineData(groups[cfg.batches.num_eval:], groups[: cfg.batches.num_eval], {}, "token rows")
'''


def write_source(tmp_path, rows=14):
    (tmp_path / "token_source.py").write_text(SOURCE)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": [1, 5 + i % 7], "completion": [7, 8 + i % 3, 9, 2],
                                        "mask": [1, 1, 0, 1] if i % 2 else None}) + "\n" for i in range(rows)))
    return {"source": f"{tmp_path / 'token_source.py'}:token_rows", "dataset": str(data), "size": 4,
            "num_eval": 2}


def offline_config(tmp_path, steps, **sections):
    sections.setdefault("batches", write_source(tmp_path))
    sections.setdefault("algo", {"terms": [{"name": "nll"}]})
    return toy_run_config(tmp_path, steps, **sections)


def run(cfg, model=None):
    from lmrl.loops import build_stages, train

    tok = make_tokenizer()
    model = model or tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    stages = build_stages(cfg, model=model, tokenizer=tok)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, stages


def hand_nll(model, groups) -> float:
    """Token-mean −log p of the trained tokens of `groups`, computed row by row without the learner."""
    total, count = 0.0, 0
    with torch.no_grad():
        for g in groups:
            for x in g.samples:
                ids = torch.tensor([x.input_ids])
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                picked = logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]][len(x.prompt_ids) - 1:]
                mask = torch.tensor(x.loss_mask or [1] * len(x.completion_ids), dtype=torch.float)
                total += float(-(picked * mask).sum())
                count += int(mask.sum())
    return total / count


def test_an_offline_source_trains_by_its_terms_alone(tmp_path):
    tok = make_tokenizer()
    model = tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0)
    cfg = offline_config(tmp_path, 6, eval={"at_start": True, "at_end": True, "num_prompts": 2})
    first = None
    from lmrl.loops import build_stages, train

    stages = build_stages(cfg, model=model, tokenizer=tok)
    groups, _ = step_groups(stages.offline, 4, cfg.trainer.seed, 1)
    first = hand_nll(model, groups)
    held_before = hand_nll(model, stages.offline.eval)
    result = train(cfg, stages=stages)
    rows = [json.loads(ln) for ln in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "nll" in r]
    assert len(steps) == 6 and not any("reward/mean" in r or "pg_loss" in r for r in steps)
    assert steps[0]["nll"] == pytest.approx(first, rel=1e-5)  # the learner's NLL is the hand-computed one
    assert steps[0]["loss"] == pytest.approx(first, rel=1e-5)  # the objective: its one term
    from lmrl.loops.progress import step_line
    line = step_line(1, 6, steps[0])
    assert f"loss {first:.4f}" in line and "reward" not in line and steps[0]["train/tokens_per_s"] > 0
    assert steps[-1]["nll"] < steps[0]["nll"]
    assert steps[-1]["data/epoch"] == pytest.approx(6 * 4 / 12)
    evals = [r for r in rows if "eval/loss" in r]
    assert evals[0]["eval/loss"] == pytest.approx(held_before, rel=1e-5)
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]


def test_the_order_is_a_function_of_the_step(tmp_path):
    cfg = offline_config(tmp_path, 2)
    _, stages = run(cfg)
    data = stages.offline
    seen = [g.uid for step in range(1, 7) for g in step_groups(data, 4, 1, step)[0]]
    assert sorted(seen[:12]) == sorted(g.uid for g in data.train)  # one epoch visits every row once
    assert seen[:12] != seen[12:]  # and the next one reshuffles
    assert [g.uid for g in step_groups(data, 4, 1, 5)[0]] == seen[16:20]


def test_a_resumed_offline_run_ends_as_an_uninterrupted_one(tmp_path):
    from lmrl.loading import load_run_config
    from lmrl.loops import build_stages, train

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    straight, _ = run(offline_config(tmp_path / "a", 5))
    run(offline_config(tmp_path / "b", 3))  # ends with a checkpoint at step 3
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed_cfg = load_run_config(run_dir, ["trainer.steps=5"])
    tok = make_tokenizer()
    stages = build_stages(resumed_cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0),
                          tokenizer=tok)
    train(resumed_cfg, resume=run_dir, stages=stages)
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = {r["step"]: r["nll"] for r in rows if "nll" in r}
    assert [resumed[s] for s in range(1, 6)] == pytest.approx([r["nll"] for r in straight if "nll" in r], rel=1e-6)


def test_offline_sources_refuse_what_only_rollouts_have(tmp_path):
    batches = write_source(tmp_path)
    with pytest.raises(ConfigError, match="lists none"):
        offline_config(tmp_path, 1, algo={"terms": []})
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        offline_config(tmp_path, 1, batches=batches, rollout={"max_staleness": 1})
    with pytest.raises(ConfigError, match="batches.dataset"):
        offline_config(tmp_path, 1, batches={"source": "sft"})
