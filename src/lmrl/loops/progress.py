"""What a run shows while it runs, all on stderr (where `lmrl train` prints its summary too).

On a terminal: a live bar with step, reward, accuracy, the share of samples with reward errors and
generated tokens/s, and a bar for each evaluation. Sent to a file or a pipe: one plain line per step
and per evaluation (at its start, each quarter, and its result), flushed as it is written, so a
`tail -f` or a job log follows the run.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import IO, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

NAN = float("nan")


def step_line(step: int, total: int, m: dict[str, float]) -> str:
    """The plain line of a step, e.g. `step 3/20  reward 0.410  acc 0.380  errors 0.00  tok/s 512  12.3s`; a step
    without rollouts (an offline dataset's batch) shows its loss and trained tokens/s instead."""
    if "reward/mean" not in m:
        return (f"step {step}/{total}  loss {m.get('loss', NAN):.4f}  tok/s {m.get('train/tokens_per_s', 0.0):.0f}  "
                f"{m.get('timing/step_s', 0.0):.1f}s")
    line = (f"step {step}/{total}  reward {m.get('reward/mean', NAN):.3f}  acc {m.get('accuracy', NAN):.3f}  "
            f"errors {m.get('reward_error_share', 0.0):.2f}  tok/s {m.get('tokens_per_s', 0.0):.0f}  "
            f"{m.get('timing/step_s', 0.0):.1f}s")
    gaming = m.get("gaming/restated_question", 0.0)
    if gaming > 0:  # rewarded answers that restate the question: the accuracy may be fooled
        line += f"  gaming? {gaming:.0%}"
    return line + task_accuracies(m, "task/", "accuracy")


def task_accuracies(m: dict[str, float], prefix: str, key: str) -> str:
    """A mixture's accuracy per task, e.g. `  [add 0.620 code 0.125]` (metrics `<prefix><name>/<key>`); "" for one task."""
    found = {k[len(prefix):-len(key) - 1]: v for k, v in m.items()
             if k.startswith(prefix) and k.endswith("/" + key) and k.count("/", len(prefix)) == key.count("/") + 1}
    return "  [" + " ".join(f"{name} {v:.3f}" for name, v in sorted(found.items())) + "]" if found else ""


def eval_line(step: int, m: dict[str, float], seconds: float) -> str:
    """The result line of an evaluation, e.g. `eval step 0  acc 0.062  excluded 0/64  31.2s`."""
    line = (f"eval step {step}  acc {m.get('eval/accuracy', NAN):.3f}  "
            f"excluded {m.get('eval/excluded', 0.0):.0f}/{m.get('eval/num_prompts', 0.0):.0f}")
    for key in sorted(k for k in m if k.startswith(("eval/pass@", "eval/maj@"))):
        line += f"  {key[5:]} {m[key]:.3f}"
    return line + task_accuracies(m, "eval/task/", "accuracy") + f"  {seconds:.1f}s"


class StepProgress:
    """The run's console output; `enabled=False` shows nothing. `stream` (default: stderr) decides the
    form: a live bar when it is a terminal, plain lines otherwise."""

    def __init__(self, total: int, start: int, enabled: bool = True, stream: IO[str] | None = None):
        self.total, self.enabled, self.stream = total, enabled, stream
        console = Console(file=stream) if stream is not None else Console(stderr=True)
        self.live = enabled and console.is_terminal
        self.running = False
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, disable=not self.live,
        )
        self.task = self.progress.add_task("train", total=total, completed=start, stats="")

    def __enter__(self):
        self.progress.start()
        self.running = True
        return self

    def __exit__(self, *exc):
        self.running = False
        self.progress.stop()
        return False

    def write(self, line: str) -> None:
        """One plain line, flushed (looked up at each write: a redirected stderr is followed)."""
        if self.live:
            self.progress.console.print(line, soft_wrap=True, highlight=False, markup=False)
        elif self.enabled:
            out = self.stream or sys.stderr
            out.write(line + "\n")
            out.flush()

    def update(self, step: int, m: dict[str, float]) -> None:
        if not self.live:
            self.write(step_line(step, self.total, m))
            return
        if "reward/mean" not in m:
            stats = f"loss {m.get('loss', NAN):.4f}  {m.get('train/tokens_per_s', 0.0):.0f} tok/s"
            self.progress.update(self.task, completed=step, stats=stats)
            return
        errors = m.get("reward_error_share", 0.0)
        stats = (f"reward {m.get('reward/mean', NAN):.3f}  acc {m.get('accuracy', NAN):.3f}  "
                 + (f"[red]errors {errors:.0%}[/red]  " if errors > 0 else "errors 0%  ")
                 + f"{m.get('tokens_per_s', 0.0):.0f} tok/s")
        gaming = m.get("gaming/restated_question", 0.0)
        if gaming > 0:  # rewarded answers that restate the question: the accuracy may be fooled
            stats += f"  [yellow]gaming? {gaming:.0%}[/yellow]"
        stats += task_accuracies(m, "task/", "accuracy").replace("[", "(").replace("]", ")")
        self.progress.update(self.task, completed=step, stats=stats)

    @contextmanager
    def evaluation(self, step: int) -> Iterator["EvalShown"]:
        """Show the evaluation at `step` while it runs (the bar is started for it if the run's is not yet)."""
        started_here = self.live and not self.running
        if started_here:
            self.progress.start()
        shown = EvalShown(self, step)
        try:
            yield shown
        finally:
            if shown.task is not None:
                self.progress.remove_task(shown.task)
            if started_here:
                self.progress.stop()


class EvalShown:
    """One evaluation on the console: `advance(done, total)` as its rows are generated, `finish(metrics)`."""

    def __init__(self, out: StepProgress, step: int):
        self.out, self.step, self.t0 = out, step, time.perf_counter()
        self.task = None
        self.quarter = -1  # the last quarter of the rows a plain line was written for

    def advance(self, done: int, total: int) -> None:
        if self.out.live:
            if self.task is None:
                self.task = self.out.progress.add_task(f"eval step {self.step}", total=total, stats="")
            self.out.progress.update(self.task, completed=done, refresh=True)  # one engine call: seconds apart
            return
        quarter = 4 * done // max(total, 1)
        if quarter > self.quarter:
            self.quarter = quarter
            self.out.write(f"eval step {self.step}  {done}/{total} rows generated  "
                           f"{time.perf_counter() - self.t0:.1f}s")

    def finish(self, metrics: dict[str, float]) -> None:
        self.out.write(eval_line(self.step, metrics, time.perf_counter() - self.t0))
