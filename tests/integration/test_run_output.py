"""What a tiny run tells on the console and in its metrics: a broken reward stops it with a one-line error,
output to a pipe is one line per step, reward time is its own timing, held-out accuracy ignores other rewards."""
from __future__ import annotations

import json
import math
import re
import time

import pytest

from conftest import make_tokenizer, toy_run_config, toy_run_on_disk
from lmrl import cli
from lmrl.config import config_to_yaml
from lmrl.eval.evaluator import evaluate
from lmrl.loops import build_stages, train
from lmrl.models import tiny_llama
from lmrl.rewards import REWARD_FNS

# the report's reward: it reads `target`, a field the toy rows do not have (they have `answer`)
USER_REWARD = '''
def target_field(sample, **_):
    return float(sample.info["row"]["target"] in sample.info["text"])
'''


def stages_for(cfg):
    tok = make_tokenizer()
    return build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)


def metric_rows(run_dir) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def user_run(tmp_path, *overrides: str) -> tuple[int, str]:
    """`lmrl train` on the toy task with the user's broken reward as the accuracy component: (exit code, stderr)."""
    disk = toy_run_on_disk(tmp_path)
    (tmp_path / "my_rewards.py").write_text(USER_REWARD)
    name = f"{tmp_path / 'my_rewards.py'}:target_field"
    cfg = toy_run_config(tmp_path, 2, num_eval=4, model=disk["model"],
                         reward={"components": [{"name": name}], "accuracy_component": name},
                         eval={"at_start": True, "at_end": True})
    (tmp_path / "run.yaml").write_text(config_to_yaml(cfg))
    return cli.main(["train", str(tmp_path / "run.yaml"), *overrides]), name


@pytest.mark.parametrize("loop", [[], ["rollout.max_staleness=0"]], ids=["sync", "async"])
def test_a_broken_reward_stops_the_run_with_a_one_line_error(tmp_path, capsys, loop):
    code, name = user_run(tmp_path, *loop)
    out, err = capsys.readouterr()
    assert code == 2
    path = tmp_path / "my_rewards.py"
    assert err.count(f'File "{path}", line 3, in target_field') == 1  # the first error, shown once (at eval)
    error = err[err.index("\nerror: ") + 1:]  # the CLI's message, after the reward's own report
    assert error.splitlines()[0] == ("error: step 1: 100% of the samples had reward errors, above "
                                     "reward.max_error_rate=0.5")
    assert f"reward {name} failed on 100% of the samples: error: KeyError: 'target'" in error
    assert f"first raised at {path}:3 in target_field" in error
    assert "Traceback" not in error  # a message, not a crash
    rows = metric_rows(tmp_path / "runs" / "toy")
    assert [r["eval/excluded"] for r in rows if "eval/excluded" in r] == [4.0]  # the eval at start: none graded
    assert not any("loss" in r or "reward/mean" in r for r in rows)  # no step trained


def test_max_error_rate_one_trains_on_and_the_summary_counts_the_ungraded(tmp_path, capsys):
    code, _ = user_run(tmp_path, "reward.max_error_rate=1.0")
    err = capsys.readouterr().err
    assert code == 0
    assert "held-out greedy accuracy (4 prompts; ungraded, the accuracy component erred: 4 before, 4 after)" in err
    steps = [r for r in metric_rows(tmp_path / "runs" / "toy") if "skipped_updates" in r]
    assert [r["reward_error_share"] for r in steps] == [1.0, 1.0]


@pytest.mark.parametrize("staleness", [None, 0], ids=["sync", "async"])
def test_on_a_pipe_each_step_and_evaluation_is_a_plain_line_on_stderr(tmp_path, capsys, staleness):
    cfg = toy_run_config(tmp_path, 2, num_eval=4, eval={"at_start": True, "at_end": True},
                         run={"progress": True}, rollout={"max_staleness": staleness})
    train(cfg, stages=stages_for(cfg))
    out, err = capsys.readouterr()
    assert out == ""  # one stream for the whole run: stderr
    lines = err.splitlines()
    lines = lines[next(i for i, ln in enumerate(lines) if ln.startswith("eval step 0")):]  # after the data summary
    number = r"\d+\.\d+"
    assert re.fullmatch(rf"eval step 0  0/4 rows generated  {number}s", lines[0])
    assert re.fullmatch(rf"eval step 0  acc {number}  excluded 0/4  {number}s", lines[2])
    assert re.fullmatch(rf"step 1/2  reward {number}  acc {number}  errors 0\.00  tok/s \d+  {number}s", lines[3])
    assert re.fullmatch(rf"step 2/2  reward {number}  acc {number}  errors 0\.00  tok/s \d+  {number}s", lines[4])
    assert lines[5].startswith("eval step 2  0/4 rows generated") and lines[7].startswith("eval step 2  acc ")


@pytest.mark.parametrize("staleness", [None, 0], ids=["sync", "async"])
def test_reward_time_is_logged_apart_from_rollout_time(tmp_path, monkeypatch, staleness):
    def slow_seven(sample, **_):
        time.sleep(0.03)
        return float("7" in sample.text)

    timings = {}
    for name, fn in [("fast", lambda sample, **_: float("7" in sample.text)), ("slow", slow_seven)]:
        monkeypatch.setitem(REWARD_FNS._items, name, fn)
        cfg = toy_run_config(tmp_path / name, 1, reward={"components": [{"name": name}], "accuracy_component": name},
                             rollout={"max_staleness": staleness})
        train(cfg, stages=stages_for(cfg))
        timings[name] = metric_rows(tmp_path / name / "runs" / "toy")[-1]
    slept = 32 * 0.03  # 4 prompts × 8 samples
    assert timings["slow"]["timing/reward_s"] >= slept > timings["fast"]["timing/reward_s"]
    assert timings["slow"]["timing/rollout_s"] - timings["fast"]["timing/rollout_s"] < slept / 2


def test_held_out_accuracy_is_the_accuracy_component_alone(tmp_path, monkeypatch, capsys):
    def even(sample, **_):
        return float(len(sample.text) % 2 == 0)

    def even_or_raise(sample, **_):
        if len(sample.text) % 2:
            raise ValueError("odd reply")
        return 1.0

    for name, fn in [("even", even), ("even_or_raise", even_or_raise), ("bonus", lambda sample, **_: 0.5),
                     ("nan_bonus", lambda sample, **_: math.nan)]:
        monkeypatch.setitem(REWARD_FNS._items, name, fn)

    def held_out(*names: str) -> tuple[dict, list]:
        cfg = toy_run_config(tmp_path, 1, num_eval=16, reward={"components": [{"name": n} for n in names],
                                                               "accuracy_component": names[-1]})
        s = stages_for(cfg)
        return evaluate(s.engine, s.tokenizer, s.eval_rows, s.scorer, cfg.eval, cfg.rollout.max_new_tokens,
                        names[-1], seed=cfg.trainer.seed)

    working, groups = held_out("bonus", "even")
    failing, _ = held_out("nan_bonus", "even")
    texts = [g.samples[0].text for g in groups]
    evens = sum(len(t) % 2 == 0 for t in texts)
    assert 0 < evens < len(texts)  # the test can tell right from wrong
    assert working["eval/accuracy"] == failing["eval/accuracy"] == evens / len(texts)
    assert working["eval/excluded"] == failing["eval/excluded"] == 0.0

    capsys.readouterr()
    grading_fails, _ = held_out("bonus", "even_or_raise")
    assert grading_fails["eval/excluded"] == len(texts) - evens  # odd replies: no verdict, not wrong
    assert grading_fails["eval/accuracy"] == 1.0
    assert capsys.readouterr().err.count("ValueError: odd reply") == 2  # header and traceback, once
