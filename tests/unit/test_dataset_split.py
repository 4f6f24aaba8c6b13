"""The held-out split fits the data: a share of a small file (or the dataset's own eval split), both
counts reported, and a run with fewer training rows than one step needs is refused before the model."""
import json

import pytest

from conftest import make_tokenizer, tiny_llama
from lmrl import cli
from lmrl.config import ConfigError, TaskConfig
from lmrl.envs import load_task, prepare_data
from lmrl.envs.tasks import TaskError
from lmrl.loading import build_config, load_config


def rows_file(path, n, start=0):
    path.write_text("".join(json.dumps({"question": f"what is {i}?", "answer": i}) + "\n"
                            for i in range(start, start + n)))
    return path


def test_a_40_row_file_under_the_quickstart_holds_out_4_and_trains_on_36(tmp_path):
    data = rows_file(tmp_path / "d.jsonl", 40)
    cfg = load_config("quickstart", ["task.name=jsonl", f"task.dataset={data}"])
    task = load_task(cfg.task)
    assert (len(task.train), len(task.eval)) == (36, 4)  # 10 % of 40
    assert not {r["uid"] for r in task.train} & {r["uid"] for r in task.eval}
    assert "10% of the 40 rows" in task.held_out_from


def test_the_share_is_capped_at_100_rows(tmp_path):
    data = rows_file(tmp_path / "d.jsonl", 1500)
    task = load_task(TaskConfig(name="jsonl", dataset=str(data)))
    assert (len(task.train), len(task.eval)) == (1400, 100)


def test_a_file_too_small_for_a_tenth_holds_out_nothing(tmp_path):
    task = load_task(TaskConfig(name="jsonl", dataset=str(rows_file(tmp_path / "d.jsonl", 9))))
    assert (len(task.train), len(task.eval)) == (9, 0)


def test_an_explicit_num_eval_is_honoured(tmp_path):
    task = load_task(TaskConfig(name="jsonl", dataset=str(rows_file(tmp_path / "d.jsonl", 40)), num_eval=30))
    assert (len(task.train), len(task.eval)) == (10, 30)


def test_a_num_eval_that_leaves_no_training_row_is_refused(tmp_path):
    with pytest.raises(TaskError, match=r"task.num_eval=40 holds out all 40 rows of .*d.jsonl"):
        load_task(TaskConfig(name="jsonl", dataset=str(rows_file(tmp_path / "d.jsonl", 40)), num_eval=40))


def test_generated_tasks_keep_100_held_out_rows_by_default():
    task = load_task(TaskConfig(name="bandit", num_train=3))
    assert (len(task.train), len(task.eval)) == (3, 100)


def test_eval_dataset_is_the_held_out_set_and_every_dataset_row_trains(tmp_path):
    train, test = rows_file(tmp_path / "train.jsonl", 40), rows_file(tmp_path / "test.jsonl", 12, start=100)
    task = load_task(TaskConfig(name="jsonl", dataset=str(train), params={"eval_dataset": str(test)}))
    assert (len(task.train), len(task.eval)) == (40, 12)
    assert {r["answer"] for r in task.eval} == {str(i) for i in range(100, 112)}
    capped = load_task(TaskConfig(name="jsonl", dataset=str(train), params={"eval_dataset": str(test)}, num_eval=5))
    assert len(capped.eval) == 5 and len(capped.train) == 40


def test_hf_dataset_eval_split_of_a_saved_dataset_dict(tmp_path):
    import datasets

    def part(n, start):
        return datasets.Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(start, start + n)])

    datasets.DatasetDict({"train": part(30, 0), "test": part(7, 100)}).save_to_disk(tmp_path / "ds")
    task = load_task(TaskConfig(name="hf_dataset", dataset=str(tmp_path / "ds"), params={"eval_split": "test"}))
    assert (len(task.train), len(task.eval)) == (30, 7)
    assert {r["answer"] for r in task.eval} == {str(i) for i in range(100, 107)}
    assert "split 'test'" in task.held_out_from
    with pytest.raises(TaskError, match=r"no split 'dev'.*train, test"):
        load_task(TaskConfig(name="hf_dataset", dataset=str(tmp_path / "ds"), params={"eval_split": "dev"}))


def test_fewer_training_rows_than_one_step_is_a_config_error_before_the_model_loads(tmp_path):
    data = rows_file(tmp_path / "d.jsonl", 10)
    cfg = build_config({"task": {"name": "jsonl", "dataset": str(data), "system_prompt": None, "num_eval": 4},
                        "rollout": {"prompts_per_step": 8}})
    with pytest.raises(ConfigError, match=r"6 training rows, fewer than one step rolls out \(rollout.prompts_per_step=8\)"):
        prepare_data(cfg, make_tokenizer())


def test_prepared_data_reports_both_counts(tmp_path):
    cfg = build_config({"task": {"name": "jsonl", "dataset": str(rows_file(tmp_path / "d.jsonl", 40)),
                                 "system_prompt": None}})
    train, held, notes = prepare_data(cfg, make_tokenizer())
    assert (len(train), len(held)) == (36, 4)
    assert notes["data/train_rows"] == 36.0 and notes["data/eval_rows"] == 4.0


def test_dry_run_prints_the_real_train_and_eval_counts(tmp_path, tiny_model_dir, capsys):
    data = rows_file(tmp_path / "d.jsonl", 40)
    assert cli.main(["train", f"model.path={tiny_model_dir}", "task.name=jsonl", f"task.dataset={data}",
                     f"run.output_dir={tmp_path / 'runs'}", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "36 training rows, 4 held out" in err and "first 16 training rows load" in err


def test_a_run_prints_both_counts_at_its_start(tmp_path, capsys):
    from lmrl.loops.setup import build_stages

    tok = make_tokenizer()
    cfg = build_config({"task": {"name": "jsonl", "dataset": str(rows_file(tmp_path / "d.jsonl", 40)),
                                 "system_prompt": None},
                        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}})
    build_stages(cfg, model=tiny_llama(len(tok), hidden=32, layers=2, heads=4, seed=0), tokenizer=tok)
    assert "data: 36 training rows, 4 held out (10% of the 40 rows" in capsys.readouterr().err  # run output: stderr
