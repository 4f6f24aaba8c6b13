"""The run directory: resolved config, metrics as JSON lines, sample completions, recorded rollouts
(`run.save_rollouts`), checkpoints."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from lmrl.config import Config, config_to_yaml
from lmrl.data.replay import rollout_records
from lmrl.eval.trackers import Trackers
from lmrl.types import Group


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDir:
    """A run's directory and its logs; `muted` for the other ranks of a data-parallel run (rank 0 writes)."""

    def __init__(self, path: Path, muted: bool = False):
        self.path, self.muted = path, muted
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_file = path / "metrics.jsonl"
        self.samples_file = path / "samples.jsonl"
        self.rollouts_file = path / "rollouts.jsonl"  # written when the config sets run.save_rollouts
        self.save_rollouts = False
        self.checkpoints = path / "checkpoints"
        self.trackers = Trackers()  # TensorBoard / W&B / MLflow, fed with what the files receive

    @staticmethod
    def new(cfg: Config) -> "RunDir":
        name = cfg.run.name or f"{cfg.recipe or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        return RunDir(Path(cfg.run.output_dir) / name)

    def write_config(self, cfg: Config) -> None:
        """Write the run's config; it also decides whether the rollouts are recorded."""
        self.save_rollouts = cfg.run.save_rollouts
        tmp = self.path / ".config.yaml.tmp"
        tmp.write_text(config_to_yaml(cfg))
        os.replace(tmp, self.path / "config.yaml")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.muted:
            return
        row = {"step": step, "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}}
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.trackers.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if self.muted:
            return
        with self.samples_file.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")
        self.trackers.log_samples(step, rows)

    def log_rollouts(self, step: int, groups: list[Group]) -> None:
        """Append the scored samples of `groups` to rollouts.jsonl (with `run.save_rollouts`; data/replay.py)."""
        if self.muted or not self.save_rollouts:
            return
        with self.rollouts_file.open("a") as f:
            for record in rollout_records(step, groups):
                f.write(json.dumps(record, default=str) + "\n")

    @property
    def logs(self) -> tuple[Path, ...]:
        """The append-only logs a checkpoint records the size of."""
        return self.metrics_file, self.samples_file, self.rollouts_file

    def positions(self) -> dict[str, int]:
        """The logs' sizes in bytes, flushed to disk: a checkpoint records them to rewind to on resume."""
        sizes = {}
        for file in self.logs:
            if file.exists():
                with file.open("rb") as f:
                    os.fsync(f.fileno())
            sizes[file.name] = file.stat().st_size if file.exists() else 0
        return sizes

    def rewind(self, positions: dict[str, int] | None) -> None:
        """On resume, return the logs to what they held when the checkpoint was written (None: to empty).

        Rows logged after it, and a row half-written by a killed process, are dropped; the resumed run
        logs them again, so no row is missing or duplicated.
        """
        for file in self.logs:
            size = (positions or {}).get(file.name, 0)
            if file.exists() and file.stat().st_size > size:
                os.truncate(file, size)
            elif file.exists() and file.stat().st_size < size:
                raise RuntimeError(f"{file} is shorter than when the checkpoint was written ({file.stat().st_size} "
                                   f"< {size} bytes): the log was edited or lost")

    def truncate_after(self, step: int) -> None:
        """On resume from a checkpoint that did not record log positions: drop rows logged after `step`."""
        for file in self.logs:
            if file.exists():
                kept = []
                for line in file.read_text().splitlines():
                    try:
                        if json.loads(line)["step"] <= step:
                            kept.append(line)
                    except (ValueError, KeyError):  # a row half-written by a killed process
                        continue
                tmp = file.with_suffix(".tmp")
                tmp.write_text("".join(ln + "\n" for ln in kept))
                os.replace(tmp, file)
