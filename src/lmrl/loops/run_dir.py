"""The run directory: resolved config, metrics as JSON lines, sample completions, recorded rollouts
(`run.save_rollouts`), checkpoints.

A new run never writes into a directory that holds another run: that is an error naming `--resume` and
`run.overwrite=true`, which deletes the old run before the new one starts (docs/runs.md)."""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from lmrl.config import Config, RunConfig, config_to_yaml
from lmrl.data.replay import rollout_records
from lmrl.trackers import Trackers
from lmrl.types import Group


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# what a run writes in its directory (lmrl eval and lmrl report add eval/ and report.html; trackers their folders)
# (a pipeline run: its record and its stages' folders, docs/pipelines.md)
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "rollouts.jsonl", "checkpoints", "eval", "report.html",
               "tensorboard", "wandb", "mlflow", "pipeline.json", "stages")


def run_entries(path: Path) -> list[str]:
    """The files and folders of a run that `path` holds (none: no run is there; other files do not count)."""
    return [name for name in RUN_ENTRIES if (path / name).exists()] if path.is_dir() else []


def run_dir_for(cfg: Config) -> Path:
    """Where a new run of `cfg` writes (`new_run_path`)."""
    return new_run_path(cfg.run, cfg.recipe)


def new_run_path(run: RunConfig, recipe: str | None) -> Path:
    """Where a new run with the `run` settings writes, refused when that directory holds a run and
    `run.overwrite` is not set.

    An unnamed run gets the recipe and a timestamp, with a `-2`, `-3`, … suffix when that name is taken."""
    root = Path(run.output_dir)
    if run.name is None:
        base = f"{recipe or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, n = root / base, 1
        while path.exists():
            n += 1
            path = root / f"{base}-{n}"
        return path
    path = root / run.name
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"run directory {path} is a file; choose another run.name or run.output_dir")
    held = run_entries(path)
    if held and not run.overwrite:
        raise FileExistsError(f"run directory {path} already holds a run ({', '.join(held)}): continue it with "
                              f"`lmrl train --resume {path}`, start it over with run.overwrite=true (deletes that "
                              "run), or choose another run.name")
    return path


def remove_run(path: Path) -> None:
    """Delete the run at `path` (its `RUN_ENTRIES`; other files stay): each entry is renamed into a hidden
    folder first (atomic), so nothing of the old run is left to mix with the new one, even when a kill stops
    the deletion halfway (what is left is still refused, or removed by the next overwrite)."""
    for left in path.glob(".overwritten-*"):  # a deletion a killed process left halfway
        shutil.rmtree(left, ignore_errors=True)
    aside = path / f".overwritten-{os.getpid()}"
    aside.mkdir()
    for name in run_entries(path):
        os.replace(path / name, aside / name)
    shutil.rmtree(aside)


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
        """The directory of a new run of `cfg` (`run_dir_for`), emptied first with `run.overwrite`."""
        path = run_dir_for(cfg)
        if cfg.run.overwrite and run_entries(path):
            remove_run(path)
        return RunDir(path)

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
