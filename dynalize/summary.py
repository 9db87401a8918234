"""The summary a run prints at its end (and `dynalize.train`'s `RunResult.summary`), and what its
held-out measurement misses."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.table import Table

from .config import RunConfig
from .cost import cost_lines
from .rubrics.protocol import missing_verdicts
from .runlog import RunDir, read_jsonl
from .types import Penalty


def incomplete_measurements(run_dir: Path) -> list[str]:
    """What the run's held-out evaluations miss (a judge's failed verdicts), one line per judge;
    evaluations re-graded complete since (eval/rubric.jsonl) are not missing."""
    run = RunDir(run_dir)
    if not run.eval_path.exists():
        return []
    regraded_path = run.eval_path.parent / "rubric.jsonl"
    regraded = {r.get("step"): bool(r.get("complete")) for r in read_jsonl(regraded_path)} \
        if regraded_path.exists() else {}
    return missing_verdicts(read_jsonl(run.eval_path), regraded)


def summary_rows(history: list[dict[str, Any]], run_dir: Path | None = None,
                 missing: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(metric, first, last) of a run's steps: the rewards, every held-out metric (its first value
    the step-0 evaluation's, read from the run's metrics.jsonl), the totals, the token cost, and
    whether the held-out measurement is complete."""
    eval_keys = dict.fromkeys(k for h in history for k in h if k.startswith("eval/")  # the task's own too
                              and "_met/" not in k)  # not every criterion's met rate
    keys = ["reward/mean", "rm/mean", "rubric/masked", "rubric/full", "gen_len/mean", "loss", *eval_keys,
            "penalties/active"]
    first, last = history[0], history[-1]
    logged = RunDir(run_dir).metrics_path if run_dir is not None else None
    before = [h for h in read_jsonl(logged) if h.get("step") == 0] if logged and logged.exists() else []
    rows = []
    for key in keys:
        evals = [h[key] for h in before + history if key in h and isinstance(h[key], int | float)]
        if evals:
            rows.append((key, f"{evals[0]:.3f}", f"{evals[-1]:.3f}"))
    steps = len(history)
    rows.append(("steps", str(first["step"]), str(last["step"])))
    rows.append(("dropped rollouts (total)", "", str(last["dropped_total"])))
    rows.append(("rollouts left out, unscored (total)", "", str(last.get("left_out_total", 0))))
    for what, failed, of in (("judge: failed verdicts", "judge/failed_verdicts_total", "judge/verdicts_total"),
                             ("proposer: failed proposals", "proposer/failed_total", "proposer/finished_total")):
        if of in last:
            n, total = int(last[failed]), int(last[of])
            rows.append((f"{what} (total)", "", f"{n} of {total} ({n / total:.1%})" if total else "0 of 0"))
    if "proposer/insufficient_total" in last:
        rows.append(("discovery evidence", "", discovery_evidence(last)))
    if "confirm/reward_calls_total" in last:  # a run that confirms candidates with its reward (rewards.rescore)
        rows.append(("confirmation (total)", "", confirmation_cost(last)))
    for role, spent in cost_lines(last):
        rows.append((f"tokens: {role} (total)", "", spent))
    if any("eval/rubric/replies" in h for h in history) or missing:
        rows.append(("held-out measurement", "", "INCOMPLETE: " + "; ".join(missing) if missing else "complete"))
    rows.append(("rollouts/s (mean)", "", f"{statistics.fmean(h['rollouts_per_s'] for h in history):.1f}"))
    rows.append(("step time s (mean)", "", f"{statistics.fmean(h['time/step'] for h in history):.2f} × {steps}"))
    return rows


def discovery_evidence(last: dict[str, Any]) -> str:
    """Whether the run's proposals could have seen a hack: a proposal whose tests lacked the power
    (penalties.proposer.lexical.detectable_effect) found nothing because it could not, which is no
    evidence that nothing was there; the summary never calls that "all clear"."""
    done = int(last.get("proposer/finished_total", 0)) - int(last.get("proposer/failed_total", 0))
    weak = int(last.get("proposer/insufficient_total", 0))
    if done <= 0:
        return "INSUFFICIENT: no proposal finished"
    unnamed = int(last.get("proposer/unnamed_total", 0))
    pays = (f"; UNNAMED PAY in {unnamed} of {done} proposals: the reward pays for something in the replies' form "
            f"that no pattern names yet (penalties.omnibus; the log's proposer.unnamed lines name the features)") if unnamed else ""
    if weak:
        return (f"INSUFFICIENT in {weak} of {done} proposals (too few groups or rollouts, or rewards tied within "
                f"groups){pays}")
    return f"sufficient in all {done} proposals{pays}"


def confirmation_cost(last: dict[str, Any]) -> str:
    """What confirming candidates with the run's reward cost and kept out, over the run."""
    calls, co = int(last.get("confirm/reward_calls_total", 0)), int(last.get("proposer/rejected/co_traveller_total", 0))
    return (f"{calls:,} replies scored by the reward in {last.get('confirm/seconds_total', 0.0):.1f} s (in the "
            f"background); {co} co-traveller{'s' if co != 1 else ''} rejected")


def penalty_rows(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """For a task that plants its hacks (Task.planted_matches: the sandboxes), one row per penalty
    the run added: its title and the planted feature it catches, or that it catches none. Other
    tasks: no rows (nothing to say; the task is not even built)."""
    from .tasks.base import Task, build_task, task_class

    path = RunDir(cfg.run_dir).root / "penalties.jsonl"
    if not path.exists() or task_class(cfg.task.name).planted_matches is Task.planted_matches:
        return []
    added = {e["id"]: e for e in read_jsonl(path) if e.get("event") == "add"}
    penalties = [Penalty(id=i, title=e.get("title", ""), description="", regex=e.get("regex"),
                         detector=e.get("detector")) for i, e in added.items()]
    if not penalties:
        return []
    found = build_task(cfg.task.name, cfg.task.args, cfg.seed).planted_matches(penalties)
    if found is None:
        return []
    title = lambda p: p.title if len(p.title) <= 48 else p.title[:47] + "…"  # noqa: E731
    return [(f"penalty {p.id}: {title(p)}", f"step {added[p.id].get('step', '?')}",
             f"planted {label}" if label else "matches no planted feature") for p, label in zip(penalties, found)]


def confirmation_rows(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """One row per penalty the run added, with what scoring edited replies with the run's reward
    said of it (penalties.confirm), when the run confirmed any; no rows otherwise."""
    from .penalties.confirm import confirmation_text

    path = RunDir(cfg.run_dir).root / "penalties.jsonl"
    added = [e for e in read_jsonl(path) if e.get("event") == "add"] if path.exists() else []
    if not any("confirmation" in e for e in added):
        return []
    return [(f"penalty {e['id']}: {e.get('title', '')[:48]}", f"step {e.get('step', '?')}",
             confirmation_text(e.get("confirmation"))) for e in added]


def summary_table(cfg: RunConfig, history: list[dict[str, Any]], missing: list[str] | None = None) -> Table:
    t = Table(title=f"dynalize run {cfg.name!r}  ({cfg.run_dir})")
    t.add_column("metric")
    t.add_column("first", justify="right")
    t.add_column("last", justify="right")
    for row in [*summary_rows(history, cfg.run_dir, missing), *penalty_rows(cfg), *confirmation_rows(cfg)] \
            if history else []:
        t.add_row(*row)
    return t
