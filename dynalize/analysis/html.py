"""One self-contained HTML page for one or more runs: `python -m dynalize.report RUN [RUN] --html OUT`.

The page holds the curves (reward, RM score, the benchmark or held-out score, reply length; one
line per run), each run's penalty timeline (every penalty's title, description, regex,
references, add / retire / revive steps and prevalence) and a rollout browser per run: pick a
step, read prompts and replies with their RM score, verdicts and reward, the matches of regex
penalties highlighted, filtered by penalty or text. Several runs (RM-only beside Dynalize) sit
side by side.

Nothing is fetched: figures are inline SVG images (matplotlib), the script and style are inline
(dynalize/assets/report.js, report.css). Rollout text is untrusted model output, and penalty text
comes from a proposer model: everything from a run is HTML-escaped here or travels as JSON that
the script only ever puts into text nodes; a Content-Security-Policy lets only the page's own
script run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from ..judge.saferegex import RegexTimeout, SafeRegex, UnsafeRegex
from ..penalties.confirm import confirmation_text
from ..runlog import read_jsonl, write_text_atomic
from ..types import Penalty
from .html_rubric import criteria_texts, held_out, is_rubric_run, rollout_rubric, rubric_figure
from .penalties import PenaltyHistory, penalty_history
from .plots import curves_figure, penalty_timeline_figure
from .runs import Metric, ReportError, Run, default_metrics

ROLLOUT_STEPS = 12
"""Training steps whose rollouts the page holds by default (evenly spaced, the last included)."""


# --- what the page shows -------------------------------------------------------------------------

def chosen_steps(files: list[tuple[int, Path]], n: int) -> list[tuple[int, Path]]:
    """`n` of a run's rollout files, evenly spaced over the run, first and last included."""
    if n <= 0 or not files:
        return []
    if n >= len(files):
        return files
    picks = {round(i * (len(files) - 1) / max(n - 1, 1)) for i in range(n)} if n > 1 else {len(files) - 1}
    return [files[i] for i in sorted(picks)]


def highlight(text: str, spans: dict[str, list[tuple[int, int]]]) -> list[list[Any]]:
    """`text` cut into segments `[piece, [penalty ids matching it]]` at every span's edges."""
    cuts = sorted({0, len(text), *(x for found in spans.values() for s, e in found for x in (s, e))})
    out: list[list[Any]] = []
    for a, b in zip(cuts, cuts[1:]):
        ids = [pid for pid, found in spans.items() if any(s <= a and b <= e for s, e in found)]
        if out and out[-1][1] == ids:
            out[-1][0] += text[a:b]
        elif a < b:
            out.append([text[a:b], ids])
    return out or [["", []]]


def rollout_view(row: dict[str, Any], regexes: dict[str, SafeRegex], unusable: dict[str, str],
                 texts: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """A rollout line as the browser shows it; policy turns cut at the matches of the regex
    penalties it was judged on. A regex too slow on a reply is dropped from `regexes` and noted in
    `unusable` (penalty id → why), as the judge does."""
    judged = {pid: rx for pid, rx in regexes.items() if pid in (row.get("verdicts") or {})}
    turns = row.get("turns") or [{"role": "assistant", "content": r} for r in row.get("replies", [])]
    shown = []
    for t in turns:
        content = str(t.get("content", ""))
        spans = {}
        if t.get("role") == "assistant":
            for pid, rx in judged.items():
                try:
                    spans[pid] = rx.spans(content) if pid in regexes else []
                except RegexTimeout as err:
                    regexes.pop(pid)
                    unusable[pid] = f"too slow to highlight ({err})"
        shown.append([str(t.get("role", "")), highlight(content, spans)])
    scores = row.get("scores") or {}
    return {"id": str(row.get("prompt_id", "")), "group": row.get("group"), "version": row.get("policy_version"),
            "prompt": [[str(m.get("role", "")), str(m.get("content", ""))] for m in row.get("prompt", [])],
            "turns": shown, "rm": _num(scores.get("rm", row.get("rm_score"))), "reward": _num(row.get("reward")),
            "advantage": _num(row.get("advantage")), "verdicts": {k: bool(v) for k, v in (row.get("verdicts") or {}).items()},
            "failed": [str(x) for x in row.get("judge_failed") or []], "left_out": bool(row.get("left_out")),
            "rubric": rollout_rubric(row, texts or {}),
            "rewards": {str(k): _num(v) for k, v in (row.get("rewards") or {}).items()}}  # reward_funcs, raw


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def compiled(penalties: dict[str, Penalty], unusable: dict[str, str]) -> dict[str, SafeRegex]:
    """The usable regexes of `penalties`, by id; the others are noted in `unusable` (id → why)."""
    out = {}
    for pid, p in penalties.items():
        if p.regex:
            try:
                out[pid] = SafeRegex(p.regex)
            except UnsafeRegex as err:
                unusable[pid] = err.reason
    return out


def run_data(run: Run, history: PenaltyHistory, steps: int) -> dict[str, Any]:
    """What the script of the page needs of one run: its penalties, the chosen steps' rollouts and
    the regexes that highlight nothing (and why)."""
    unusable: dict[str, str] = {}
    regexes = compiled(history.penalties, unusable)
    files = run.rollout_files("step")
    rubric = is_rubric_run(run)
    texts = criteria_texts(run) if rubric else {}
    shown = [{"step": step, "rollouts": [rollout_view(r, regexes, unusable, texts) for r in read_jsonl(path)]}
             for step, path in chosen_steps(files, steps)]
    return {"name": run.name, "total_steps": len(files), "steps": shown, "unhighlighted": unusable,
            "penalties": {pid: {"title": p.title} for pid, p in history.penalties.items()},
            "has_rm": bool(run.series(Metric("metrics", "rm/mean"))), "has_penalties": has_penalties(run, history),
            "held_out": held_out(run) if rubric else []}


def has_penalties(run: Run, history: PenaltyHistory) -> bool:
    """Whether the run has Dynalize's penalty term (its config, or penalties it added)."""
    return bool(history.penalties) or bool((run.config().get("penalties") or {}).get("enabled")) or \
        any(k.startswith("penalties/") for r in run.rows("metrics")[:3] for k in r)


def events_text(intervals: list[tuple[int, int | None]]) -> str:
    """`[(3, 9), (12, None)]` → "added 3, retired 9, revived 12"."""
    out = []
    for i, (start, end) in enumerate(intervals):
        out.append(f"{'added' if i == 0 else 'revived'} {start}")
        if end is not None:
            out.append(f"retired {end}")
    return ", ".join(out)


# --- the page ------------------------------------------------------------------------------------

def svg_image(fig: Any, alt: str) -> str:
    """A matplotlib figure as an inline `<img>` (SVG in a data: URI), the figure closed."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="figure" alt="{html.escape(alt)}" src="data:image/svg+xml;base64,{data}">'


def held_out_metric(runs: list[Run]) -> Metric | None:
    """The curve of the benchmark (or the task's gold score) the runs were evaluated on, if any."""
    try:
        return default_metrics(runs)[0]
    except ReportError:
        return None


def table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An HTML table of already-escaped cells."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def summary_rows(runs: list[Run], metric: Metric | None, histories: list[PenaltyHistory],
                 columns: dict[str, bool]) -> list[list[str]]:
    """One row per run, in the columns `columns` keeps (RM, held-out, penalties, rubric gold)."""
    rows = []
    for run, history in zip(runs, histories):
        cells = [html.escape(run.name), str(run.last_step() or 0)]  # steps completed (row 0: the first evaluation)
        for col, shown in (("reward/mean", True), ("rm/mean", columns["rm"])):
            if shown:
                pts = run.series(Metric("metrics", col))
                cells.append(f"{pts[0][1]:.3f} → {pts[-1][1]:.3f}" if pts else "n/a")
        if columns["held_out"]:
            cells.append(_peak_final(run.series(metric) if metric else []))
        if columns["rubric"]:
            from .rubrics import evaluation_rows

            gold = [(int(r.get("step", r.get("version", 0))), r["rubric/gold"]) for r in evaluation_rows(run)
                    if isinstance(r.get("rubric/gold"), int | float)]
            cells.append(_peak_final(gold))
        if columns["penalties"]:
            cells.append(f"{len(history.penalties)} / {len(history.active_at_end())}")
        rows.append(cells)
    return rows


def _peak_final(pts: list[tuple[int, float]]) -> str:
    peak = max(pts, key=lambda p: p[1]) if pts else None
    return f"{peak[1]:.3f} (step {peak[0]}) / {pts[-1][1]:.3f}" if peak else "n/a"


def penalty_section(run: Run, history: PenaltyHistory) -> str:
    """A run's penalty timeline: the figure and one row per penalty."""
    e = html.escape
    if not history.penalties:
        return f"<h3>{e(run.name)}</h3><p class=\"note\">No penalty was added in this run.</p>"
    rows = []
    for pid, p in history.penalties.items():
        prev = [v for _, v in history.prevalence.get(pid, [])]
        refs = ", ".join(p.references)
        rows.append([
            f"<code>{e(pid)}</code>", e(p.title), e(p.description),
            f"<code>{e(p.regex)}</code>" if p.regex else f"detector <code>{e(p.detector)}</code>" if p.detector
            else "<span class=\"note\">LLM judge</span>",
            f"<details><summary>{len(p.references)}</summary>{e(refs)}</details>" if refs else "0",
            e(events_text(history.intervals.get(pid, []))),
            f"{prev[-1]:.0%} (max {max(prev):.0%})" if prev else "n/a",
            e(confirmation_text(history.confirmations.get(pid)))])
    header = ["id", "title", "description", "regex", "references", "steps", "prevalence (last)", "edited replies"]
    return (f"<h3>{e(run.name)}</h3>" + svg_image(penalty_timeline_figure(run, history), f"{run.name}: penalties")
            + table(header, rows, "penalties"))


def script_json(data: Any) -> str:
    """JSON safe inside a `<script>` element: no `<`, `>` or `&` that could end or open a tag."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _csp_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


def render_page(runs: list[Run], steps: int = ROLLOUT_STEPS) -> str:
    """The whole page, as a string."""
    e = html.escape
    histories = [penalty_history(r) for r in runs]
    metric = held_out_metric(runs)
    script = (resources.files("dynalize") / "assets" / "report.js").read_text(encoding="utf-8")
    style = (resources.files("dynalize") / "assets" / "report.css").read_text(encoding="utf-8")
    csp = (f"default-src 'none'; img-src data:; style-src {_csp_hash(style)}; "
           f"script-src {_csp_hash(script)}")
    data = {"runs": [run_data(r, h, steps) for r, h in zip(runs, histories)]}
    cols = f"cols cols-{min(len(runs), 3)}"
    rubric = [is_rubric_run(r) for r in runs]
    shown = {"rm": any(d["has_rm"] for d in data["runs"]), "held_out": metric is not None,
             "rubric": any(rubric), "penalties": any(d["has_penalties"] for d in data["runs"])}
    header = ["run", "steps", "reward (first → last)"] + (["RM (first → last)"] if shown["rm"] else []) + \
        ([f"{e(metric.label) if metric else 'held-out'}: peak / final"] if shown["held_out"] else []) + \
        (["rubric gold (held-out): peak / final"] if shown["rubric"] else []) + \
        (["penalties: added / active at end"] if shown["penalties"] else [])
    names = ", ".join(e(r.name) for r in runs)
    sections = ['<section id="summary"><h2>Summary</h2>' + table(header, summary_rows(runs, metric, histories, shown))
                + "</section>",
                '<section id="curves"><h2>Curves</h2>' + svg_image(curves_figure(runs, metric), "curves") + "</section>"]
    figure = rubric_figure(runs) if shown["rubric"] else None
    if figure is not None:  # the held-out measurement of rubric runs, and their held-out replies
        sections.append('<section id="rubric"><h2>Rubric: held-out proxy and gold</h2>' + svg_image(figure, "rubric")
                        + f'<div class="{cols}">' + "".join(f'<div class="heldout" data-run="{i}"></div>'
                                                             for i in range(len(runs))) + "</div></section>")
    if shown["penalties"]:
        sections.append(f'<section id="penalties"><h2>Penalties</h2><div class="{cols}">'
                        + "".join(f"<div>{penalty_section(r, h)}</div>" for r, h in zip(runs, histories))
                        + "</div></section>")
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>dynalize report: {names}</title><style>{style}</style></head><body>",
        f"<header><h1>dynalize report</h1><p>{names}</p></header>", *sections,
        f'<section id="rollouts"><h2>Rollouts</h2><div class="{cols}">'
        + "".join(f'<div class="browser" data-run="{i}"></div>' for i in range(len(runs))) + "</div></section>",
        f'<script type="application/json" id="dynalize-data">{script_json(data)}</script>',
        f"<script>{script}</script>", "</body></html>", ""])


def write_html_report(runs: list[Run], out: Path, steps: int = ROLLOUT_STEPS) -> Path:
    """Write the page of `runs` to `out` (its folder made if needed); returns `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, render_page(runs, steps))  # whole or not at all (a full disk leaves no half page)
    return out
