"""Loading errors name the file (and line): empty files, invalid UTF-8, and a local path with a typo that
must not be looked up on the hub."""
import pytest

from lmrl.config import TaskConfig
from lmrl.envs import load_task
from lmrl.envs.tasks import TaskError
from lmrl.models.loading import is_hub_id, resolve_model_path


@pytest.fixture
def no_hub(monkeypatch):
    """Any hub look-up fails the test: a local path must be reported at once."""
    import datasets
    import huggingface_hub

    def called(*args, **kwargs):
        raise AssertionError(f"hub looked up: {args}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", called)
    monkeypatch.setattr(datasets, "load_dataset", called)


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.json"])
def test_an_empty_hf_dataset_file_names_the_file(tmp_path, name):
    path = tmp_path / name
    path.write_text("" if name.startswith("empty") else "\n \n")
    with pytest.raises(TaskError, match=rf"{path}: the file is empty"):
        load_task(TaskConfig(name="hf_dataset", dataset=str(path), num_eval=0))


def test_invalid_utf8_in_a_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"question": "a", "answer": 1}\n{"question": "b\xff", "answer": 2}\n')
    with pytest.raises(TaskError, match=rf"{path}:2: not valid UTF-8 \(byte 0xff at column 16\)"):
        load_task(TaskConfig(name="jsonl", dataset=str(path), num_eval=0))


def test_invalid_utf8_in_an_hf_dataset_file_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"question": "a", "answer": 1}\n\n{"question": "\xc3(", "answer": 2}\n')
    with pytest.raises(TaskError, match=rf"{path}:3: not valid UTF-8"):
        load_task(TaskConfig(name="hf_dataset", dataset=str(path), num_eval=0))


@pytest.mark.parametrize("name", ["data.jsnl", "sub/data.jsnl", "train.tsv"])
def test_a_missing_dataset_file_with_an_unknown_suffix_is_not_looked_up_on_the_hub(tmp_path, monkeypatch, no_hub,
                                                                                    name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TaskError, match=rf"task.dataset: no dataset at {name}: no such file or directory"):
        load_task(TaskConfig(name="hf_dataset", dataset=name))


@pytest.mark.parametrize("name", ["./mymodel.bin", "mymodel.pt", "ckpt/model.pth", "~/nowhere/m"])
def test_a_missing_local_model_file_fails_at_once(tmp_path, monkeypatch, no_hub, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"model {name!r}: no such file or directory"):
        resolve_model_path(name)


def test_hub_ids_with_dots_are_still_hub_ids():
    for repo in ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B", "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                 "HuggingFaceH4/MATH-500", "openai/gsm8k", "gpt2"):
        assert is_hub_id(repo), repo
    for local in ("data.jsnl", "mymodel.pt", "org/model.bin", "weights.ckpt"):
        assert not is_hub_id(local), local
