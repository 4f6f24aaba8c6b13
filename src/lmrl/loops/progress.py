"""A progress bar for training: step, reward, accuracy and generated tokens/s."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StepProgress:
    def __init__(self, total: int, start: int, enabled: bool = True):
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled,
        )
        self.task = self.progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def update(self, step: int, m: dict[str, float]) -> None:
        stats = (f"reward {m.get('reward/mean', float('nan')):.3f}  acc {m.get('accuracy', float('nan')):.3f}  "
                 f"{m.get('tokens_per_s', 0.0):.0f} tok/s")
        gaming = m.get("gaming/restated_question", 0.0)
        if gaming > 0:  # rewarded answers that restate the question: the accuracy may be fooled
            stats += f"  [yellow]gaming? {gaming:.0%}[/yellow]"
        self.progress.update(self.task, completed=step, stats=stats)
