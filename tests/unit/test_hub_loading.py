"""Hub ids for models and datasets: found in a local Hugging Face hub cache offline, helpful errors otherwise.

The caches are laid out as huggingface_hub writes them (`<cache>/models--org--name/{blobs,refs/main,
snapshots/<commit>/}`, snapshot files symlinked to blobs) and read with HF_HUB_OFFLINE=1, so no test
touches the network.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from conftest import make_tokenizer
from lmrl.config import TaskConfig
from lmrl.envs import TaskError, load_task
from lmrl.models import load_model, load_tokenizer, resolve_model_path, tiny_llama
from lmrl.models.loading import is_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub_repo(cache: Path, repo_id: str, files: Path, repo_type: str = "model",
                     commit: str = COMMIT) -> Path:
    """Copy the tree `files` into `cache` as a hub snapshot; return the snapshot folder."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for src in sorted(p for p in files.rglob("*") if p.is_file()):
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / src.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty hub cache in HF_HUB_CACHE, with every library offline (env and import-time constants)."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    try:
        import datasets.config
    except ImportError:
        pass
    else:
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    return cache


def saved_tiny_model(path: Path):
    tok = make_tokenizer()
    model = tiny_llama(vocab_size=len(tok), hidden=32, layers=2, heads=4, seed=3)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def test_hub_id_or_local_path():
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("gpt2") and is_hub_id("openai/gsm8k")
    for local in ("/abs/model", "./model", "a/b/c", "model.gguf", "data/train.jsonl", "org/--x", "~/m"):
        assert not is_hub_id(local), local


def test_model_loads_from_the_hub_cache_offline(tmp_path, offline_cache):
    model, tok = saved_tiny_model(tmp_path / "saved")
    snapshot = lay_out_hub_repo(offline_cache, "org/tiny-chat", tmp_path / "saved")

    assert resolve_model_path("org/tiny-chat") == snapshot
    loaded_tok = load_tokenizer("org/tiny-chat")
    assert loaded_tok("what is 2+2?")["input_ids"] == tok("what is 2+2?")["input_ids"]
    assert loaded_tok.chat_template == tok.chat_template
    loaded = load_model("org/tiny-chat")
    ids = torch.tensor([tok("say 7")["input_ids"]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_hf_home_locates_the_cache(tmp_path, offline_cache, monkeypatch):
    saved_tiny_model(tmp_path / "saved")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    snapshot = lay_out_hub_repo(tmp_path / "home" / "hub", "org/tiny", tmp_path / "saved")
    assert resolve_model_path("org/tiny") == snapshot


def test_missing_model_offline_names_id_cache_and_offline_flag(offline_cache):
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(err.value)
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in message
    assert str(offline_cache / "models--Qwen--Qwen2.5-0.5B-Instruct") in message and "does not exist" in message
    assert "HF_HUB_OFFLINE=1" in message and "hf download Qwen/Qwen2.5-0.5B-Instruct" in message


def test_cached_snapshot_without_weights_is_not_used(tmp_path, offline_cache):
    saved_tiny_model(tmp_path / "saved")
    for weights in (tmp_path / "saved").glob("*.safetensors"):
        weights.unlink()
    lay_out_hub_repo(offline_cache, "org/tiny", tmp_path / "saved")
    with pytest.raises(FileNotFoundError, match="holds no snapshot with config.json and weights"):
        resolve_model_path("org/tiny")


def test_online_download_goes_to_the_cache_and_failures_name_the_id(tmp_path, monkeypatch):
    """Not offline and not cached: snapshot_download fetches the model files (mocked: no network in tests)."""
    import huggingface_hub
    import huggingface_hub.constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = tmp_path / "cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    saved_tiny_model(tmp_path / "saved")
    calls = []

    def fake_download(repo_id, *, local_files_only=False, cache_dir=None, allow_patterns=None, **kw):
        calls.append((repo_id, local_files_only, Path(cache_dir), allow_patterns, kw.get("ignore_patterns")))
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        if repo_id == "org/missing":
            raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nmore")
        return str(lay_out_hub_repo(cache, repo_id, tmp_path / "saved"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model_path("org/tiny") == cache / "models--org--tiny" / "snapshots" / COMMIT
    local, fetch = calls
    assert local[:3] == ("org/tiny", True, cache) and fetch[:3] == ("org/tiny", False, cache)
    assert "*.safetensors" in fetch[3] and "*.json" in fetch[3] and fetch[4] == ["*/*"]

    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path("org/missing")
    message = str(err.value)
    assert "'org/missing'" in message and str(cache / "models--org--missing") in message
    assert "HF_HUB_OFFLINE is not set" in message and "Name or service not known" in message


def test_local_paths_keep_their_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="transformers directory containing config.json"):
        resolve_model_path(str(tmp_path / "nope"))


# --- datasets ----------------------------------------------------------------------------------------

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
# toy
"""


def dataset_repo_files(root: Path) -> Path:
    """A hub dataset repo like openai/gsm8k: a README declaring subset `main` with train and test splits."""
    (root / "main").mkdir(parents=True)
    (root / "README.md").write_text(README)
    for split, n in (("train", 6), ("test", 3)):
        rows = [{"prompt": [{"role": "user", "content": f"{split} {i}: what is {i}+{i}?"}], "answer": str(2 * i)}
                for i in range(n)]
        (root / "main" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_hub_dataset_from_the_hub_cache_offline(tmp_path, offline_cache):
    pytest.importorskip("datasets")
    lay_out_hub_repo(offline_cache, "org/toy-math", dataset_repo_files(tmp_path / "repo"), repo_type="dataset")
    cfg = TaskConfig(name="hf_dataset", dataset="org/toy-math", prompt_field="prompt", num_eval=1,
                     params={"subset": "main", "split": "test"})
    data = load_task(cfg)
    rows = data.train + data.eval
    assert len(rows) == 3 and len(data.eval) == 1
    assert {r["question"] for r in rows} == {f"test {i}: what is {i}+{i}?" for i in range(3)}
    assert all(r["prompt_messages"][0]["role"] == "user" for r in rows)

    with pytest.raises(TaskError, match=r"'org/toy-math' \(task.params subset='main', split='validation'\)"):
        load_task(cfg.model_copy(update={"params": {"subset": "main", "split": "validation"}}))


def test_missing_hub_dataset_offline_names_id_caches_and_offline_flag(tmp_path, offline_cache):
    datasets = pytest.importorskip("datasets")
    with pytest.raises(TaskError) as err:
        load_task(TaskConfig(name="hf_dataset", dataset="openai/gsm8k", params={"subset": "main"}))
    message = str(err.value)
    assert "'openai/gsm8k'" in message and str(offline_cache / "datasets--openai--gsm8k") in message
    assert str(datasets.config.HF_DATASETS_CACHE) in message
    assert "HF_HUB_OFFLINE=1" in message and "hf download openai/gsm8k --repo-type dataset" in message


def test_hub_cache_with_only_the_dataset_card_is_not_a_dataset(tmp_path, offline_cache):
    """An online load_dataset leaves just README.md in the hub cache; offline that is not enough."""
    pytest.importorskip("datasets")
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "README.md").write_text(README)
    lay_out_hub_repo(offline_cache, "org/card-only", tmp_path / "card", repo_type="dataset")
    with pytest.raises(TaskError, match=r"'org/card-only' is not a local path .*\(exists;"):
        load_task(TaskConfig(name="hf_dataset", dataset="org/card-only"))


def test_missing_local_dataset_path_is_still_a_path_error(tmp_path):
    with pytest.raises(TaskError, match="no dataset at"):
        load_task(TaskConfig(name="hf_dataset", dataset=str(tmp_path / "nope")))
