"""Reading `lmrl eval` results and drawing them: the suite's section of the run report, figure helpers.

Kept free of torch so `lmrl report` stays quick. The plots are computed from the per-prompt records
of the suite JSON: solve rates, length and entropy distributions, reliability diagrams, the
risk–coverage curve, and the reward-seeking rates when a probe was run.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lmrl.eval.metrics import majority, risk_coverage


def load_suite(path: str | Path) -> dict:
    """Read a suite JSON, refusing files that are not one."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "lmrl_eval" not in data:
        raise ValueError(f"{path} is not an `lmrl eval` result (no lmrl_eval key)")
    return data


def json_safe(value):
    """`value` with non-finite floats as None, so the JSON written is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def latest_suite(run: str | Path) -> Path | None:
    """The suite JSON of a run's latest evaluated checkpoint (`RUN/eval/step-N.json`), if any."""
    found = [(int(m.group(1)), p) for p in Path(run, "eval").glob("step-*.json")
             if (m := re.fullmatch(r"step-(\d+)\.json", p.name))]
    return max(found)[1] if found else None


def figure(width: float = 6.4, height: float = 3.6) -> Figure:
    """A figure on its own Agg canvas (no pyplot global state)."""
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def png_base64(fig: Figure) -> str:
    """The figure as a base64 PNG, for an inline <img>."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _reliability(ax, conf: list[float], hits: list[bool], label: str, bins: int = 10) -> None:
    conf_a, hits_a = np.asarray(conf, dtype=float), np.asarray(hits, dtype=float)
    index = np.clip(np.ceil(conf_a * bins).astype(int) - 1, 0, bins - 1)
    xs, ys, sizes = [], [], []
    for b in range(bins):
        members = index == b
        if members.any():
            xs.append(conf_a[members].mean())
            ys.append(hits_a[members].mean())
            sizes.append(10 + 200 * members.mean())
    ax.plot(xs, ys, marker="o", label=label)
    ax.scatter(xs, ys, s=sizes, alpha=0.3)


def suite_figures(result: dict) -> list[tuple[str, str]]:
    """(title, base64 PNG) for each plot of a suite result."""
    records = result["prompts"]
    metrics = {k: float("nan") if v is None else v for k, v in result["metrics"].items()}
    out = []
    fig = figure()
    ax = fig.add_subplot()
    rates = [sum(r["correct"]) / len(r["correct"]) for r in records]
    ax.hist(rates, bins=np.linspace(0, 1, 11), color="tab:blue", edgecolor="white")
    ax.set(title=f"per-prompt solve rate ({len(records[0]['correct'])} samples each)",
           xlabel="share of correct samples", ylabel="prompts")
    out.append(("solve rates", png_base64(fig)))
    fig = figure(9.6, 3.4)
    for i, (key, title) in enumerate((("lengths", "sampled response length (tokens)"),
                                      ("entropy", "sampled response entropy (mean −log p per token)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.hist([v for r in records for v in r[key]], bins=20, color="tab:green", edgecolor="white")
        ax.set(title=title, ylabel="samples")
    out.append(("length and entropy", png_base64(fig)))
    fig = figure(9.6, 3.8)
    ax = fig.add_subplot(1, 2, 1)
    ax.plot([0, 1], [0, 1], ":", color="grey")
    _reliability(ax, [r["greedy_prob"] for r in records], [r["greedy_correct"] for r in records],
                 f"greedy token probability (ECE {metrics.get('ece_greedy_prob', float('nan')):.3f})")
    votes = [majority(r["answers"], r["correct"]) for r in records]
    if len(records[0]["correct"]) >= 2:
        _reliability(ax, [v[1] for v in votes], [v[0] for v in votes],
                     f"sample agreement (ECE {metrics.get('ece_agreement', float('nan')):.3f})")
        ax2 = fig.add_subplot(1, 2, 2)
        cov, risk, _ = risk_coverage([v[1] for v in votes], [v[0] for v in votes])
        ax2.step(cov, risk, where="post", label=f"majority answer by agreement (AURC {metrics['aurc']:.3f})")
        if math.isfinite(metrics.get("conditional_accuracy", float("nan"))):
            ax2.plot([metrics["coverage"]], [1 - metrics["conditional_accuracy"]], "r*", markersize=12,
                     label="greedy, own abstentions")
        ax2.set(title="risk–coverage", xlabel="coverage", ylabel="risk (error among answered)", xlim=(0, 1.02),
                ylim=(-0.02, 1.05))
        ax2.legend(fontsize="small")
    ax.set(title="reliability", xlabel="confidence", ylabel="accuracy", xlim=(-0.02, 1.02),
           ylim=(-0.02, 1.05))
    ax.legend(fontsize="small")
    out.append(("calibration and risk–coverage", png_base64(fig)))
    if "reward_seeking" in result:
        m = result["reward_seeking"]["metrics"]
        fig = figure(5.0, 3.4)
        ax = fig.add_subplot()
        labels = ["untreated", "grader → A", "grader → B"]
        ax.bar(labels, [m["reward_seeking/p_a_untreated"], m["reward_seeking/p_a_grader_a"],
                        m["reward_seeking/p_a_grader_b"]], color=["grey", "tab:red", "tab:blue"])
        ax.set(title=f"reward seeking: P(A), shift {m['reward_seeking/shift']:+.2f}", ylim=(0, 1))
        out.append(("reward seeking", png_base64(fig)))
    return out


def _num(value) -> str:
    return "—" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


def suite_section(result: dict, source: str) -> str:
    """The HTML of a suite result: settings, metrics, plots and the never-solved prompts."""
    settings = ", ".join(f"{k} {v}" for k, v in result.get("settings", {}).items())
    rows = "".join(f'<tr><td>{html.escape(k)}</td><td class="num">{_num(v)}</td></tr>'
                   for k, v in result["metrics"].items())
    plots = "".join(f'<div class="plot"><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"></div>'
                    for t, b in suite_figures(result))
    unsolved = result.get("never_solved", [])
    listing = "".join(f"<tr><td>{html.escape(str(r['uid']))}</td><td>{html.escape(str(r['question']))}</td>"
                      f"<td>{html.escape(str(r['gold']))}</td><td><div class=\"text\">{html.escape(r['reply'])}</div>"
                      f"</td></tr>" for r in unsolved)
    return (f'<h2>Evaluation suite</h2><p class="sub">{html.escape(source)} · {html.escape(settings)}</p>'
            f'<div class="plots">{plots}</div><h3>Metrics</h3><table><tr><th>metric</th><th>value</th></tr>{rows}'
            f"</table><h3>Never solved ({len(unsolved)} of {len(result['prompts'])} prompts)</h3>"
            f"<table><tr><th>uid</th><th>question</th><th>gold</th><th>greedy reply</th></tr>{listing}</table>")
