"""What the HTML report shows of a rubric-rewarded run (dynalize/analysis/html.py draws the page).

- the held-out measurement: proxy and gold score at each evaluation, and the gap between them
  (eval/task.jsonl, with re-graded steps of `python -m dynalize.eval --bench rubric` in their
  place), beside the in-domain training reward, masked and on the full rubric (metrics.jsonl);
- per training rollout its criteria with the verdicts, the dropped ones marked, its masked and
  full scores (the criteria's texts come from the eval rollouts' saved rubrics and from the run's
  task, rebuilt from config.yaml when its data can be read; otherwise ids only);
- per held-out reply (rollouts/eval_NNNNNN.jsonl) every criterion with the proxy's and the gold
  judge's verdicts, the ones they disagree on marked, and both scores.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ..runlog import read_jsonl
from .rubrics import evaluation_rows
from .runs import Metric, Run


def is_rubric_run(run: Run) -> bool:
    """Whether the run has the rubric term (its config, or rubric fields in its files)."""
    cfg = run.config().get("rubric") or {}
    return bool(cfg.get("enabled")) or any(k.startswith("rubric/") for r in run.rows("metrics")[:3] for k in r)


def criteria_texts(run: Run) -> dict[str, dict[str, str]]:
    """Prompt id → {criterion id: text}: from the eval rollouts' saved rubrics, and the task's own
    prompts when its config can build it here (its data files where they were)."""
    out: dict[str, dict[str, str]] = {}
    for _, path in run.rollout_files("eval"):
        for row in read_jsonl(path):
            if row.get("rubric_criteria"):
                out.setdefault(str(row.get("prompt_id")), {c["id"]: c.get("text", "") for c in row["rubric_criteria"]})
    task = run.config().get("task") or {}
    try:
        from ..rubrics.criteria import rubric_from_meta
        from ..tasks.base import build_task

        built = build_task(task["name"], task.get("args") or {}, int(run.config().get("seed", 0)))
        for split in ("train", "eval"):
            for p in built.prompts(split):
                if p.id not in out and (crit := rubric_from_meta(p.meta)):
                    out[p.id] = {c.id: c.text for c in crit}
    except Exception:  # noqa: BLE001 - texts are a convenience: without the task the page shows ids
        pass
    return out


def rollout_rubric(row: dict[str, Any], texts: dict[str, dict[str, str]]) -> dict[str, Any] | None:
    """A training rollout's rubric part for the browser: one list per reply of [id, text, met,
    failed, dropped], and the masked (R̃) and full-rubric scores."""
    if "rubric_verdicts" not in row:
        return None
    known = texts.get(str(row.get("prompt_id")), {})
    dropped = set(row.get("rubric_dropped") or ())
    failed = set(row.get("rubric_failed") or ())
    replies = []
    for verdicts in row.get("rubric_verdicts") or []:
        ids = list(known) or list(verdicts)
        ids += [i for i in verdicts if i not in ids]
        replies.append([[i, known.get(i, ""), verdicts.get(i), i in failed, i in dropped] for i in ids])
    return {"replies": replies, "masked": _num(row.get("rubric_score")), "full": _num(row.get("rubric_full")),
            "dropped": len(dropped)}


def held_out(run: Run) -> list[dict[str, Any]]:
    """Per evaluation step, each held-out reply with both judges' verdicts per criterion:
    {"step", "replies": [{"id", "prompt", "reply", "proxy", "gold", "criteria": [[id, text, proxy, gold,
    failed]], "disagree": [ids]}]}. Re-graded verdicts (eval/rubric_raw/) are used where they exist."""
    out = []
    for step, path in run.rollout_files("eval"):
        regraded = run.path / "eval" / "rubric_raw" / f"step_{step:06d}.jsonl"
        again = iter(read_jsonl(regraded) if regraded.exists() else [])  # one record per reply, in file order
        replies = []
        for row in read_jsonl(path):
            if "proxy_verdicts" not in row:
                for _ in row.get("replies") or []:  # keep the re-graded records in step with the rows
                    next(again, None)
                continue
            criteria = row.get("rubric_criteria") or []
            prompt = next((m.get("content", "") for m in reversed(row.get("prompt") or []) if m.get("role") == "user"), "")
            for k, text in enumerate(row.get("replies") or []):
                rec = next(again, {})
                if rec.get("prompt_id") != row.get("prompt_id"):
                    rec = {}
                proxy = rec.get("proxy", _at(row.get("proxy_verdicts"), k) or {})
                gold = rec.get("gold", _at(row.get("gold_verdicts"), k))
                failed = set(rec.get("proxy_failed", _at(row.get("proxy_failed"), k) or [])) | \
                    set(rec.get("gold_failed", _at(row.get("gold_failed"), k) or []))
                ids = [c["id"] for c in criteria] or list(proxy)
                names = {c["id"]: c.get("text", "") for c in criteria}
                rows = [[i, names.get(i, ""), proxy.get(i), None if gold is None else gold.get(i), i in failed]
                        for i in ids]
                replies.append({"id": str(row.get("prompt_id", "")), "prompt": str(prompt), "reply": str(text),
                                "proxy": _num(_at(row.get("proxy_score"), k)), "gold": _num(_at(row.get("gold_score"), k)),
                                "criteria": rows,
                                "disagree": [r[0] for r in rows if r[3] is not None and not r[4] and
                                             bool(r[2]) != bool(r[3])]})
        if replies:
            out.append({"step": step, "replies": replies})
    return out


def rubric_figure(runs: list[Run]) -> Figure | None:
    """Held-out proxy (dashed) and gold (solid) per run, the gap proxy − gold, and the training
    reward masked (dashed) and on the full rubric (solid); None when no run has any of it."""
    series = []
    for run in runs:
        rows = [r for r in evaluation_rows(run) if isinstance(r.get("rubric/proxy"), int | float)]
        steps = [int(r.get("step", r.get("version", 0))) for r in rows]
        series.append((run, steps, rows))
    training = [(run, run.series(Metric("metrics", "rubric/masked")), run.series(Metric("metrics", "rubric/full")))
                for run in runs]
    if not any(rows for _, _, rows in series) and not any(m or f for _, m, f in training):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(16, 3.6))
    for i, (run, steps, rows) in enumerate(series):
        color = f"C{i % 10}"
        gold = [(s, r["rubric/gold"]) for s, r in zip(steps, rows) if isinstance(r.get("rubric/gold"), int | float)]
        axes[0].plot(steps, [r["rubric/proxy"] for r in rows], "--", color=color, marker="o", markersize=3,
                     label=f"{run.name}: proxy")
        if gold:
            axes[0].plot(*zip(*gold), "-", color=color, marker="o", markersize=3, label=f"{run.name}: gold")
            gaps = [(s, r["rubric/gap"]) for s, r in zip(steps, rows) if isinstance(r.get("rubric/gap"), int | float)]
            if gaps:
                axes[1].plot(*zip(*gaps), color=color, marker="o", markersize=3, label=run.name)
    for i, (run, masked, full) in enumerate(training):
        color = f"C{i % 10}"
        if masked:
            axes[2].plot(*zip(*masked), "--", color=color, linewidth=1, label=f"{run.name}: masked")
        if full:
            axes[2].plot(*zip(*full), "-", color=color, linewidth=1.2, label=f"{run.name}: full rubric")
    titles = ("held-out score: proxy (dashed) and gold", "gap: proxy − gold (held-out)",
              "training rubric reward: masked and full")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no gold judge" if ax is axes[1] else "no data", ha="center", va="center",
                    transform=ax.transAxes)
    axes[1].axhline(0, color="#999", linewidth=0.8)
    return fig


def _at(values: Any, k: int) -> Any:
    return values[k] if isinstance(values, list) and k < len(values) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None

