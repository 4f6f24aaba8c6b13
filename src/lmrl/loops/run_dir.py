"""The run directory: resolved config, metrics as JSON lines, sample completions, checkpoints."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lmrl.config import Config, config_to_yaml


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_file = path / "metrics.jsonl"
        self.samples_file = path / "samples.jsonl"
        self.checkpoints = path / "checkpoints"

    @staticmethod
    def new(cfg: Config) -> "RunDir":
        name = cfg.run.name or f"{cfg.recipe or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        return RunDir(Path(cfg.run.output_dir) / name)

    def write_config(self, cfg: Config) -> None:
        (self.path / "config.yaml").write_text(config_to_yaml(cfg))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}}
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with self.samples_file.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume, forget what was logged after the checkpoint being resumed."""
        for file in (self.metrics_file, self.samples_file):
            if file.exists():
                kept = [ln for ln in file.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
                file.write_text("".join(ln + "\n" for ln in kept))
