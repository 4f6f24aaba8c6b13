"""`lmrl compare`: runs side by side, with confidence intervals, Holm-corrected tests and training curves.

An arm is one run, or several runs of one setting (seeds). Every arm is compared with the first (the
reference), metric by metric:
- one run per arm: a bootstrap over prompts of the per-prompt records `lmrl eval` saved (paired when
  both arms were graded on the same prompts), so the interval says how much the held-out set alone
  could move the difference;
- several runs per arm: each run is one observation and the test is Welch's t over seeds, which
  counts the run-to-run spread (a bootstrap over two or three seeds would understate it).
Holm's correction runs over every test of one invocation. Formulas and an example: docs/eval.md.
"""
from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from lmrl.eval.significance import Comparison, apply_holm, bootstrap, mean_interval, pair_by_uid, welch
from lmrl.eval.stage_logs import read_pipeline, stage_dirs
from lmrl.eval.suite_report import figure, json_safe, latest_suite, load_suite

CURVES = ("reward/mean", "accuracy", "eval/accuracy", "response_length/mean", "entropy/rollout", "kl")
NOT_COMPARED = ("num_prompts",)
SETTINGS_COMPARED = ("samples", "temperature", "num_prompts", "max_new_tokens", "lam")
NAN = float("nan")


@dataclass
class Unit:
    """Records of one resampling unit (held-out prompts, probe prompts) and the metrics they give."""

    records: list[dict]
    aggregate: Callable[[list[dict]], dict[str, float]]


@dataclass
class Run:
    """One run (or one evaluated model) as the comparison reads it."""

    name: str
    metrics: dict[str, float]
    units: dict[str, Unit] = field(default_factory=dict)
    curves: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)


@dataclass
class Arm:
    name: str
    runs: list[Run]


def from_suite(name: str, result: dict) -> Run:
    """A Run from an `lmrl eval` result: metrics recomputed from its records, so the bootstrap agrees."""
    from lmrl.eval import reward_seeking, suite

    settings = result.get("settings", {})
    ks = suite.ks_for(result["prompts"], settings.get("ks", [1]))
    units = {"prompts": Unit([suite.prompt_values(r, ks) for r in result["prompts"]],
                             partial(suite.combine, lam=settings.get("lam", 1.0)))}
    if "reward_seeking" in result:
        units["probe"] = Unit(result["reward_seeking"]["prompts"], reward_seeking.aggregate)
    metrics = {}
    for unit in units.values():
        metrics.update(unit.aggregate(unit.records))
    for k, v in result.get("metrics", {}).items():
        metrics.setdefault(k, NAN if v is None else float(v))
    return Run(name, metrics, units, settings=settings)


def load_run(path: str | Path) -> Run:
    """A run directory (training curves, and its latest `lmrl eval` result or else its last eval/* values)
    or an `lmrl eval` JSON file; a pipeline run is `_load_pipeline`'s."""
    from lmrl.eval.report import read_series

    path = Path(path)
    if path.is_file():
        return from_suite(path.stem, load_suite(path))
    if read_pipeline(path) is not None:
        return _load_pipeline(path)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is neither a run directory (no metrics.jsonl) nor an `lmrl eval` JSON file")
    series = read_series(path)
    found = latest_suite(path)
    if found is not None:
        run = from_suite(path.name, load_suite(found))
    else:
        run = Run(path.name, {k.removeprefix("eval/"): s.values[-1] for k, s in series.items()
                              if k.startswith("eval/")})
    run.curves = {k: (s.steps, s.values) for k, s in series.items()}
    return run


def _prefixed(unit: Unit, label: str) -> Unit:
    return Unit(unit.records, lambda records: {f"{label}/{k}": v for k, v in unit.aggregate(records).items()})


def _load_pipeline(path: Path) -> Run:
    """A pipeline run lined up by stage label: each stage's metrics and per-prompt records under `<label>/`,
    the last stage's also as they are (the pipeline's result), its training curves on one step axis."""
    from lmrl.eval.report import read_series

    stages = [(label, load_run(folder)) for label, folder in stage_dirs(path)]
    if not stages:
        raise FileNotFoundError(f"{path} is a pipeline run whose stages have logged nothing yet")
    last = stages[-1][1]
    run = Run(path.name, dict(last.metrics), dict(last.units), settings=last.settings)
    for label, stage in stages:
        run.metrics.update({f"{label}/{k}": v for k, v in stage.metrics.items()})
        run.units.update({f"{label}/{kind}": _prefixed(unit, label) for kind, unit in stage.units.items()})
    run.curves = {k: (s.steps, s.values) for k, s in read_series(path).items()}
    return run


def parse_arm(spec: str) -> Arm:
    """`PATH`, `PATH,PATH,…` (seeds of one arm) or `NAME=PATH[,PATH…]`."""
    name, _, paths = spec.partition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
    runs = [load_run(p) for p in paths.split(",") if p]
    if not runs:
        raise ValueError(f"arm {spec!r} names no run")
    return Arm(name or (runs[0].name if len(runs) == 1 else f"{runs[0].name} (+{len(runs) - 1})"), runs)


def _shared(arms: list[Arm]) -> list[str]:
    runs = [r for a in arms for r in a.runs]
    return [m for m in runs[0].metrics if m not in NOT_COMPARED
            and all(math.isfinite(r.metrics.get(m, NAN)) for r in runs)]


def _pair(ref: Arm, arm: Arm, names: list[str], alpha: float, n_boot: int, seed: int,
          intervals: dict[str, dict], warnings: list[str]) -> list[Comparison]:
    """The tests of one arm against the reference, filling the arms' intervals where the method gives them, and
    `warnings` with what the pairing of their records by uid found (repeated uids, different prompts)."""
    values = {a.name: {m: float(np.mean([r.metrics[m] for r in a.runs])) for m in names} for a in (ref, arm)}

    def untestable(why: str) -> list[Comparison]:
        a, b = values[ref.name], values[arm.name]
        return [Comparison(m, a[m], b[m], b[m] - a[m], NAN, NAN, NAN, why) for m in names]

    if len(ref.runs) >= 2 and len(arm.runs) >= 2:
        for a in (ref, arm):
            for m in names:
                intervals[a.name].setdefault(m, mean_interval([r.metrics[m] for r in a.runs], alpha))
        return [welch(m, [r.metrics[m] for r in ref.runs], [r.metrics[m] for r in arm.runs], alpha) for m in names]
    if len(ref.runs) != len(arm.runs):
        return untestable("one run against several: give every arm one run, or two or more")
    a, b = ref.runs[0], arm.runs[0]
    found: dict[str, Comparison] = {}
    for kind in sorted(a.units.keys() & b.units.keys()):
        note = pair_by_uid(a.units[kind].records, b.units[kind].records).note
        if note:
            warnings.append(f"{arm.name} vs {ref.name} ({kind}): {note}")
        tests, ci_a, ci_b = bootstrap(a.units[kind].records, b.units[kind].records, a.units[kind].aggregate,
                                      alpha, n_boot, seed)
        for t in tests:
            if t.metric in names:
                found[t.metric] = t
                intervals[ref.name].setdefault(t.metric, ci_a[t.metric])
                intervals[arm.name][t.metric] = ci_b[t.metric]
    missing = untestable("no per-prompt records: run `lmrl eval RUN` first")
    return [found.get(m, t) for m, t in zip(names, missing)]


def _warnings(arms: list[Arm]) -> list[str]:
    out = []
    for key in SETTINGS_COMPARED:
        seen = {str(r.settings[key]) for a in arms for r in a.runs if key in r.settings}
        if len(seen) > 1:
            out.append(f"the runs were evaluated with different {key} ({', '.join(sorted(seen))}): "
                       f"the metrics that depend on it do not compare like for like")
    return out


def compare(arms: list[Arm], alpha: float = 0.05, n_boot: int = 2000, seed: int = 0,
            metrics: list[str] | None = None) -> dict:
    """Every arm against the first, Holm-corrected over all tests; a JSON-able result with its statement."""
    if len(arms) < 2:
        raise ValueError("compare needs at least two arms")
    if len({a.name for a in arms}) < len(arms):
        raise ValueError(f"arm names must differ: {[a.name for a in arms]} (name them NAME=PATH)")
    names = _shared(arms)
    if metrics:
        unknown = [m for m in metrics if m not in names]
        if unknown:
            raise ValueError(f"metrics {unknown} are not reported by every run; shared: {', '.join(names)}")
        names = list(metrics)
    intervals: dict[str, dict] = {a.name: {} for a in arms}
    warnings = _warnings(arms)
    pairs = [(arm.name, t) for arm in arms[1:]
             for t in _pair(arms[0], arm, names, alpha, n_boot, seed, intervals, warnings)]
    apply_holm([t for _, t in pairs], alpha)
    tests = [{"arm": name, **asdict(t)} for name, t in pairs]
    result = {
        "alpha": alpha, "reference": arms[0].name, "bootstrap_samples": n_boot,
        "arms": [{"name": a.name, "runs": [r.name for r in a.runs],
                  "metrics": {m: {"value": float(np.mean([r.metrics[m] for r in a.runs])),
                                  "low": intervals[a.name].get(m, (NAN, NAN))[0],
                                  "high": intervals[a.name].get(m, (NAN, NAN))[1]} for m in names}}
                 for a in arms],
        "tests": tests, "warnings": warnings,
    }
    result["statement"] = statement(tests, alpha, arms[0].name, warnings)
    return result


def statement(tests: list[dict], alpha: float, reference: str, warnings: Sequence[str] = ()) -> str:
    """Plain words: which differences are significant at `alpha` after Holm, which could not be tested, and the
    warnings a reader must see with them (records paired by repeated uids, settings that differ)."""
    testable = [t for t in tests if math.isfinite(t["p"])]
    lines = []
    if testable:
        significant = [t for t in testable if t["significant"]]
        lines.append(f"{len(significant)} of {len(testable)} differences are significant at α = {alpha} after "
                     f"Holm's correction over the {len(testable)} tests (reference: {reference}).")
        for t in significant:
            lines.append(f"- {t['arm']} vs {reference}, {t['metric']}: {t['other']:.4g} vs {t['reference']:.4g}, "
                         f"difference {t['diff']:+.4g} [{t['low']:+.4g}, {t['high']:+.4g}], "
                         f"Holm p {t['p_holm']:.3g} ({t['method']})")
        if not significant:
            best = min(testable, key=lambda t: (t["p_holm"], t["p"]))
            lines.append(f"The smallest Holm-adjusted p is {best['p_holm']:.3g} ({best['arm']}, {best['metric']}: "
                         f"difference {best['diff']:+.4g} [{best['low']:+.4g}, {best['high']:+.4g}]).")
    for reason in sorted({t["method"] for t in tests if not math.isfinite(t["p"])}):
        which = [f"{t['arm']} {t['metric']}" for t in tests if not math.isfinite(t["p"]) and t["method"] == reason]
        lines.append(f"Not tested ({reason}): {', '.join(which)}.")
    lines += [f"Warning: {w}" for w in warnings]
    return "\n".join(lines)


def plot_curves(arms: list[Arm], keys: tuple[str, ...] | list[str], path: Path) -> Path | None:
    """Training curves of every arm overlaid, one panel per metric (runs thin, the arm's mean thick)."""
    keys = [k for k in keys if any(k in r.curves for a in arms for r in a.runs)]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = figure(4.6 * cols, 3.3 * rows)
    colours = [f"C{i % 10}" for i in range(len(arms))]
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        for arm, colour in zip(arms, colours):
            curves = [dict(zip(*r.curves[key])) for r in arm.runs if key in r.curves]
            if not curves:
                continue
            for curve in curves if len(curves) > 1 else []:
                ax.plot(sorted(curve), [curve[s] for s in sorted(curve)], color=colour, alpha=0.3, linewidth=0.8)
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(steps, [np.mean([c[s] for c in curves]) for s in steps], color=colour, linewidth=1.8,
                    marker="o" if len(steps) <= 20 else None, markersize=3, label=arm.name)
        ax.set(title=key, xlabel="step")
        ax.grid(True, alpha=0.3)
    fig.axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _cell(v: dict) -> str:
    if not math.isfinite(v["low"]):
        return f"{v['value']:.4g}"
    return f"{v['value']:.4g} [{v['low']:.4g}, {v['high']:.4g}]"


def _num(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "—"


def render_html(result: dict, curves_png: Path | None) -> str:
    """The comparison as one self-contained HTML page."""
    from lmrl.eval.report import CSS

    arms = result["arms"]
    head = "".join(f"<th>{html.escape(a['name'])}</th>" for a in arms)
    metric_rows = "".join(f"<tr><td>{html.escape(m)}</td>" + "".join(f'<td class="num">{_cell(a["metrics"][m])}</td>'
                                                                     for a in arms) + "</tr>"
                          for m in arms[0]["metrics"])
    test_rows = "".join(
        f"<tr><td>{html.escape(t['arm'])}</td><td>{html.escape(t['metric'])}</td>"
        f'<td class="num">{t["diff"]:+.4g}</td><td class="num">[{_num(t["low"])}, {_num(t["high"])}]</td>'
        f'<td class="num">{_num(t["p"])}</td><td class="num">{_num(t["p_holm"])}</td>'
        f"<td>{'yes' if t['significant'] else 'no'}</td><td>{html.escape(t['method'])}</td></tr>"
        for t in result["tests"])
    parts = ["<h1>Comparison</h1>",
             f'<p class="sub">reference {html.escape(result["reference"])} · α = {result["alpha"]} · '
             f"intervals at {100 * (1 - result['alpha']):.0f} %</p>",
             f'<pre>{html.escape(result["statement"])}</pre>']
    parts += [f'<p class="note">{html.escape(w)}</p>' for w in result["warnings"]]
    parts += [f"<h2>Metrics</h2><table><tr><th>metric</th>{head}</tr>{metric_rows}</table>",
              f"<h2>Differences (arm − {html.escape(result['reference'])})</h2><table><tr><th>arm</th><th>metric</th>"
              f"<th>difference</th><th>interval</th><th>p</th><th>Holm p</th><th>significant</th><th>method</th></tr>"
              f"{test_rows}</table>"]
    if curves_png is not None:
        data = base64.b64encode(curves_png.read_bytes()).decode("ascii")
        parts.append(f'<h2>Training curves</h2><div class="plot"><img alt="training curves" '
                     f'src="data:image/png;base64,{data}"></div>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>lmrl compare</title>'
            f"<style>{CSS}</style></head><body><main>\n{''.join(parts)}\n</main></body></html>\n")


def write_comparison(arms: list[Arm], out: str | Path, alpha: float = 0.05, n_boot: int = 2000, seed: int = 0,
                     metrics: list[str] | None = None, curves: tuple[str, ...] | list[str] = CURVES) -> dict:
    """Compare and write OUT/compare.json, OUT/curves.png (when there are curves) and OUT/compare.html."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = compare(arms, alpha, n_boot, seed, metrics)
    png = plot_curves(arms, curves, out / "curves.png")
    (out / "compare.json").write_text(json.dumps(json_safe(result), indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "compare.html").write_text(render_html(result, png), encoding="utf-8")
    return result
