"""Task mixtures: each step's prompts split among the tasks by their shares (hand-computed), each task's groups
scored by its own reward and reported under its name, each task evaluated on its own held-out rows, a resumed
mixture the straight run, and the configurations a mixture refuses, each with its reason."""
from __future__ import annotations

import json

import pytest

from conftest import run_tiny, toy_run_config, write_toy_task
from lmrl.config import ConfigError, MixtureConfig
from lmrl.data.mixture import allocate
from lmrl.envs.mixture import MixtureEntry, task_shares
from lmrl.rewards import REWARD_FNS

if "contains_3" not in REWARD_FNS:
    REWARD_FNS.register("contains_3", "toy reward for the mixture tests")(lambda sample, **_: float("3" in sample.text))


def entries(sizes: dict[str, int], weights: dict[str, float]) -> list[MixtureEntry]:
    return [MixtureEntry(n, weights[n], None, train_rows=[{}] * sizes[n]) for n in sizes]


def test_allocate_follows_the_shares_exactly_over_steps():
    credit: dict[str, float] = {}
    shares = {"a": 2 / 3, "b": 1 / 3}
    # credit a: 8/3 -> take 2, the spare prompt to a (.67 > .33); a: -1/3 + 8/3 = 7/3, b: 1/3 + 4/3 = 5/3 -> the
    # spare to b (.67 > .33); then a: 1/3 + 8/3 = 3, b: -1/3 + 4/3 = 1 exactly
    assert [allocate(shares, 4, credit) for _ in range(3)] == [{"a": 3, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 1}]
    assert credit == pytest.approx({"a": 0.0, "b": 0.0}, abs=1e-9)
    assert allocate({"a": 0.0, "b": 1.0}, 4, {}) == {"a": 0, "b": 4}


def test_shares_by_weight_temperature_and_schedule():
    tasks = entries({"a": 10, "b": 40}, {"a": 1.0, "b": 1.0})
    assert task_shares(MixtureConfig(), tasks, 1) == {"a": 0.5, "b": 0.5}
    # temperature 2: p ∝ sqrt(weight · rows) = sqrt(10), sqrt(40) -> 1/3, 2/3
    assert task_shares(MixtureConfig(sampling="temperature", temperature=2.0), tasks, 1) == \
        pytest.approx({"a": 1 / 3, "b": 2 / 3})
    scheduled = MixtureConfig(sampling="schedule", schedule=[{"step": 2, "weights": {"a": 1.0}},
                                                             {"step": 12, "weights": {"a": 1.0, "b": 3.0}}])
    assert task_shares(scheduled, tasks, 1) == {"a": 1.0, "b": 0.0}  # held before the first point
    assert task_shares(scheduled, tasks, 7) == pytest.approx({"a": 1 / 2.5, "b": 1.5 / 2.5})  # halfway: a 1, b 1.5
    assert task_shares(scheduled, tasks, 30) == {"a": 0.25, "b": 0.75}


def write_threes(path, n: int = 24):
    path.write_text("".join(json.dumps({"question": f"q{i % 6} say 3", "answer": "3"}) + "\n" for i in range(n)))
    return path


def mixture_config(tmp_path, steps, **mixture):
    tmp_path.mkdir(parents=True, exist_ok=True)
    sevens, threes = write_toy_task(tmp_path / "sevens.jsonl", 40), write_threes(tmp_path / "threes.jsonl")
    tasks = [{"name": "sevens", "weight": 3.0, "task": {"dataset": str(sevens), "num_eval": 4, "num_train": 36}},
             {"name": "threes", "weight": 1.0, "task": {"dataset": str(threes), "num_eval": 2, "num_train": 22},
              "reward": {"components": [{"name": "contains_3"}], "accuracy_component": "contains_3"}}]
    return toy_run_config(tmp_path, steps, mixture={"tasks": tasks, **mixture},
                          eval={"at_start": False, "at_end": True, "max_new_tokens": 4},
                          run={"output_dir": str(tmp_path / "runs"), "name": "toy", "progress": False,
                               "checkpoint_every": 2})


def test_each_task_is_sampled_by_its_share_scored_by_its_reward_and_evaluated_apart(tmp_path):
    logged, stages = run_tiny(mixture_config(tmp_path, 2))
    steps = [r for r in logged if "reward/mean" in r]
    # shares 3/4, 1/4 of 4 prompts: exactly 3 and 1 each step
    assert [(r["mixture/sevens/prompts"], r["mixture/threes/prompts"]) for r in steps] == [(0.75, 0.25)] * 2
    for r in steps:
        assert {"task/sevens/reward/contains_7", "task/threes/reward/contains_3", "task/threes/accuracy"} <= set(r)
        assert "task/sevens/reward/contains_3" not in r and "reward/contains_7" not in r  # no cross-task mean
        weighted = (24 * r["task/sevens/accuracy"] + 8 * r["task/threes/accuracy"]) / 32  # 3 and 1 groups of 8
        assert r["accuracy"] == pytest.approx(weighted)
        assert r["task/sevens/advantage_share"] + r["task/threes/advantage_share"] == pytest.approx(1.0)
        assert 0.0 <= r["task/threes/zero_variance_groups"] <= 1.0
    rows = {e.name: e for e in stages.mixture.values()}
    assert {r["uid"].split("/")[0] for r in rows["threes"].train_rows} == {"threes"}
    final = [r for r in logged if "eval/accuracy" in r][-1]
    assert final["eval/task/sevens/num_prompts"] == 4 and final["eval/task/threes/num_prompts"] == 2
    assert final["eval/num_prompts"] == 6
    assert final["eval/accuracy"] == pytest.approx((4 * final["eval/task/sevens/accuracy"]
                                                    + 2 * final["eval/task/threes/accuracy"]) / 6)


def test_task_std_gets_each_row_s_task_from_the_batch(tmp_path, monkeypatch):
    import functools

    from lmrl.algos.advantages import ADVANTAGES, grpo

    seen = []

    @functools.wraps(grpo)
    def recording(*args, **kwargs):
        seen.append(kwargs)
        return grpo(*args, **kwargs)

    monkeypatch.setitem(ADVANTAGES._items, "grpo", recording)
    cfg = mixture_config(tmp_path, 1)
    run_tiny(cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"advantage_params": {"task_std": True}})}))
    # 3 sevens prompts, then 1 threes prompt, of 8 samples each; the tasks by name: sevens 0, threes 1
    assert seen[0]["task_std"] is True and seen[0]["task_index"].tolist() == [0] * 24 + [1] * 8


def test_a_resumed_mixture_is_the_straight_run_tiny(tmp_path):
    from lmrl.loading import load_run_config

    straight, _ = run_tiny(mixture_config(tmp_path / "a", 4))
    run_tiny(mixture_config(tmp_path / "b", 2))
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed, _ = run_tiny(load_run_config(run_dir, ["trainer.steps=4"]), resume=run_dir)
    keys = ("reward/mean", "task/sevens/accuracy", "task/threes/reward/mean", "mixture/threes/prompts", "loss")
    pick = lambda rows: [r[k] for r in rows if "reward/mean" in r and r["step"] > 2 for k in keys]  # noqa: E731
    assert pick(resumed) == pytest.approx(pick(straight), rel=1e-5)


def test_a_resumed_progress_mixture_is_the_straight_run_tiny(tmp_path):
    from lmrl.loading import load_run_config

    knobs = {"sampling": "progress", "progress_window": 1, "progress_floor": 0.5}
    straight, _ = run_tiny(mixture_config(tmp_path / "a", 4, **knobs))
    run_tiny(mixture_config(tmp_path / "b", 2, **knobs))
    run_dir = tmp_path / "b" / "runs" / "toy"
    resumed, _ = run_tiny(load_run_config(run_dir, ["trainer.steps=4"]), resume=run_dir)
    keys = ("mixture/sevens/weight", "mixture/threes/progress", "mixture/threes/prompts", "reward/mean", "loss")
    pick = lambda rows: [r[k] for r in rows if "reward/mean" in r and r["step"] > 2 for k in keys]  # noqa: E731
    assert pick(resumed) == pytest.approx(pick(straight), rel=1e-5)
    weights = [r["mixture/sevens/weight"] for r in straight if "reward/mean" in r]
    assert weights[0] == 0.75 and len(set(weights)) > 1  # the weight shares first, then moved by progress


@pytest.mark.parametrize("change, message", [
    (lambda t: t[1].update(name="sevens"), "the name 'sevens' is used twice"),
    (lambda t: t[0].update(data={"group_filter": "nonzero_std"}), r"mixture.tasks\[0\] \(sevens\).data.group_filter: "
                                                                  "a task sets only its sampler and sampler_params"),
    (lambda t: t[0]["task"].update(datset="x"), r"unknown config key 'mixture.tasks\[0\] \(sevens\).task.datset'"),
    (lambda t: t[1].update(reward={"components": [{"name": "no_such_reward"}]}), "mixture task threes: "),
    (lambda t: [x.update(weight=0.0) for x in t], "every weight is 0"),
])
def test_what_a_mixture_refuses(tmp_path, change, message):
    cfg = mixture_config(tmp_path, 1)
    tasks = [t.model_dump() for t in cfg.mixture.tasks]
    change(tasks)
    with pytest.raises(ConfigError, match=message):
        toy_run_config(tmp_path, 1, mixture={"tasks": tasks})


def test_a_schedule_names_known_tasks_and_an_offline_source_is_refused(tmp_path):
    tasks = [t.model_dump() for t in mixture_config(tmp_path, 1).mixture.tasks]
    with pytest.raises(ConfigError, match="mixture.schedule at step 0: no task 'fours'"):
        toy_run_config(tmp_path, 1, mixture={"tasks": tasks, "sampling": "schedule",
                                             "schedule": [{"step": 0, "weights": {"fours": 1.0}}]})
    with pytest.raises(ConfigError, match="mixture.schedule is set but mixture.sampling=proportional"):
        toy_run_config(tmp_path, 1, mixture={"tasks": tasks, "schedule": [{"step": 0, "weights": {"sevens": 1.0}}]})
    with pytest.raises(ConfigError, match="data.demonstrations=peers: a sample source adds samples built from one"):
        toy_run_config(tmp_path, 1, mixture={"tasks": tasks}, data={"demonstrations": "peers"})
    with pytest.raises(ConfigError, match="a mixture's tasks are sampled prompts"):
        toy_run_config(tmp_path, 1, mixture={"tasks": tasks}, batches={"source": "sft", "dataset": "x.jsonl"},
                       algo={"terms": [{"name": "nll"}]})


def test_a_task_with_too_few_rows_for_its_share_is_refused(tmp_path):
    cfg = mixture_config(tmp_path, 1)
    tasks = [t.model_dump() for t in cfg.mixture.tasks]
    tasks[1]["weight"] = 30.0  # threes would take all 4 prompts of a step but keeps 2 training rows
    tasks[1]["task"].update(num_train=2)
    with pytest.raises(ConfigError, match="mixture task threes: 2 training rows, fewer than the 4 prompts"):
        run_tiny(toy_run_config(tmp_path / "second", 1, mixture={"tasks": tasks}))


def test_a_task_without_held_out_rows_is_refused_unless_it_asks_for_none(tmp_path):
    tasks = [t.model_dump() for t in mixture_config(tmp_path, 1).mixture.tasks]
    tasks[1]["task"].update(num_eval=0)
    cfg = toy_run_config(tmp_path, 1, mixture={"tasks": tasks}, eval={"at_start": False, "at_end": True})
    logged, stages = run_tiny(cfg)
    assert stages.mixture["threes"].eval_rows == [] and "eval/task/threes/accuracy" not in logged[-1]
    assert logged[-1]["eval/num_prompts"] == 4  # the sevens' held-out rows alone
    tasks[1]["task"] = {"name": "reasoning_gym", "dataset": "basic_arithmetic", "num_train": 2000, "num_eval": 10,
                        "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                   "operators": ["*"], "allow_parentheses": False, "allow_negation": False}}
    # 81 problems, all among 2000 training rows: no held-out candidate is left
    with pytest.raises(ConfigError, match="mixture task threes: no held-out rows"):
        run_tiny(toy_run_config(tmp_path / "second", 1, mixture={"tasks": tasks}))
