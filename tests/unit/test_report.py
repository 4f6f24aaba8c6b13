"""HTML run report: plots inline, samples escaped, config included, bad values and files handled."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmrl.eval.report import family_figure, family_of, read_series, write_report

CONFIG_TEXT = "model: tiny-gpt\nalgo:\n  name: grpo\n  lr: 1.0e-6\n"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _img_alts(page: str) -> list[str]:
    return re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,[A-Za-z0-9+/=]{100,}"', page)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "grpo-tiny"
    run.mkdir()
    metrics = [
        {"step": 1, "reward/mean": 0.1, "accuracy": 0.2, "entropy": 1.5, "response_length/mean": 40.0,
         "kl": 0.0, "clip_frac": 0.01, "grad_norm": 2.0, "tokens_per_s": 900.0, "timing/rollout_s": 3.0,
         "timing/train_s": 1.0},
        {"step": 2, "reward/mean": float("nan"), "accuracy": 0.4, "entropy": None, "kl": 0.01},
        {"step": 2, "eval/accuracy": 0.35, "eval/pass@1": 0.3},
        {"step": 3, "reward/mean": 0.5, "accuracy": 0.3, "grad_norm": float("inf"), "excluded": 1},
    ]
    _write_jsonl(run / "metrics.jsonl", metrics)
    samples = [
        {"step": 1, "prompt": "What is 2+2?", "completion": "4", "reward": 1.0, "gold": "4"},
        {"step": 3, "prompt": "Say hi", "completion": "<script>alert('x')</script> & done", "reward": 0.0,
         "gold": "hi"},
    ]
    _write_jsonl(run / "samples.jsonl", samples)
    (run / "config.yaml").write_text(CONFIG_TEXT, encoding="utf-8")
    return run


def test_report_has_inline_plots_escaped_samples_and_config(run_dir: Path):
    out = write_report(run_dir)
    assert out == run_dir / "report.html"
    page = out.read_text(encoding="utf-8")
    alts = _img_alts(page)
    for family in ("Reward", "Accuracy", "Entropy", "Response length", "KL", "Clip fractions", "Grad norm",
                   "Throughput", "Timing", "excluded"):
        assert family in alts
    assert len(alts) == len(set(alts))
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; done" in page
    assert "model: tiny-gpt" in page and "name: grpo" in page
    assert "grpo-tiny" in page
    assert "http://" not in page and "https://" not in page


def _summary(page: str) -> dict[str, tuple[str, str, str, str]]:
    """Summary table rows: metric → (final, min, max, points) as rendered."""
    cell = r'<td class="num">([^<]*)</td>'
    rows = re.findall(r"<tr><td>[^<]*</td><td>([^<]+)</td>" + cell * 4 + "</tr>", page)
    return {name: tuple(values) for name, *values in rows}


def test_report_skips_non_finite_values_in_numbers(run_dir: Path):
    page = write_report(run_dir).read_text(encoding="utf-8")
    summary = _summary(page)
    assert summary["reward/mean"] == ("0.5", "0.1", "0.5", "2")
    assert summary["grad_norm"] == ("2", "2", "2", "1")
    assert summary["accuracy"] == ("0.3", "0.2", "0.4", "3")
    assert summary["entropy"] == ("1.5", "1.5", "1.5", "1")
    assert summary["eval/pass@1"] == ("0.3", "0.3", "0.3", "1")
    assert "kl" in summary and "response_length/mean" in summary and "excluded" in summary
    assert re.search(r'>reward/mean</div><div class="value">0\.5</div><div class="best">best 0\.5 @ step 3', page)
    assert re.search(r'>accuracy</div><div class="value">0\.3</div><div class="best">best 0\.4 @ step 2', page)
    assert re.search(r'>eval/accuracy</div><div class="value">0\.35</div>', page)


def test_eval_metrics_share_the_train_family():
    assert family_of("eval/accuracy") == family_of("accuracy") == "Accuracy"
    assert family_of("eval/pass@1") == "Accuracy"
    assert family_of("reward/mean") == family_of("reward/std") == "Reward"
    assert family_of("timing/rollout_s") == "Timing"
    assert family_of("loss/policy") == "loss"
    assert family_of("role/shopper/reward/mean") == "Reward" and family_of("role/shopper/drift/kl") == "drift"


def test_samples_table_shows_only_recent_samples_per_step(tmp_path: Path):
    _write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "reward/mean": 0.0}])
    _write_jsonl(tmp_path / "samples.jsonl",
                 [{"step": 1, "prompt": f"p{i}", "completion": f"completion-{i}", "reward": 0.0, "gold": ""}
                  for i in range(6)])
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "completion-5" in page and "completion-3" in page
    assert "completion-2" not in page


def test_missing_metrics_file_names_the_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "metrics.jsonl"))):
        write_report(tmp_path)


def test_empty_metrics_file_says_no_steps(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text("", encoding="utf-8")
    out = write_report(str(tmp_path))
    page = out.read_text(encoding="utf-8")
    assert "No steps were logged" in page
    assert "data:image/png" not in page


def test_malformed_lines_are_skipped_and_reported(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "reward/mean": 0.25}\n{"step": 2, "reward/me\n{"reward/mean": 0.9}\n', encoding="utf-8")
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "Skipped 1 malformed line(s) in metrics.jsonl." in page
    assert "Skipped 1 metric row(s) without an integer step." in page
    assert "Reward" in _img_alts(page)
    assert _summary(page) == {"reward/mean": ("0.25", "0.25", "0.25", "1")}


def test_steps_sit_on_integer_ticks_and_the_logging_time_is_not_plotted(tmp_path: Path):
    _write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "time": 1.7e9, "reward/mean": 0.1},
                                              {"step": 2, "time": 1.7e9 + 30.0, "reward/mean": 0.3}])
    series = read_series(tmp_path)
    assert list(series) == ["reward/mean"]
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert _img_alts(page) == ["Reward"] and list(_summary(page)) == ["reward/mean"]
    fig = family_figure("Reward", list(series.values()))
    fig.canvas.draw()
    low, high = fig.axes[0].get_xlim()
    assert [t for t in fig.axes[0].get_xticks() if low <= t <= high] == [1.0, 2.0]
