"""The paper's figures as PNG files (matplotlib, Agg backend: no display needed).

- `plot_scores`: RM score and a benchmark score against step, one line per run.
- `plot_penalty_timeline`: which penalty was active when (bars), and each one's prevalence.
- `plot_patterns`: share of replies (and reasoning traces) matching each word pattern per step.
- `plot_rubric`: the rubric measurement against step: proxy, gold, their gap, overclaim.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .patterns import FIELDS, Prevalence
from .penalties import PenaltyHistory
from .runs import Metric, Run
from .tables import RM_METRIC


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_scores(runs: list[Run], metric: Metric, path: Path, rm_metric: Metric = RM_METRIC,
                window: tuple[int, int] | None = None) -> Path:
    """Two panels against step: the RM score (training metrics) and `metric` (with its CI if any)."""
    fig, (ax_rm, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        rm = run.series(rm_metric)
        if rm:
            ax_rm.plot([s for s, _ in rm], [v for _, v in rm], label=run.name, linewidth=1)
        pts = run.series(metric)
        if pts:
            line, = ax_b.plot([s for s, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=run.name)
            if metric.column == "score":
                ci = [(r["step"], r.get("ci_low"), r.get("ci_high")) for r in run.rows(metric.source)
                      if r.get("ci_low") is not None and r.get("ci_high") is not None]
                if ci:
                    ax_b.fill_between([c[0] for c in ci], [c[1] for c in ci], [c[2] for c in ci],
                                      color=line.get_color(), alpha=0.15, linewidth=0)
    for ax, title in ((ax_rm, f"RM score ({rm_metric.column})"), (ax_b, metric.label)):
        ax.set_title(title)
        ax.set_xlabel("step")
        if window:
            ax.axvspan(*window, color="grey", alpha=0.08)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


CURVES = (Metric("metrics", "reward/mean"), Metric("metrics", "rm/mean"), None, Metric("metrics", "gen_len/mean"))
"""The panels of `curves_figure`; None: the held-out metric."""


def curves_figure(runs: list[Run], metric: Metric | None) -> Figure:
    """Reward, RM score, `metric` (a benchmark or held-out score) and reply length against step, one
    line per run; a panel no run has data for is left out (an RM-free run has no RM panel)."""
    titles = ("reward (mean)", "RM score (mean)", metric.label if metric else "held-out evaluation",
              "reply length, tokens (mean)")
    panels = [(panel or metric, title, panel is None) for panel, title in zip(CURVES, titles)]
    drawn = [(m, title, held) for m, title, held in panels if m is not None and any(run.series(m) for run in runs)]
    if not drawn:  # nothing at all: one empty panel that says so
        drawn = [(CURVES[0], titles[0], False)]
    fig, axes = plt.subplots(1, len(drawn), figsize=(4 * len(drawn), 3.6), squeeze=False)
    for ax, (m, title, held) in zip(axes[0], drawn):
        for run in runs:
            pts = run.series(m)
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], label=run.name, linewidth=1.2,
                        marker="o" if held else None, markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return fig


def plot_penalty_timeline(run: Run, history: PenaltyHistory, path: Path) -> Path:
    """Top: a bar per penalty over the steps it was active. Bottom: its prevalence per step."""
    return _save(penalty_timeline_figure(run, history), path)


def penalty_timeline_figure(run: Run, history: PenaltyHistory) -> Figure:
    """The figure of `plot_penalty_timeline`."""
    ids = list(history.penalties)
    last = max([run.last_step() or 0, *(e for iv in history.intervals.values() for s, e in iv if e is not None),
                *(s for iv in history.intervals.values() for s, _ in iv),
                *(s for pts in history.prevalence.values() for s, _ in pts)], default=0)
    fig, (ax_t, ax_p) = plt.subplots(2, 1, figsize=(10, 2 + 0.4 * max(len(ids), 1) + 3), sharex=True,
                                     gridspec_kw={"height_ratios": [max(len(ids), 1), 4]})
    colors = {pid: f"C{i % 10}" for i, pid in enumerate(ids)}
    for y, pid in enumerate(ids):
        for start, end in history.intervals.get(pid, []):
            stop = last + 1 if end is None else end
            ax_t.barh(y, max(stop - start, 0.5), left=start, color=colors[pid], alpha=0.8)
    ax_t.set_yticks(range(len(ids)))
    ax_t.set_yticklabels([_short(f"{pid}: {history.penalties[pid].title}") for pid in ids], fontsize=8)
    ax_t.invert_yaxis()
    ax_t.set_title(f"{run.name}: penalty buffer")
    if not ids:
        ax_t.text(0.5, 0.5, "no penalty was ever added", ha="center", va="center", transform=ax_t.transAxes)
    for pid, pts in history.prevalence.items():
        ax_p.plot([s for s, _ in pts], [v for _, v in pts], marker=".", color=colors.get(pid), label=pid)
    ax_p.set_ylabel("prevalence")
    ax_p.set_xlabel("step")
    ax_p.set_ylim(-0.02, 1.02)
    if history.prevalence:
        ax_p.legend(fontsize=8, ncol=4)
    return fig


def _short(text: str, n: int = 48) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def plot_patterns(points: list[Prevalence], path: Path) -> Path:
    """One panel per pattern; a line per run and field (replies solid, reasoning dashed)."""
    labels = list(dict.fromkeys(p.pattern for p in points)) or ["(no pattern)"]
    fig, axes = plt.subplots(1, len(labels), figsize=(5.5 * len(labels), 4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        mine = [p for p in points if p.pattern == label]
        for run in dict.fromkeys(p.run for p in mine):
            for f, style in zip(FIELDS, ("-", "--")):
                pts = sorted((p.step, p.share) for p in mine if p.run == run and p.field == f)
                if pts:
                    ax.plot([s for s, _ in pts], [v for _, v in pts], style, marker=".",
                            label=f"{run} ({'replies' if f == 'reply' else 'reasoning'})")
        ax.set_title(f"share of texts: {label}")
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no rollouts", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


def plot_rubric(runs: list, path: Path) -> Path:
    """Four panels against step, a line per run (`analysis.rubrics.RubricRun`): held-out proxy and
    gold scores, proxy − gold, and the overclaim fraction."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    panels = (("proxy", "proxy score (training judge)"), ("gold", "gold score"), ("gap", "proxy − gold"),
              ("overclaim", "overclaim (proxy met, gold unmet)"))
    for ax, (key, title) in zip(axes.flat, panels):
        for r in runs:
            ax.plot(r.steps, r.series[key], marker=".", label=r.name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)
