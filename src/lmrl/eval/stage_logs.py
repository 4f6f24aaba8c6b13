"""A pipeline run's layout as the report and the comparison read it: `pipeline.json` lists the stages,
each a normal run directory under `stages/`; their step logs join on one time axis, each stage's steps
offset by the steps of the stages before it (docs/pipelines.md)."""
from __future__ import annotations

import json
from pathlib import Path

PIPELINE_FILE = "pipeline.json"  # the stages, their folders, status and final metrics
STAGES_DIR = "stages"


def read_pipeline(run_dir: str | Path) -> dict | None:
    """The record of a pipeline run (None: `run_dir` is not one)."""
    path = Path(run_dir) / PIPELINE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def stage_dirs(run_dir: str | Path) -> list[tuple[str, Path]]:
    """(label, run directory) of each stage of a pipeline run that has started, in order; [] for a plain run."""
    record = read_pipeline(run_dir) or {"stages": []}
    found = [(stage["label"], Path(run_dir) / stage["dir"]) for stage in record["stages"]]
    return [(label, path) for label, path in found if (path / "metrics.jsonl").is_file()]


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
    return rows


def joined_logs(run_dir: str | Path, name: str = "metrics.jsonl") -> tuple[list[dict], list[tuple[int, str]]]:
    """The rows of every stage's log `name` (metrics.jsonl, samples.jsonl) on one step axis, each tagged with
    its `stage`, and the boundaries: (the step a stage starts after, its label). A stage's offset is the sum
    of the last steps the stages before it logged in metrics.jsonl."""
    rows, boundaries, offset = [], [], 0
    for label, path in stage_dirs(run_dir):
        boundaries.append((offset, label))
        rows += [{**row, "step": row["step"] + offset, "stage": label} for row in _rows(path / name)]
        offset += max((row["step"] for row in _rows(path / "metrics.jsonl")), default=0)
    return rows, boundaries
