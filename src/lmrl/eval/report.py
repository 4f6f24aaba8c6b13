"""One self-contained HTML report for a run directory (`lmrl report RUN`).

Reads `metrics.jsonl` (plus optional `samples.jsonl`, `config.yaml` and the latest `lmrl eval` result in
`eval/`; a pipeline run: its stages' logs on one step axis, `eval.stage_logs`) and writes `report.html`
with headline numbers, one inline-PNG plot per metric family, the evaluation suite's plots, recent
sample completions and the config, so a run can be inspected or shared as a single file without a server
or external resources.
"""
from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lmrl.eval.stage_logs import joined_logs, read_pipeline, stage_dirs
from lmrl.eval.suite_report import figure, latest_suite, load_suite, png_base64, suite_section

SAMPLES_PER_STEP = 3
MAX_SAMPLE_STEPS = 20
MAX_TEXT_CHARS = 4000

# (family title, name prefixes) in display order; a metric joins the first family whose prefix its
# name (without "eval/") starts with. Unmatched metrics are grouped by the part before "/".
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("reward",)),
    ("Accuracy", ("accuracy", "acc/", "pass@", "avg@")),
    ("Entropy", ("entropy",)),
    ("Response length", ("response_length", "length")),
    ("KL", ("kl",)),
    ("Clip fractions", ("clip",)),
    ("Grad norm", ("grad_norm",)),
    ("Throughput", ("tokens_per_s", "throughput")),
    ("Timing", ("timing",)),
)
HIGHER_IS_BETTER = ("Reward", "Accuracy")
# Row fields that say when, not how well: the step (the x axis) and the wall-clock time it was logged at.
NOT_METRICS = frozenset({"step", "time"})

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; background: #f5f6f8;
       color: #1f2328; }
main { max-width: 1400px; margin: 0 auto; padding: 24px; }
h1 { margin: 0 0 4px; font-size: 1.6em; } h2 { margin-top: 32px; border-bottom: 1px solid #d0d7de; }
.sub { color: #656d76; margin-bottom: 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); gap: 12px; }
.card { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 12px 16px; }
.card .name { color: #656d76; font-size: 0.85em; } .card .value { font-size: 1.5em; font-weight: 600; }
.card .best { color: #656d76; font-size: 0.85em; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(440px, 1fr)); gap: 16px; }
.plot { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 8px; }
.plot img { width: 100%; height: auto; display: block; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.text { white-space: pre-wrap; word-break: break-word; max-height: 240px; overflow: auto;
        font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.85em; }
pre { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 12px; overflow: auto; }
.note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 8px; padding: 8px 12px; }
"""


@dataclass
class Series:
    """One metric's finite values in logging order."""

    name: str
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Parse a JSON-lines file; returns (objects, number of skipped malformed lines)."""
    rows, skipped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            skipped += 1
    return rows, skipped


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _collect_series(rows: list[dict]) -> tuple[dict[str, Series], int]:
    """Metric name → Series; rows without an integer step are skipped and counted."""
    series: dict[str, Series] = {}
    skipped = 0
    for row in rows:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            skipped += 1
            continue
        for name, raw in row.items():
            value = _finite(raw)
            if name in NOT_METRICS or value is None:
                continue
            s = series.setdefault(name, Series(name))
            s.steps.append(step)
            s.values.append(value)
    return series, skipped


def read_series(run_dir: str | Path) -> dict[str, Series]:
    """Metric name → Series from a run's metrics.jsonl (malformed lines and rows without a step skipped); a
    pipeline run's from its stages' logs on one step axis."""
    if read_pipeline(run_dir) is not None:
        return _collect_series(joined_logs(run_dir)[0])[0]
    rows, _ = _read_jsonl(Path(run_dir) / "metrics.jsonl")
    return _collect_series(rows)[0]


def family_of(name: str) -> str:
    """Plot family of a metric name; eval metrics share their train counterpart's family, and a mixture task's
    (`task/<name>/…`, `eval/task/<name>/…`) or a role's (`role/<name>/…`) that of the metric it is of the task or role."""
    base = name.removeprefix("eval/")
    if base.startswith(("task/", "role/")) and base.count("/") >= 2:  # a task's or role's metric joins its kind's family
        base = base.split("/", 2)[2]
    for title, prefixes in FAMILIES:
        if base.startswith(prefixes):
            return title
    return base.split("/", 1)[0]


def _group(series: dict[str, Series]) -> dict[str, list[Series]]:
    grouped: dict[str, list[Series]] = defaultdict(list)
    for s in series.values():
        grouped[family_of(s.name)].append(s)
    order = [title for title, _ in FAMILIES]
    keys = sorted(grouped, key=lambda k: (order.index(k) if k in order else len(order), k))
    return {k: sorted(grouped[k], key=lambda s: (s.name.startswith("eval/"), s.name)) for k in keys}


def family_figure(title: str, members: list[Series], boundaries: Sequence[tuple[int, str]] = ()) -> Figure:
    """One family's curves over the steps, on integer step ticks (Agg canvas; no pyplot global state); a
    pipeline's stage `boundaries` (the step a stage starts after, its label) as labelled vertical lines."""
    fig = figure()
    ax = fig.add_subplot()
    for step, label in boundaries:
        ax.axvline(step, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize="small", color="grey")
    for s in members:
        pairs = sorted(zip(s.steps, s.values), key=lambda p: p[0])
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        is_eval = s.name.startswith("eval/")
        ax.plot(xs, ys, label=s.name, linestyle="--" if is_eval else "-",
                marker="o" if is_eval or len(xs) <= 20 else None, markersize=4, linewidth=1.6)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _fmt(value: object) -> str:
    number = _finite(value)
    if number is None:
        return "—" if value is None or isinstance(value, (int, float)) else html.escape(str(value))
    return f"{number:.4g}"


def _cards(grouped: dict[str, list[Series]], last_step: int) -> str:
    cards = [f'<div class="card"><div class="name">last step</div><div class="value">{last_step}</div></div>']
    for title in HIGHER_IS_BETTER:
        for s in grouped.get(title, []):
            best = max(range(len(s.values)), key=s.values.__getitem__)
            cards.append(
                f'<div class="card"><div class="name">{html.escape(s.name)}</div>'
                f'<div class="value">{_fmt(s.values[-1])}</div>'
                f'<div class="best">best {_fmt(s.values[best])} @ step {s.steps[best]}</div></div>')
    return f'<div class="cards">{"".join(cards)}</div>'


def _summary_table(grouped: dict[str, list[Series]]) -> str:
    rows = []
    for title, members in grouped.items():
        for s in members:
            rows.append(
                f"<tr><td>{html.escape(title)}</td><td>{html.escape(s.name)}</td>"
                f'<td class="num">{_fmt(s.values[-1])}</td><td class="num">{_fmt(min(s.values))}</td>'
                f'<td class="num">{_fmt(max(s.values))}</td><td class="num">{len(s.values)}</td></tr>')
    return ("<table><tr><th>family</th><th>metric</th><th>final</th><th>min</th><th>max</th>"
            f"<th>points</th></tr>{''.join(rows)}</table>")


def _text_cell(value: object) -> str:
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f"\n… ({len(text) - MAX_TEXT_CHARS} more characters)"
    return f'<td><div class="text">{html.escape(text)}</div></td>'


def _samples_section(samples: list[dict]) -> str:
    by_step: dict[object, list[dict]] = defaultdict(list)
    for sample in samples:
        by_step[sample.get("step")].append(sample)
    steps = sorted(by_step, key=lambda s: (not isinstance(s, int), s if isinstance(s, int) else 0))
    shown = steps[-MAX_SAMPLE_STEPS:][::-1]
    rows = []
    for step in shown:
        for sample in by_step[step][-SAMPLES_PER_STEP:]:
            rows.append(
                f'<tr><td class="num">{_fmt(step)}</td><td class="num">{_fmt(sample.get("reward"))}</td>'
                f'{_text_cell(sample.get("prompt"))}{_text_cell(sample.get("completion"))}'
                f'{_text_cell(sample.get("gold"))}</tr>')
    note = (f'<p class="sub">Last {SAMPLES_PER_STEP} samples of each of the last {len(shown)} of '
            f"{len(steps)} logged steps, newest first.</p>")
    return (f"{note}<table><tr><th>step</th><th>reward</th><th>prompt</th><th>completion</th>"
            f"<th>gold</th></tr>{''.join(rows)}</table>")


def _render(run_name: str, run_dir: Path, series: dict[str, Series], n_rows: int, warnings: list[str],
            samples: list[dict] | None, config_text: str | None, suite_html: str | None = None,
            stages: dict | None = None, boundaries: Sequence[tuple[int, str]] = ()) -> str:
    parts = [f"<h1>{html.escape(run_name)}</h1>",
             f'<div class="sub">{html.escape(str(run_dir))} · {n_rows} metric rows</div>']
    parts += [f'<p class="note">{html.escape(w)}</p>' for w in warnings]
    if stages is not None:
        parts += ["<h2>Stages</h2>", _stages_table(stages, boundaries)]
    if not series:
        parts.append('<p class="note">No steps were logged in metrics.jsonl.</p>')
    else:
        grouped = _group(series)
        last_step = max(max(s.steps) for s in series.values())
        parts += [_cards(grouped, last_step), "<h2>Metrics</h2>", '<div class="plots">']
        parts += [f'<div class="plot"><img alt="{html.escape(title)}" '
                  f'src="data:image/png;base64,{png_base64(family_figure(title, members, boundaries))}"></div>'
                  for title, members in grouped.items()]
        parts += ["</div>", "<h2>Summary</h2>", _summary_table(grouped)]
    if suite_html:
        parts.append(suite_html)
    if samples:
        parts += ["<h2>Samples</h2>", _samples_section(samples)]
    if config_text is not None:
        parts += ["<h2>Config</h2>", f"<pre>{html.escape(config_text)}</pre>"]
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(run_name)} · lmrl report</title><style>{CSS}</style></head>"
            f"<body><main>\n{body}\n</main></body></html>\n")


def _stages_table(record: dict, boundaries: Sequence[tuple[int, str]]) -> str:
    """A pipeline's stages: label, status, steps, the steps of the joined axis they cover, their folder."""
    starts = dict((label, step) for step, label in boundaries)
    rows = []
    for stage in record["stages"]:
        start = starts.get(stage["label"])
        span = "" if start is None or stage.get("steps") is None else f"{start + 1}–{start + stage['steps']}"
        rows.append(f"<tr><td>{html.escape(stage['label'])}</td><td>{html.escape(stage['status'])}</td>"
                    f'<td class="num">{_fmt(stage.get("steps"))}</td><td class="num">{span}</td>'
                    f"<td>{html.escape(stage['dir'])}</td></tr>")
    return ("<table><tr><th>stage</th><th>status</th><th>steps</th><th>on this page</th><th>run directory</th></tr>"
            f"{''.join(rows)}</table>")


def _pipeline_report(run_dir: Path, record: dict) -> Path:
    """The report of a pipeline run: its stages' logs on one step axis, stage boundaries marked."""
    rows, boundaries = joined_logs(run_dir)
    series, _ = _collect_series(rows)
    samples = joined_logs(run_dir, "samples.jsonl")[0]
    started = stage_dirs(run_dir)
    suite_path = latest_suite(started[-1][1]) if started else None
    suite_html = suite_section(load_suite(suite_path), str(suite_path)) if suite_path is not None else None
    config_text = "\n".join(f"# stage {label}: {path / 'config.yaml'}\n{(path / 'config.yaml').read_text()}"
                            for label, path in started if (path / "config.yaml").is_file())
    page = _render(run_dir.resolve().name, run_dir, series, len(rows), [], samples or None, config_text or None,
                   suite_html, stages=record, boundaries=boundaries)
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


def write_report(run_dir: str | Path) -> Path:
    """Write `run_dir/report.html` from the run's logs and return its path.

    Raises FileNotFoundError when `run_dir/metrics.jsonl` does not exist. Null and non-finite metric
    values are skipped; malformed lines are skipped and reported at the top of the page.
    """
    run_dir = Path(run_dir)
    record = read_pipeline(run_dir)
    if record is not None:
        return _pipeline_report(run_dir, record)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no metrics file at {metrics_path}; is {run_dir} a run directory?")
    rows, bad_lines = _read_jsonl(metrics_path)
    series, no_step = _collect_series(rows)
    warnings = []
    if bad_lines:
        warnings.append(f"Skipped {bad_lines} malformed line(s) in metrics.jsonl.")
    if no_step:
        warnings.append(f"Skipped {no_step} metric row(s) without an integer step.")
    samples = None
    samples_path = run_dir / "samples.jsonl"
    if samples_path.is_file():
        samples, bad_samples = _read_jsonl(samples_path)
        if bad_samples:
            warnings.append(f"Skipped {bad_samples} malformed line(s) in samples.jsonl.")
    config_path = run_dir / "config.yaml"
    config_text = config_path.read_text(encoding="utf-8") if config_path.is_file() else None
    suite_html = None
    suite_path = latest_suite(run_dir)
    if suite_path is not None:
        try:
            suite_html = suite_section(load_suite(suite_path), str(suite_path))
        except (ValueError, KeyError, TypeError) as err:
            warnings.append(f"Skipped the evaluation result {suite_path}: {err}")
    page = _render(run_dir.resolve().name, run_dir, series, len(rows), warnings, samples, config_text, suite_html)
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
