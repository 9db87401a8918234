"""Rubric runs read back: the proxy/gold measurement of each evaluation, and its tables.

A rubric-rewarded run's held-out evaluations (eval/task.jsonl, columns `rubric/proxy`,
`rubric/gold`, `rubric/gap`, `rubric/overclaim`, `rubric/<judge>_met/<criterion or tag:…>`,
`rubric/anchor_gold`, …) and training metrics (metrics.jsonl: `rubric/full`, `rubric/masked`,
`rubric/kept_frac`, `rubric/floor_binds`, `rubric/verdicts`) become a `RubricRun`; the tables:

- `summary_cells`: gold Peak / End / Final, proxy, gap and overclaim over End, the in-domain
  full-rubric reward over the last quarter of training steps;
- `matched_cells`: gold at every checkpoint, per run, with win counts against a baseline
  (checkpoints both runs evaluated, step > 0);
- `criteria_cells`: per-criterion and per-tag met rates, proxy / gold, over End;
- `anchor_cells`: the reviewers' check, gold's score of the same saved replies at the first and
  the last evaluation, and the largest share of their verdicts that changed.

End is the mean over evaluations in a step window, or over the last quarter of evaluations.
Evaluations off the run's schedule (an extended run's old last step) are left out, as in the
other reports (`Run.off_schedule`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .runs import Metric, ReportError, Run

KEYS = ("proxy", "gold", "gap", "overclaim", "missed_pitfalls", "anchor_gold", "anchor_flips")
"""Columns of the measurement kept as series (eval/task.jsonl `rubric/<key>`)."""


def _mean(values: list[Any]) -> float:
    values = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and v == v]
    return statistics.fmean(values) if values else float("nan")


@dataclass
class RubricRun:
    """One rubric run's measurement (NaN where a run has no such column)."""

    name: str
    steps: list[int]
    series: dict[str, list[float]]
    end_steps: list[int]
    peak: float
    peak_step: int
    proxy_at_peak: float
    end: dict[str, float]
    """Means over End of every KEYS column."""
    final: float
    criteria_end: dict[str, tuple[float, float]]
    """Per criterion id and `tag:<tag>`: (proxy met rate, gold met rate) over End."""
    criteria_first: dict[str, tuple[float, float]]
    train: dict[str, float] = field(default_factory=dict)
    """From metrics.jsonl: `full_end`, `masked_end` (last quarter of steps), `kept_frac`,
    `floor_binds`, `verdicts_per_step`, `score_s`, `step_s` (means over all steps)."""


def _step(row: dict[str, Any]) -> int:
    return int(row.get("step", row.get("version", -1)))


def judge_labels(run: Run) -> list[str]:
    """Labels of the second gold judges the run's replies were graded by (eval/rubric@LABEL.jsonl)."""
    return sorted(p.stem.partition("@")[2] for p in (run.path / "eval").glob("rubric@*.jsonl"))


def evaluation_rows(run: Run, label: str | None = None) -> list[dict[str, Any]]:
    """The measurement per evaluation: eval/task.jsonl with the steps re-graded since by the run's own
    judges (eval/rubric.jsonl, `python -m dynalize.eval --bench rubric`) in their place; with a
    `label`, the second gold judge's eval/rubric@LABEL.jsonl."""
    if label is not None:
        return run.rows(f"eval/rubric@{label}")
    regraded = {_step(r): r for r in run.rows("eval/rubric")}
    out = []
    for r in run.rows("eval/task"):
        again = regraded.get(_step(r))
        if again is not None:
            r = {**{k: v for k, v in r.items() if not k.startswith("rubric/")},
                 **{k: v for k, v in again.items() if k.startswith("rubric/")}}
        out.append(r)
    return out


def rubric_run(run: Run, window: tuple[int, int] | None = None, label: str | None = None) -> RubricRun:
    """`run`'s measurement (by its own gold judge, or the one `label` names); End = evaluations with
    window[0] ≤ step ≤ window[1], or the last quarter."""
    skip = set(run.off_schedule(Metric("eval/task", "rubric/gold")))
    evals = [r for r in evaluation_rows(run, label) if isinstance(r.get("rubric/gold"), int | float)
             and _step(r) not in skip]
    if not evals:
        raise ReportError(f"{run.path}: no rubric evaluations (eval/task.jsonl has no rubric/gold: the run needs "
                          f"rubric.enabled, rubric.gold_judge and eval_every; a gold judge that failed: grade "
                          f"again with python -m dynalize.eval --run {run.path} --bench rubric)")
    steps = [_step(r) for r in evals]
    end = [r for r in evals if window[0] <= _step(r) <= window[1]] if window else \
        evals[-max(1, math.ceil(len(evals) / 4)):]
    if not end:
        raise ReportError(f"{run.path}: no rubric evaluation in steps {window[0]}–{window[1]} (it has {steps})")
    peak = max(evals, key=lambda r: r["rubric/gold"])
    keys = sorted({k.split("/", 2)[2] for r in evals for k in r if k.startswith("rubric/gold_met/")})
    metrics = run.rows("metrics")
    last = metrics[-max(1, math.ceil(len(metrics) / 4)):] if metrics else []
    return RubricRun(
        name=run.name, steps=steps,
        series={k: [r.get(f"rubric/{k}", float("nan")) for r in evals] for k in KEYS},
        end_steps=[_step(r) for r in end], peak=peak["rubric/gold"], peak_step=_step(peak),
        proxy_at_peak=peak.get("rubric/proxy", float("nan")),
        end={k: _mean([r.get(f"rubric/{k}") for r in end]) for k in KEYS}, final=evals[-1]["rubric/gold"],
        criteria_end={c: (_mean([r.get(f"rubric/proxy_met/{c}") for r in end]),
                          _mean([r.get(f"rubric/gold_met/{c}") for r in end])) for c in keys},
        criteria_first={c: (_mean([evals[0].get(f"rubric/proxy_met/{c}")]), _mean([evals[0].get(f"rubric/gold_met/{c}")]))
                        for c in keys},
        train={"full_end": _mean([m.get("rubric/full") for m in last]),
               "masked_end": _mean([m.get("rubric/masked") for m in last]),
               "kept_frac": _mean([m.get("rubric/kept_frac") for m in metrics]),
               "floor_binds": _mean([m.get("rubric/floor_binds") for m in metrics]),
               "verdicts_per_step": _mean([m.get("rubric/verdicts") for m in metrics]),
               "score_s": _mean([m.get("time/score") for m in metrics]),
               "step_s": _mean([m.get("time/step") for m in metrics])},
    )


def _f(v: float, digits: int = 3) -> str:
    return "n/a" if v != v else f"{v:.{digits}f}"


def summary_cells(runs: list[RubricRun]) -> tuple[list[str], list[list[str]]]:
    header = ["run", "gold Peak (step)", "gold End", "gold Final", "proxy End", "gap End", "overclaim End",
              "in-domain full (End)"]
    body = [[r.name, f"{_f(r.peak)} ({r.peak_step})", _f(r.end["gold"]), _f(r.final), _f(r.end["proxy"]),
             _f(r.end["gap"]), _f(r.end["overclaim"]), _f(r.train["full_end"])] for r in runs]
    return header, body


def judge_cells(runs: list[Run], window: tuple[int, int] | None = None) -> tuple[list[str], list[list[str]]]:
    """Gold Peak / End / Final per gold judge, side by side: each run's own, then each second gold
    judge that graded the same replies (eval/rubric@LABEL.jsonl)."""
    body = []
    for run in runs:
        for label in [None, *judge_labels(run)]:
            try:
                m = rubric_run(run, window, label)
            except ReportError:
                continue
            name = "the run's gold judge" if label is None else label
            model = next((((r.get("settings") or {}).get("judge") or {}).get("model")
                          for r in evaluation_rows(run, label) if (r.get("settings") or {}).get("judge")), None)
            body.append([run.name, f"{name} ({model})" if model else name, f"{_f(m.peak)} ({m.peak_step})",
                         _f(m.end["gold"]), _f(m.final), _f(m.end["gap"])])
    return ["run", "gold judge", "gold Peak (step)", "gold End", "gold Final", "gap End"], body


def cost_cells(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """Tokens over the whole run per API-backed role (metrics.jsonl's last `tokens/<role>/*_total`)."""
    body = []
    for run in runs:
        rows = run.rows("metrics")
        last = rows[-1] if rows else {}
        roles = sorted({k.split("/")[1] for k in last if k.startswith("tokens/") and k.endswith("_total")})
        for role in roles:
            p, c = (int(last.get(f"tokens/{role}/{k}_total", 0)) for k in ("prompt", "completion"))
            body.append([run.name, role.replace("_", " "), f"{p:,}", f"{c:,}", f"{p + c:,}"])
    return ["run", "role", "prompt tokens", "completion tokens", "total"], body


def wins(run: RubricRun, base: RubricRun) -> tuple[int, int]:
    """(checkpoints where `run`'s gold beats `base`'s, checkpoints both evaluated), steps > 0."""
    theirs = dict(zip(base.steps, base.series["gold"]))
    pairs = [(v, theirs[s]) for s, v in zip(run.steps, run.series["gold"]) if s > 0 and s in theirs]
    return sum(a > b for a, b in pairs), len(pairs)


def matched_cells(runs: list[RubricRun], baseline: int = 0) -> tuple[list[str], list[list[str]]]:
    """Gold per checkpoint (rows: steps), a column per run, and a last row of win counts."""
    steps = sorted({s for r in runs for s in r.steps})
    gold = [dict(zip(r.steps, r.series["gold"])) for r in runs]
    body = [[str(s), *[_f(g.get(s, float("nan"))) for g in gold]] for s in steps]
    base = runs[baseline]
    body.append(["wins vs " + base.name, *["–" if r is base else "{}/{}".format(*wins(r, base)) for r in runs]])
    return ["step", *[r.name for r in runs]], body


def criteria_cells(runs: list[RubricRun]) -> tuple[list[str], list[list[str]]]:
    """Per criterion / tag: proxy / gold met rate at the first evaluation of the first run, then over End per run."""
    keys = list(dict.fromkeys(k for r in runs for k in r.criteria_end))
    first = runs[0].criteria_first
    body = [[k, "{} / {}".format(*(_f(x, 2) for x in first.get(k, (math.nan, math.nan)))),
             *["{} / {}".format(*(_f(x, 2) for x in r.criteria_end.get(k, (math.nan, math.nan)))) for r in runs]]
            for k in keys]
    return ["criterion", f"first eval ({runs[0].name})", *[r.name for r in runs]], body


def anchor_cells(runs: list[RubricRun]) -> tuple[list[str], list[list[str]]]:
    body = [[r.name, _f(r.series["anchor_gold"][0]), _f(r.series["anchor_gold"][-1]),
             _f(max((x for x in r.series["anchor_flips"] if x == x), default=math.nan)),
             f"{_f(r.series['gold'][0])} → {_f(r.series['gold'][-1])}"] for r in runs]
    return ["run", "anchor gold, first", "anchor gold, last", "max flips", "gold on new replies"], body
