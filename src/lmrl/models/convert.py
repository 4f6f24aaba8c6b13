"""Convert a GGUF checkpoint into a plain float32 transformers directory, once, atomically.

Every model lmrl fine-tunes is an ordinary safetensors checkpoint: GGUF weights are de-quantised
at conversion time and every quantisation marker is dropped, so optimisers and trainers treat
the result as a normal full-precision model. The output directory appears only when complete
(a marker file is written last inside a temp dir that is then renamed into place), so an
interrupted conversion is simply redone.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

COMPLETE_MARKER = ".lmrl-complete"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def lmrl_home() -> Path:
    """Root of lmrl's caches: ``$LMRL_HOME``, defaulting to ``~/.cache/lmrl``."""
    return Path(os.environ.get("LMRL_HOME") or Path.home() / ".cache" / "lmrl").expanduser()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_complete(model_dir: Path) -> bool:
    return (model_dir / COMPLETE_MARKER).is_file()


def _fix_tokenizer(tokenizer) -> None:
    """Give ChatML models their template and ``<|im_end|>`` as eos; always set a pad token."""
    vocab = tokenizer.get_vocab()
    if IM_START in vocab and IM_END in vocab:
        if not tokenizer.chat_template:
            tokenizer.chat_template = CHATML_TEMPLATE
        if IM_END in tokenizer.chat_template:
            tokenizer.eos_token = IM_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def _drop_quantization(model) -> None:
    """Forget that the weights came from a quantised file: they are de-quantised float32 now."""
    model.hf_quantizer = None
    model.is_quantized = False
    vars(model).pop("quantization_method", None)
    for attr in ("quantization_config", "_is_quantized"):
        vars(model.config).pop(attr, None)


def _align_generation_ids(model, tokenizer) -> None:
    """Stop generation at the tokenizer's eos as well as the GGUF's own, and pad with its pad."""
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    gen.pad_token_id = model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id


def convert_gguf(gguf_path: Path, dest: Path, sha256: str, progress: bool = True) -> Path:
    """De-quantise ``gguf_path`` into a float32 transformers directory at ``dest`` and return it.

    ``sha256`` is the caller-verified digest of the file, recorded in the completion marker.

    Returns ``dest`` untouched if it is already complete (including when another process
    finished the same conversion first).
    """
    dest = Path(dest)
    if is_complete(dest):
        return dest
    gguf_path = Path(gguf_path).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    console = Console(file=sys.stderr, quiet=not progress)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    tmp.chmod(0o755)
    try:
        with console.status(f"[bold]Converting[/] {gguf_path.name} to float32 safetensors...") as status:
            kwargs = {"gguf_file": gguf_path.name}
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
            _fix_tokenizer(tokenizer)
            status.update(f"[bold]De-quantising[/] {gguf_path.name} (one-time, slow)...")
            # transformers draws raw tqdm bars on stderr while loading and saving; the rich status
            # replaces them.
            with contextlib.redirect_stderr(io.StringIO()):
                model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
                _drop_quantization(model)
                _align_generation_ids(model, tokenizer)
                status.update(f"[bold]Saving[/] to {dest}...")
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            source = {"gguf_file": gguf_path.name, "sha256": sha256}
            (tmp / COMPLETE_MARKER).write_text(json.dumps(source, indent=2) + "\n")
        if dest.exists() and not is_complete(dest):
            shutil.rmtree(dest)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not is_complete(dest):
                raise
        console.print(f"[green]Converted[/] {gguf_path.name} -> {dest}", soft_wrap=True)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
