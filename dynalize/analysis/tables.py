"""The paper's tables: Peak / End / Final per run with differences from a baseline (Table 1), and
the per-axis table (mean per criterion over the End window).

- Peak: the best evaluated checkpoint (its step shown).
- End: the mean over evaluated checkpoints with lo ≤ step ≤ hi (default 150–200), the same window
  for every run; a run with none there gets n/a and a note says so.
- Final: the last evaluated checkpoint.
- RM (End): the mean of `rm/mean` (metrics.jsonl) over training steps lo..hi.
- Δ: a run's value minus the baseline run's (the first run unless chosen).

Per judge (the paper's Table 3): Peak / End / Final of the same generations under each judge,
side by side (`judges_table`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from .runs import Metric, Run

RM_METRIC = Metric("metrics", "rm/mean")


@dataclass
class Table1Row:
    run: str
    n: int
    peak: float | None
    peak_step: int | None
    end: float | None
    end_steps: list[int]
    final: float | None
    final_step: int | None
    rm_end: float | None
    rm_n: int
    delta: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Table1:
    metric: Metric
    window: tuple[int, int]
    baseline: str
    rows: list[Table1Row]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric.label, "window": list(self.window), "baseline": self.baseline,
                "rows": [r.__dict__ for r in self.rows], "notes": self.notes}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def table1(runs: list[Run], metric: Metric, window: tuple[int, int] = (150, 200), baseline: int = 0,
           rm_metric: Metric = RM_METRIC) -> Table1:
    """Peak / End / Final of `metric` and RM over End, for every run, with Δ from `runs[baseline]`."""
    lo, hi = window
    rows, notes = [], []
    for run in runs:
        series = run.series(metric)
        in_window = [(s, v) for s, v in series if lo <= s <= hi]
        rm = [v for s, v in run.series(rm_metric) if lo <= s <= hi]
        peak = max(series, key=lambda sv: sv[1]) if series else None
        rows.append(Table1Row(
            run=run.name, n=len(series), peak=peak[1] if peak else None, peak_step=peak[0] if peak else None,
            end=_mean([v for _, v in in_window]), end_steps=[s for s, _ in in_window],
            final=series[-1][1] if series else None, final_step=series[-1][0] if series else None,
            rm_end=_mean(rm), rm_n=len(rm)))
        if skipped := run.off_schedule(metric):
            notes.append(f"{run.name}: left out {metric.label} at step(s) {_steps_text(skipped)}: off its "
                         f"evaluation schedule (made at an earlier last step, before the run was extended)")
        if not series:
            notes.append(f"{run.name}: no {metric.label} values ({run.file(metric.source)}): every column is n/a")
        elif not in_window:
            notes.append(f"{run.name}: no evaluated checkpoint in steps {lo}–{hi} (it has steps "
                         f"{_steps_text([s for s, _ in series])}): End is n/a")
        if not rm:
            notes.append(f"{run.name}: no {rm_metric.column} in metrics.jsonl for steps {lo}–{hi}: RM (End) is n/a")
        incomplete = [r["step"] for r in run.rows(metric.source) if r.get("complete") is False]
        if incomplete:
            notes.append(f"{run.name}: {metric.label} at step {_steps_text(incomplete)} is not complete (judge or "
                         f"patient calls failed; rerun python -m dynalize.eval to do them again)")
    step_sets = {tuple(r.end_steps) for r in rows if r.end_steps}
    if len(step_sets) > 1:
        notes.append("End averages different checkpoints across runs: " + "; ".join(
            f"{r.run}: {_steps_text(r.end_steps)}" for r in rows if r.end_steps))
    base = rows[baseline]
    for r in rows:
        r.delta = {"peak": _delta(r.peak, base.peak), "end": _delta(r.end, base.end),
                   "final": _delta(r.final, base.final), "rm_end": _delta(r.rm_end, base.rm_end)}
    return Table1(metric, window, base.run, rows, notes)


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}, {steps[1]}, …, {steps[-1]} ({len(steps)})"


def _fmt(v: float | None, digits: int = 2, sign: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def table1_cells(t: Table1) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of Table 1 (shared by the Markdown and the rich renderings)."""
    header = ["run", "Peak (step)", "End (n)", "Final (step)", "RM (End)", "ΔPeak", "ΔEnd", "ΔFinal", "ΔRM"]
    body = []
    for r in t.rows:
        is_base = r.run == t.baseline
        deltas = ["–" if is_base else _fmt(r.delta[k], digits, sign=True)
                  for k, digits in (("peak", 2), ("end", 2), ("final", 2), ("rm_end", 3))]
        body.append([
            r.run + (" (baseline)" if is_base else ""),
            f"{_fmt(r.peak)} ({r.peak_step})" if r.peak is not None else "n/a",
            f"{_fmt(r.end)} ({len(r.end_steps)})" if r.end is not None else "n/a",
            f"{_fmt(r.final)} ({r.final_step})" if r.final is not None else "n/a",
            _fmt(r.rm_end, 3), *deltas,
        ])
    return header, body


def judges_table(runs: list[Run], metrics: list[Metric], names: list[str], window: tuple[int, int] = (150, 200),
                 baseline: int = 0) -> tuple[list[str], list[list[str]], list[Table1]]:
    """Peak / End / Final of each run under each judge (`metrics`: one per judge, named `names`),
    side by side: header, body cells, and the Table 1 of each judge (for notes and JSON)."""
    tables = [table1(runs, m, window, baseline) for m in metrics]
    header = ["run"] + [f"{name} {col}" for name in names for col in ("Peak (step)", "End (n)", "Final (step)")]
    body = []
    for i, run in enumerate(runs):
        cells = [run.name]
        for t in tables:
            cells += table1_cells(t)[1][i][1:4]
        body.append(cells)
    return header, body, tables


@dataclass
class AxisTable:
    metric: Metric
    window: tuple[int, int]
    baseline: str
    axes: list[str]
    rows: dict[str, dict[str, float | None]]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric.label, "window": list(self.window), "baseline": self.baseline,
                "axes": self.axes, "rows": self.rows}


def axis_table(runs: list[Run], metric: Metric, window: tuple[int, int] = (150, 200), baseline: int = 0,
               key: str = "criteria") -> AxisTable:
    """Mean of each criterion (`row[key][name]`) over the End window, per run."""
    lo, hi = window
    axes: dict[str, None] = {}
    per_run: dict[str, dict[str, float | None]] = {}
    for run in runs:
        rows = [r for r in run.rows(metric.source) if lo <= r.get("step", -1) <= hi and isinstance(r.get(key), dict)]
        for r in rows:
            axes.update(dict.fromkeys(r[key]))
        per_run[run.name] = {a: _mean([r[key][a] for r in rows if isinstance(r[key].get(a), int | float)])
                             for a in axes}
    per_run = {name: {a: values.get(a) for a in axes} for name, values in per_run.items()}
    return AxisTable(metric, window, runs[baseline].name, list(axes), per_run)


def axis_cells(t: AxisTable) -> tuple[list[str], list[list[str]]]:
    header = ["run", *t.axes]
    base = t.rows[t.baseline]
    body = []
    for name, values in t.rows.items():
        cells = [name + (" (baseline)" if name == t.baseline else "")]
        for a in t.axes:
            v = values.get(a)
            cell = _fmt(v)
            if name != t.baseline and v is not None and base.get(a) is not None:
                cell += f" ({_fmt(v - base[a], sign=True)})"
            cells.append(cell)
        body.append(cells)
    return header, body


def markdown(header: list[str], body: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table (first column left-aligned, others right)."""
    esc = [[c.replace("|", "\\|") for c in row] for row in [header, *body]]
    lines = ["| " + " | ".join(esc[0]) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in esc[1:]]
    return "\n".join(lines)


def rich_table(title: str, header: list[str], body: list[list[str]]) -> Table:
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for row in body:
        t.add_row(*row)
    return t
