"""The run's console output: plain flushed lines when stderr is a file or a pipe, a live bar on a terminal."""
from __future__ import annotations

import io
import re

from lmrl.loops.progress import StepProgress, eval_line, step_line

METRICS = {"reward/mean": 0.41, "accuracy": 0.38, "reward_error_share": 0.0, "tokens_per_s": 512.2,
           "timing/step_s": 12.34}


class Pipe(io.StringIO):
    """A non-terminal stream that records what was written and where each flush came."""

    def __init__(self, tty: bool = False):
        super().__init__()
        self.tty, self.flushed_at = tty, []

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushed_at.append(len(self.getvalue()))


def test_step_line_reads_like_the_docs():
    assert step_line(3, 20, METRICS) == "step 3/20  reward 0.410  acc 0.380  errors 0.00  tok/s 512  12.3s"
    assert step_line(1, 2, {**METRICS, "reward_error_share": 0.75}).split("  ")[3] == "errors 0.75"


def test_eval_line_counts_the_excluded_prompts():
    m = {"eval/accuracy": 0.0625, "eval/excluded": 2.0, "eval/num_prompts": 64.0, "eval/pass@4": 0.25}
    assert eval_line(0, m, 31.24) == "eval step 0  acc 0.062  excluded 2/64  pass@4 0.250  31.2s"


def test_off_a_terminal_each_step_is_one_flushed_line():
    pipe = Pipe()
    with StepProgress(20, 2, stream=pipe) as out:
        assert not out.live
        out.update(3, METRICS)
        first = pipe.getvalue()
        out.update(4, {**METRICS, "reward_error_share": 0.5})
    assert first == "step 3/20  reward 0.410  acc 0.380  errors 0.00  tok/s 512  12.3s\n"
    assert pipe.getvalue().splitlines()[1].startswith("step 4/20  reward 0.410  acc 0.380  errors 0.50")
    assert pipe.flushed_at[:2] == [len(first), len(pipe.getvalue())]  # each line flushed as soon as written


def test_off_a_terminal_an_evaluation_writes_its_start_each_quarter_and_its_result():
    pipe = Pipe()
    out = StepProgress(20, 0, stream=pipe)
    with out.evaluation(0) as shown:
        for done in (0, 1, 2, 3, 4, 6, 8):
            shown.advance(done, 8)
        shown.finish({"eval/accuracy": 0.5, "eval/excluded": 1.0, "eval/num_prompts": 8.0})
    lines = pipe.getvalue().splitlines()
    assert [ln.split("  ")[1] for ln in lines[:-1]] == ["0/8 rows generated", "2/8 rows generated",
                                                        "4/8 rows generated", "6/8 rows generated",
                                                        "8/8 rows generated"]
    assert re.fullmatch(r"eval step 0  acc 0\.500  excluded 1/8  \d+\.\ds", lines[-1])
    assert len(pipe.flushed_at) == len(lines)


def test_disabled_shows_nothing():
    pipe = Pipe()
    with StepProgress(5, 0, enabled=False, stream=pipe) as out:
        out.update(1, METRICS)
        with out.evaluation(1) as shown:
            shown.advance(0, 4)
            shown.finish({"eval/accuracy": 1.0})
    assert pipe.getvalue() == ""


def test_on_a_terminal_the_bar_shows_the_error_share_and_no_plain_lines():
    tty = Pipe(tty=True)
    with StepProgress(5, 0, stream=tty) as out:
        assert out.live
        out.update(1, {**METRICS, "reward_error_share": 0.25})
    shown = tty.getvalue()
    assert "errors 25%" in shown and "reward 0.410" in shown and "step 1/5" not in shown


def test_on_a_terminal_the_first_evaluation_shows_a_bar_before_training_starts():
    tty = Pipe(tty=True)
    out = StepProgress(5, 0, stream=tty)
    with out.evaluation(0) as shown:
        shown.advance(0, 8)
        shown.advance(8, 8)
        shown.finish({"eval/accuracy": 0.25, "eval/excluded": 0.0, "eval/num_prompts": 8.0})
    shown_text = tty.getvalue()
    assert "eval step 0" in shown_text and "8/8" in shown_text and "acc 0.250  excluded 0/8" in shown_text
    assert not out.progress.live.is_started  # stopped again: the training bar starts on its own
