"""Tasks and prompts: reasoning-gym, JSONL and HF datasets; bad datasets fail with clear errors."""
import json

import pytest

from conftest import make_tokenizer
from lmrl.config import TaskConfig
from lmrl.envs import TaskError, encode_rows, load_task, prepare_data
from lmrl.loading import build_config


def test_reasoning_gym_task_has_disjoint_held_out_rows():
    cfg = TaskConfig(dataset="basic_arithmetic", num_train=50, num_eval=20,
                     params={"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"]})
    data = load_task(cfg)
    assert len(data.train) == 50 and len(data.eval) == 20
    assert not {r["question"] for r in data.train} & {r["question"] for r in data.eval}
    assert all("entry" in r and r["answer"] for r in data.train)


def test_unknown_reasoning_gym_dataset():
    with pytest.raises(TaskError, match="no_such_task"):
        load_task(TaskConfig(dataset="no_such_task"))


def write(tmp_path, lines):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_task_splits_and_keeps_fields(tmp_path):
    path = write(tmp_path, [json.dumps({"q": f"what is {i}?", "a": i, "topic": "x"}) for i in range(10)])
    data = load_task(TaskConfig(name="jsonl", dataset=str(path), prompt_field="q", answer_field="a", num_eval=3))
    assert len(data.train) == 7 and len(data.eval) == 3
    assert data.train[0]["topic"] == "x" and isinstance(data.train[0]["answer"], str)


@pytest.mark.parametrize("lines,match", [
    ([], "empty"),
    (['{"question": "a", "answer": 1}', "{not json"], r"d.jsonl:2: not valid JSON"),
    (['{"question": "a"}'], r"lacks field\(s\) \['answer'\]"),
    (['{"question": "", "answer": 1}', '{"question": "b", "answer": 2}'], "no prompt text"),
    (['[1, 2]'], "not an object"),
])
def test_bad_jsonl_is_rejected(tmp_path, lines, match):
    with pytest.raises(TaskError, match=match):
        load_task(TaskConfig(name="jsonl", dataset=str(write(tmp_path, lines)), num_eval=0))


def test_missing_dataset_file(tmp_path):
    with pytest.raises(TaskError, match="task.dataset: no such file"):
        load_task(TaskConfig(name="jsonl", dataset=str(tmp_path / "nope.jsonl")))


def test_hf_dataset_from_disk(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(6)]).save_to_disk(tmp_path / "ds")
    data = load_task(TaskConfig(name="hf_dataset", dataset=str(tmp_path / "ds"), num_eval=2))
    assert len(data.train) == 4 and len(data.eval) == 2


def test_long_prompts_are_dropped_and_counted(tmp_path):
    tok = make_tokenizer()
    rows = [{"uid": "a", "question": "short", "answer": "1"}, {"uid": "b", "question": "x" * 500, "answer": "1"}]
    kept, dropped = encode_rows(tok, rows, None, max_prompt_tokens=64)
    assert [r["uid"] for r in kept] == ["a"] and dropped == 1
    assert kept[0]["prompt_ids"][-3:] == tok("<|im_start|>assistant\n")["input_ids"][-3:]


def test_all_prompts_too_long_fails_before_the_model_loads(tmp_path):
    path = write(tmp_path, [json.dumps({"question": "a long question " * 20, "answer": 1})] * 4)
    cfg = build_config({"task": {"name": "jsonl", "dataset": str(path), "max_prompt_tokens": 10, "num_eval": 1}})
    with pytest.raises(TaskError, match="max_prompt_tokens"):
        prepare_data(cfg, make_tokenizer())


def test_rows_keep_the_dataset_field_names_and_the_gold_is_also_under_answer(tmp_path):
    path = write(tmp_path, [json.dumps({"problem": f"what is {i}?", "target": i, "topic": "x"}) for i in range(4)])
    data = load_task(TaskConfig(name="jsonl", dataset=str(path), prompt_field="problem", answer_field="target",
                                num_eval=0))
    row = data.train[0]
    assert row["target"] == int(row["answer"]) and isinstance(row["target"], int)  # the original, as it was
    assert row["problem"] == row["question"] and row["topic"] == "x"
    kept, _ = encode_rows(make_tokenizer(), data.train, None, max_prompt_tokens=64)
    assert kept[0]["target"] == row["target"]  # what a reward reads as sample.row


def test_a_null_gold_answer_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, ['{"question": "a", "target": 1}', "", '{"question": "b", "target": null}'])
    with pytest.raises(TaskError, match=r"d.jsonl:3: record 1 has no gold answer: field 'target' is null"):
        load_task(TaskConfig(name="jsonl", dataset=str(path), answer_field="target", num_eval=0))


def test_a_field_named_answer_that_is_not_the_gold_is_refused(tmp_path):
    path = write(tmp_path, ['{"question": "a", "target": "1", "answer": "the long answer"}'])
    with pytest.raises(TaskError, match=r"d.jsonl:1: record 0 has a field 'answer' .* task.answer_field='target'"):
        load_task(TaskConfig(name="jsonl", dataset=str(path), answer_field="target", num_eval=0))
    same = write(tmp_path, ['{"question": "a", "target": 1, "answer": "1"}'])
    assert load_task(TaskConfig(name="jsonl", dataset=str(same), answer_field="target", num_eval=0)).train[0]["answer"] == "1"
