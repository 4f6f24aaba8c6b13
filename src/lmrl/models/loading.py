"""Resolve a model argument to a local transformers directory and load tokenizer and model from it.

A model argument is ``"default"`` (the embedded SmolLM2), a transformers directory, a ``.gguf`` file
(converted once into a cache keyed by its hash), or a Hugging Face hub id (``org/name``). A hub id is
looked up in the local hub cache first (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``: the cache transformers and ``hf download`` use) and downloaded into it
only when it is not there and ``HF_HUB_OFFLINE`` is not set; either way the loaders get the local
snapshot directory. A hub id that cannot be found fails with the id, the cache folder searched and
the state of ``HF_HUB_OFFLINE``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from lmrl.models.convert import convert_gguf, lmrl_home, sha256_file
from lmrl.models.default import pull_default_model

# huggingface_hub's repo-id rule: an optional namespace, a name of word characters, '-' and '.'
HUB_ID = re.compile(r"^(?:\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")
LOCAL_SUFFIXES = (".gguf", ".json", ".jsonl", ".csv", ".parquet", ".arrow", ".safetensors", ".bin", ".txt")
# the files a causal LM needs from a hub repo: configs, tokenizer, safetensors weights (top level only)
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
LEGACY_WEIGHTS = ["pytorch_model*.bin"]  # fetched only when a repo has no safetensors
SUBFOLDERS = ["*/*"]  # original/, onnx/, gguf/ ...: not needed by transformers


# a file suffix: a dot and 1-5 letters at the end (hub ids end in versions and sizes: -v1.0, 2.5-0.5B, -3.1-8B)
FILE_SUFFIX = re.compile(r"\.[A-Za-z]{1,5}$")


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a hub repo id (``org/name`` or ``name``) rather than a local path: a path starts
    with ``.``, ``/`` or ``~``, has more than one ``/``, or ends in a file suffix (``data.jsnl``, ``model.pt``)."""
    return (bool(HUB_ID.match(name)) and "--" not in name and ".." not in name
            and not name.lower().endswith(LOCAL_SUFFIXES) and not FILE_SUFFIX.search(name))


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``), read now rather than at import."""
    from huggingface_hub import constants

    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE") or bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub uses, read from the environment now (its constants are import-time)."""
    env = os.environ
    path = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not path:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        path = os.path.join(home, "hub")
    return Path(os.path.expandvars(path)).expanduser()


def hub_repo_folder(repo_id: str, repo_type: str = "model") -> Path:
    """``<cache>/models--org--name`` (or ``datasets--org--name``): where the cache keeps a repo."""
    return hub_cache_dir() / f"{repo_type}s--{repo_id.replace('/', '--')}"


def offline_hint(repo_id: str, repo_type: str = "model") -> str:
    """What HF_HUB_OFFLINE did, and (offline) how to get `repo_id` into the cache."""
    if hub_offline():
        flag = " --repo-type dataset" if repo_type == "dataset" else ""
        return (f"HF_HUB_OFFLINE=1, so nothing is downloaded: run `hf download {repo_id}{flag}` where the hub is "
                "reachable and copy the cache here, point HF_HUB_CACHE (or HF_HOME) at a cache that holds it, "
                "or unset HF_HUB_OFFLINE")
    return "HF_HUB_OFFLINE is not set, so a download was tried (set HF_HUB_OFFLINE=1 to use only local caches)"


def cached_snapshot(repo_id: str, repo_type: str = "model", allow_patterns: list[str] | None = None,
                    ignore_patterns: list[str] | None = None) -> Path | None:
    """The cached snapshot folder of `repo_id` at ``refs/main``, without network; None when not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, repo_type=repo_type, cache_dir=hub_cache_dir(), local_files_only=True,
                                   allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
    except (LocalEntryNotFoundError, OSError, ValueError):  # IncompleteSnapshotError is an OSError
        return None
    return Path(folder)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (
        any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin")))


def _hub_model_error(repo_id: str, reason: str | None) -> FileNotFoundError:
    folder = hub_repo_folder(repo_id)
    state = "holds no snapshot with config.json and weights" if folder.exists() else "does not exist"
    tried = f"; the download failed: {reason}" if reason else ""
    return FileNotFoundError(
        f"model {repo_id!r} is not a local path and not in the Hugging Face hub cache: searched {folder} "
        f"(cache {hub_cache_dir()}, from HF_HUB_CACHE / HF_HOME), which {state}. {offline_hint(repo_id)}{tried}. "
        "A model argument may also be a transformers directory containing config.json, a .gguf file, or "
        "\"default\" (the embedded SmolLM2-135M-Instruct)."
    )


def resolve_hub_model(repo_id: str) -> Path:
    """The local snapshot directory of hub model `repo_id`: from the cache, else downloaded into it."""
    folder = cached_snapshot(repo_id, allow_patterns=MODEL_FILES + LEGACY_WEIGHTS, ignore_patterns=SUBFOLDERS)
    if folder is not None and _has_weights(folder):
        return folder
    if hub_offline():
        raise _hub_model_error(repo_id, None)
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, cache_dir=hub_cache_dir(), allow_patterns=MODEL_FILES,
                                        ignore_patterns=SUBFOLDERS))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, cache_dir=hub_cache_dir(), allow_patterns=LEGACY_WEIGHTS,
                                            ignore_patterns=SUBFOLDERS))
    except Exception as err:  # noqa: BLE001 - not found, gated, offline, network: all reported with the id
        raise _hub_model_error(repo_id, first_line(err)) from err
    if not _has_weights(folder):
        raise FileNotFoundError(f"model {repo_id!r}: the hub snapshot {folder} has no config.json with "
                                "safetensors or pytorch_model*.bin weights at its top level")
    return folder


def resolve_model_path(path: str | os.PathLike) -> Path:
    """Map ``"default"``, a transformers directory, a ``.gguf`` file or a hub id to a transformers directory."""
    if str(path) == "default":
        return pull_default_model()
    candidate = Path(path).expanduser()
    if candidate.is_dir() and (candidate / "config.json").is_file():
        return candidate
    if candidate.is_file() and candidate.suffix.lower() == ".gguf":
        digest = sha256_file(candidate)
        return convert_gguf(candidate, lmrl_home() / "models" / f"gguf-{digest[:16]}", digest)
    if not candidate.exists() and not isinstance(path, Path) and is_hub_id(str(path)):
        return resolve_hub_model(str(path))
    if not candidate.exists():
        raise FileNotFoundError(f"model {str(path)!r}: no such file or directory ({candidate.absolute()}); a model "
                                "argument is a transformers directory containing config.json, a .gguf file, a Hugging "
                                "Face hub id (org/name), or \"default\" (the embedded SmolLM2-135M-Instruct)")
    raise FileNotFoundError(
        f"model {str(path)!r} not found: expected a transformers directory containing config.json, "
        "a .gguf file, a Hugging Face hub id (org/name), or \"default\" (the embedded SmolLM2-135M-Instruct)."
    )


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load the tokenizer for a model argument, with a pad token guaranteed (eos if none)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load a causal LM for a model argument in ``dtype``."""
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=dtype)


TINY_FAMILIES = ("llama", "llama_tied", "qwen2")


def tiny_model(family: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
               seed: int = 0) -> PreTrainedModel:
    """A tiny randomly initialised causal LM of a model family, for tests; the global torch RNG is left
    untouched. Families: "llama" (untied embeddings), "llama_tied" (LM head tied to the embeddings, as
    SmolLM2), "qwen2" (biased q/k/v projections, grouped-query attention, untied)."""
    shape = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                 num_attention_heads=heads, max_position_embeddings=512)
    if family in ("llama", "llama_tied"):
        config = LlamaConfig(**shape, num_key_value_heads=heads, tie_word_embeddings=family == "llama_tied")
        cls = LlamaForCausalLM
    elif family == "qwen2":
        config = Qwen2Config(**shape, num_key_value_heads=max(1, heads // 2), tie_word_embeddings=False)
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown tiny model family {family!r}; choose from {', '.join(TINY_FAMILIES)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(config)


def tiny_llama(
    vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0
) -> LlamaForCausalLM:
    """A tiny randomly initialised Llama (untied embeddings) for tests; the global torch RNG is left untouched."""
    return tiny_model("llama", vocab_size, hidden=hidden, layers=layers, heads=heads, seed=seed)
