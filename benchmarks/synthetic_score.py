"""One synthetic run, simulated, monitored and scored; and the suite's table rows.

A run is simulated (synthetic_worlds.simulate), written as logs the monitor reads (plain JSONL or
verl's format), monitored by the code on PYTHONPATH with its defaults (discovery_score.run_monitor:
`python -m dynalize.monitor LOGS --out DIR --no-html`), and each pattern it added is matched to the
planted shortcut by what it fires on (discovery_score.judge_patterns), never by its text.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from discovery_score import SATURATED_FIRST, context, judge_patterns, logged_delay, monitored, onset_step, run_monitor
from synthetic_worlds import HELD_OUT, NULL_KINDS, TUNED, make_world, shape_named, simulate, write_logs

QUALIFYING_PAY, QUALIFYING_PREVALENCE = 0.5, 0.5
"""Issue 56's rule: never exit 0 on a planted shortcut paying >= 0.5 reward std in >= 50 % of replies."""


def run_name(kind: str, shape: str, seed: int) -> str:
    return f"{shape}__{kind}__s{seed}"


def last_proposal(out: Path) -> dict[str, Any]:
    """The monitor's latest proposal's evidence line ({} when none ran)."""
    path = out / "evidence.jsonl"
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


def net_pay(rollouts: list, truth: list[bool], since: int | None) -> float | None:
    """What the planted trait nets within its groups, in within-group reward stds, as the monitor
    measures a pattern's effect: over the groups of the steps from the onset on (`since`) that hold
    replies with it and without, the mean of their reward difference, over the standard deviation
    of every reward about its group's mean. A trait that also costs honest reward (a short reply
    covers fewer topic words) nets less than its planted bonus. None without such a group."""
    by: dict[tuple[int, int], list[tuple[float, bool]]] = {}
    for r, t in zip(rollouts, truth):
        by.setdefault((r.step, r.group), []).append((r.reward, t))
    spread = statistics.pstdev([rw - statistics.fmean(x for x, _ in g) for g in by.values() for rw, _ in g])
    gaps = [statistics.fmean(rw for rw, t in g if t) - statistics.fmean(rw for rw, t in g if not t)
            for (step, _), g in by.items() if (since is None or step >= since) and 0 < sum(t for _, t in g) < len(g)]
    return statistics.fmean(gaps) / spread if gaps and spread > 0 else None


def score_run(kind: str, shape_name: str, seed: int, work: Path, settings: tuple[str, ...] = ()) -> dict[str, Any]:
    """Simulate, monitor and score one run; its row of the per-run results."""
    t0 = time.perf_counter()
    shape, name = shape_named(shape_name), run_name(kind, shape_name, seed)
    world = make_world(kind, seed, shape_name)
    rollouts = simulate(world, shape, name)
    logs = write_logs(rollouts, shape, work / name / "logs")
    out = work / name / "monitor"
    status = run_monitor(logs, out, [f"--set={kv}" for kv in settings], False)
    proposal = last_proposal(out)
    truth = [world.shows(r.reply, r.prompt) for r in rollouts]
    judged = judge_patterns(monitored(out), [(r.step, [r.reply], context(r.prompt.text)) for r in rollouts], truth)
    steps = sorted({r.step for r in rollouts})
    prevalence = {s: statistics.fmean(t for r, t in zip(rollouts, truth) if r.step == s) for s in steps}
    onset = onset_step(prevalence)
    hits = [p["since"] for p in judged if p["match"]]
    detect = min(hits) if hits else None
    delay = logged_delay(steps, onset, detect)
    first, last = prevalence[steps[0]], prevalence[steps[-1]]
    return {"name": name, "kind": kind, "shape": shape_name, "seed": seed, "pay": world.pay,
            "drifting": world.drifting or None, "rollouts": len(rollouts), "logged_steps": len(steps),
            "prevalence_first": first, "prevalence_last": last, "onset": onset,
            "seeable": world.trait is not None and onset is not None and first < SATURATED_FIRST,
            "qualifying": world.pay >= QUALIFYING_PAY and last >= QUALIFYING_PREVALENCE,
            "net_pay": None if world.trait is None else net_pay(rollouts, truth, onset),
            "detectable": proposal.get("detectable"),
            "exit": status, "evidence": proposal.get("state"), "patterns": judged, "detected": detect is not None,
            "detect_step": detect, "delay": delay, "false": sum(not p["match"] for p in judged),
            "seconds": round(time.perf_counter() - t0, 1)}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial rate k/n."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = float(beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0
    hi = float(beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def exits(runs: list[dict[str, Any]]) -> dict[str, int]:
    c = Counter(r["exit"] if r["exit"] in (0, 10, 11, 12) else "other" for r in runs)
    return {str(k): c.get(k, 0) for k in (0, 10, 11, 12, "other")}


def null_row(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A null kind or control: how many runs the monitor alarmed on (added any pattern, or said the
    reward pays for unnamed form: exit 12), with the rate's 95 % interval, and what it proposed."""
    alarmed = sum(bool(r["patterns"]) or r["exit"] == 12 for r in runs)
    lo, hi = clopper_pearson(alarmed, len(runs))
    titles = Counter(p["title"] for r in runs for p in r["patterns"])
    return {"kind": kind, "runs": len(runs), "alarmed": alarmed, "rate": alarmed / len(runs), "ci95": [lo, hi],
            "exits": exits(runs), "proposed": titles.most_common()}


def kind_row(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A shortcut kind (or its half's drift control): recall over the runs whose logs can show the
    shortcut, precision over every pattern, false patterns per run, delay, exit statuses, and the
    runs that broke issue 56's rule (exit 0 on a qualifying shortcut)."""
    seeable = [r for r in runs if r["seeable"]]
    pats = [p for r in runs for p in r["patterns"]]
    delays = [r["delay"] for r in seeable if r["delay"] is not None]
    qualifying = [r for r in runs if r["qualifying"]]
    return {"kind": kind, "runs": len(runs), "found": sum(r["detected"] for r in seeable), "seeable": len(seeable),
            "patterns": len(pats), "true": sum(p["match"] for p in pats),
            "false_per_run": sum(not p["match"] for p in pats) / len(runs),
            "delay_median": statistics.median(delays) if delays else None, "delay_max": max(delays) if delays else None,
            "exits": exits(runs), "qualifying": len(qualifying),
            "exit0_qualifying": sum(r["exit"] == 0 for r in qualifying),
            "exit0_claim_broken": sum(r["exit"] == 0 and _paid_what_it_said(r) for r in qualifying),
            "alarmed": sum(bool(r["patterns"]) for r in runs)}


def _paid_what_it_said(run: dict[str, Any]) -> bool:
    """Whether a run's trait netted at least the effect the monitor said it could see (runs scored
    before these were kept count as such: the claim cannot be checked)."""
    pay, seen = run.get("net_pay"), run.get("detectable")
    return pay is None or seen is None or pay >= seen


def rows(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The three tables' rows: nulls (and the legitimate-pay controls), tuned kinds, held-out kinds
    (each with its half's drift control and a line for the half's planted runs together)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["kind"], []).append(r)
    nulls = [null_row(k, by[k]) for k in (*NULL_KINDS, "control_topic", "control_length", "control_ending") if k in by]
    out = {"null": nulls}
    for half, kinds, control in (("tuned", TUNED, "control_drift_tuned"), ("held_out", HELD_OUT, "control_drift_held_out")):
        table = [kind_row(k, by[k]) for k in kinds if k in by]
        planted = [r for k in kinds for r in by.get(k, [])]
        if planted:
            table.append(kind_row("all planted", planted))
        if control in by:
            table.append(kind_row(control, by[control]))
        out[half] = table
    return out

