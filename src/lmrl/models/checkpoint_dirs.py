"""Where a run's complete checkpoints are: `step-N` directories under its `checkpoints/` that hold the
COMPLETE marker (written last, so a half-written directory never counts). The learner writes them
(`lmrl.learners.checkpoint`); resuming, evaluating, exporting and merging find them here."""
from __future__ import annotations

from pathlib import Path

COMPLETE = "COMPLETE"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first; half-written temporary directories are ignored."""
    if not root.exists():
        return []
    found = [p for p in root.glob("step-*") if (p / COMPLETE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None
