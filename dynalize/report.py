"""`python -m dynalize.report RUN [RUN ...] [--html OUT.html]`, `python -m dynalize.report rubric RUN
[RUN ...]` and `python -m dynalize.report audit --penalties A --rollouts B`

The report: Table 1 (benchmark Peak / End / Final, RM over End, Δ from a baseline run) for each
benchmark the runs were evaluated on (else the task's held-out eval, e.g. `eval/task:gold`), the
per-axis table for MindEval, and the figures: RM and benchmark score against step, each run's
penalty buffer timeline, and pattern prevalence (`--starts-with Okay --contains galactic`).
Printed, and written to `--out` (default `<first run>/plots`) as report.md, report.json and PNGs.
With `--html OUT.html`, one self-contained page instead: curves, penalty timelines and a rollout
browser, the runs side by side (dynalize.analysis.html).

The rubric report: for rubric-rewarded runs, the proxy/gold measurement (dynalize.analysis.rubrics):
gold Peak / End / Final with proxy, gap and overclaim, the matched-checkpoint table with win
counts against a baseline run, per-criterion and per-tag met rates under both judges, the
reviewers' anchor check, and a figure of proxy, gold, gap and overclaim against step.

The audit: run A's discovered penalties judged on run B's replies at a step (the same judge:
regex penalties locally, the others by `--judge`): % of replies triggering ≥ 1, mean per reply;
with `--compare OLD`, each of A's penalties matched to OLD's (same regex, or overlapping verdicts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from .analysis.html import ROLLOUT_STEPS, write_html_report
from .analysis.runs import (
    BENCHES,
    Metric,
    ReportError,
    Run,
    default_metrics,
    judge_metrics,
    judge_name,
    parse_metric,
    unique_names,
)
from .analysis.tables import (
    axis_cells,
    axis_table,
    judges_table,
    markdown,
    rich_table,
    table1,
    table1_cells,
)
from .errors import ConfigError
from .runlog import filesystem_problem, is_run_dir, write_text_atomic

console = Console()


# --- report ------------------------------------------------------------------------------------

def parse_report_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.report", description=__doc__.splitlines()[0],
                                 epilog="Rubric runs: python -m dynalize.report rubric --help; "
                                        "audit: python -m dynalize.report audit --help")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directories to compare")
    ap.add_argument("--metric", action="append",
                    help="eqbench, mindeval, eval/<file>:<column> or metrics:<column> (repeatable; "
                         "default: every benchmark evaluated, else eval/task:gold)")
    ap.add_argument("--window", nargs=2, type=int, default=[150, 200], metavar=("LO", "HI"),
                    help="steps averaged for End (inclusive; default 150 200)")
    ap.add_argument("--baseline", help="the run others are compared to (path or name; default the first)")
    ap.add_argument("--rm-metric", default="metrics:rm/mean", help="the RM score column (default metrics:rm/mean)")
    ap.add_argument("--axes", action="store_true", help="per-criterion table for every benchmark, not only mindeval")
    ap.add_argument("--starts-with", action="append", default=[], metavar="WORD",
                    help="pattern plot: share of replies opening with WORD (repeatable)")
    ap.add_argument("--contains", action="append", default=[], metavar="WORD",
                    help="pattern plot: share of replies containing WORD (repeatable)")
    ap.add_argument("--rollouts-kind", default="step", choices=("step", "eval"),
                    help="pattern plot: training rollouts (step) or held-out generations (eval)")
    ap.add_argument("--out", help="output directory (default <first run>/plots)")
    ap.add_argument("--no-plots", action="store_true", help="print the tables only, write no plots")
    ap.add_argument("--html", metavar="OUT.html", help="write one self-contained HTML page instead (curves, penalty "
                    "timelines, a rollout browser; the runs side by side)")
    ap.add_argument("--rollout-steps", type=int, default=ROLLOUT_STEPS, metavar="N",
                    help=f"--html: the page holds the rollouts of N steps of each run, evenly spaced (default {ROLLOUT_STEPS})")
    args = ap.parse_args(argv)
    if args.window[0] > args.window[1]:
        ap.error("--window LO HI needs LO <= HI")
    return args


def output_problem(target: Path, kind: str) -> str | None:
    """Why the report may not write `target` (a file, or a folder it writes into), or None: a
    report never lands on a run's own files, so anything inside a run folder (a training run's or
    a monitor's) is refused except its `plots/` folder and its `report.html`."""
    path = target.resolve()
    for folder in [path, *path.parents]:
        if is_run_dir(folder):
            inside = path.relative_to(folder).parts
            if inside[:1] == ("plots",) or inside == ("report.html",):
                return None
            return (f"{kind} {target} is inside the run {folder}: a report never writes over a run's files; "
                    f"write it elsewhere, or under {folder / 'plots'}")
    return None


def checked_output(target: Path, kind: str) -> Path:
    if problem := output_problem(target, kind):
        raise ReportError(problem)
    return target


def baseline_index(runs: list[Run], spec: str | None) -> int:
    if spec is None:
        return 0
    for i, r in enumerate(runs):
        if spec in (r.name, str(r.path)) or Path(spec).resolve() == r.path.resolve():
            return i
    raise ReportError(f"--baseline {spec!r} is none of the runs given ({', '.join(r.name for r in runs)})")


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Tables and plots for the runs; returns what report.json holds."""
    runs = [Run(p, n) for p, n in zip(args.runs, unique_names(args.runs))]
    out = checked_output(Path(args.out) if args.out else runs[0].path / "plots", "--out")
    base = baseline_index(runs, args.baseline)
    metrics = [parse_metric(m) for m in args.metric] if args.metric else default_metrics(runs)
    rm_metric = parse_metric(args.rm_metric)
    window = (args.window[0], args.window[1])
    out.mkdir(parents=True, exist_ok=True)
    md = ["# dynalize report", "", "Runs: " + ", ".join(f"`{r.name}` ({r.path})" for r in runs), ""]
    result: dict[str, Any] = {"runs": {r.name: str(r.path) for r in runs}, "tables": [], "axes": [], "judges": [],
                              "plots": []}
    for metric in metrics:
        t = table1(runs, metric, window, base, rm_metric)
        header, body = table1_cells(t)
        title = (f"{metric.label}: Peak / End / Final (End = mean over steps {window[0]}–{window[1]}; "
                 f"Δ vs {t.baseline})")
        console.print(rich_table(title, header, body))
        for note in t.notes:
            console.print(f"[yellow]note:[/] {note}")
        md += [f"## {title}", "", markdown(header, body), ""]
        md += [f"- {n}" for n in t.notes] + ([""] if t.notes else [])
        result["tables"].append(t.to_json())
        if metric.column == "score" and (metric.source == "eval/mindeval" or args.axes):
            a = axis_table(runs, metric, window, base)
            if a.axes:
                h, b = axis_cells(a)
                a_title = (f"{metric.label}: per criterion, mean over steps {window[0]}–{window[1]} "
                           f"(Δ vs {a.baseline})")
                console.print(rich_table(a_title, h, b))
                md += [f"## {a_title}", "", markdown(h, b), ""]
                result["axes"].append(a.to_json())
    md += judges_section(runs, metrics, window, base, result)
    if not args.no_plots:
        result["plots"] = [str(p) for p in make_plots(runs, metrics, rm_metric, window, out, args)]
        md += ["## Figures", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in result["plots"]] + [""]
    write_text_atomic(out / "report.md", "\n".join(md))
    write_text_atomic(out / "report.json", json.dumps(result, indent=1, default=str))
    console.print(f"written: {out / 'report.md'}, {out / 'report.json'}"
                  + (f" and {len(result['plots'])} plot(s)" if result["plots"] else ""))
    return result


def judges_section(runs: list[Run], metrics: list[Metric], window: tuple[int, int], base: int,
                   result: dict[str, Any]) -> list[str]:
    """For each benchmark some run judged again (`eval/<bench>@<label>.jsonl`), Peak / End / Final
    per judge side by side (the paper's Table 3): printed, added to `result`, Markdown returned."""
    md: list[str] = []
    for metric in metrics:
        bench = metric.source.removeprefix("eval/")
        judged = judge_metrics(runs, bench) if metric.column == "score" and bench in BENCHES else []
        if len(judged) < 2:
            continue
        names = [judge_name(runs, m) for m in judged]
        header, body, tables = judges_table(runs, judged, names, window, base)
        title = f"{bench}: the same generations under each judge (End = mean over steps {window[0]}–{window[1]})"
        console.print(rich_table(title, header, body))
        md += [f"## {title}", "", markdown(header, body), ""]
        result["judges"].append({"bench": bench, "judges": names, "tables": [t.to_json() for t in tables]})
    return md


def make_plots(runs: list[Run], metrics: list[Metric], rm_metric: Metric, window: tuple[int, int], out: Path,
               args: argparse.Namespace) -> list[Path]:
    from .analysis.patterns import patterns, prevalence
    from .analysis.penalties import penalty_history
    from .analysis.plots import plot_patterns, plot_penalty_timeline, plot_scores
    from .eval.common import progress

    paths = [plot_scores(runs, m, out / f"scores_{m.slug}.png", rm_metric, window) for m in metrics]
    for r in runs:
        history = penalty_history(r)
        if history.penalties:
            paths.append(plot_penalty_timeline(r, history, out / f"penalties_{_slug(r.name)}.png"))
    pats = patterns(args.starts_with, args.contains)
    if pats:
        with progress(console.is_terminal) as bar:
            points = [p for r in runs for p in prevalence(r, pats, args.rollouts_kind, bar)]
        paths.append(plot_patterns(points, out / "patterns.png"))
    return paths


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


# --- rubric ------------------------------------------------------------------------------------

def parse_rubric_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.report rubric",
                                 description="The proxy/gold measurement of rubric-rewarded runs.")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directories to compare")
    ap.add_argument("--window", nargs=2, type=int, metavar=("LO", "HI"),
                    help="steps averaged for End (default: the last quarter of each run's evaluations)")
    ap.add_argument("--baseline", help="the run win counts compare with (path or name; default the first)")
    ap.add_argument("--out", help="output directory (default <first run>/plots)")
    ap.add_argument("--no-plots", action="store_true", help="print the tables only, write no plots")
    args = ap.parse_args(argv)
    if args.window and args.window[0] > args.window[1]:
        ap.error("--window LO HI needs LO <= HI")
    return args


def rubric_report(args: argparse.Namespace) -> dict[str, Any]:
    from .analysis.rubrics import anchor_cells, cost_cells, criteria_cells, judge_cells, judge_labels, matched_cells, \
        rubric_run, summary_cells

    runs = [Run(p, n) for p, n in zip(args.runs, unique_names(args.runs))]
    out = checked_output(Path(args.out) if args.out else runs[0].path / "plots", "--out")
    base = baseline_index(runs, args.baseline)
    window = tuple(args.window) if args.window else None
    measured = [rubric_run(r, window) for r in runs]  # type: ignore[arg-type]
    end = f"steps {window[0]}–{window[1]}" if window else "the last quarter of evaluations"
    sections = [(f"Held-out gold and proxy (End = {end})", summary_cells(measured))]
    if any(judge_labels(r) for r in runs):  # a second gold judge graded the same replies
        sections.append((f"Gold per judge, the same replies (End = {end})", judge_cells(runs, window)))
    sections += [(f"Matched checkpoints: gold per evaluation, wins vs {measured[base].name}",
                  matched_cells(measured, base)),
                 (f"Per criterion and tag: met rate, proxy / gold (End = {end})", criteria_cells(measured)),
                 ("Reviewers' check: gold on the first evaluation's replies, re-graded at every evaluation",
                  anchor_cells(measured))]
    if (cost := cost_cells(runs))[1]:  # API-backed judges: what the run spent
        sections.append(("Judge cost: tokens over the run, per API-backed role", cost))
    out.mkdir(parents=True, exist_ok=True)
    md = ["# dynalize rubric report", "", "Runs: " + ", ".join(f"`{r.name}` ({r.path})" for r in runs), ""]
    for title, (header, body) in sections:
        console.print(rich_table(title, header, body))
        md += [f"## {title}", "", markdown(header, body), ""]
    result: dict[str, Any] = {"runs": [r.__dict__ for r in measured], "plots": []}
    if not args.no_plots:
        from .analysis.plots import plot_rubric

        path = plot_rubric(measured, out / "rubric.png")
        result["plots"].append(str(path))
        md += ["## Figures", "", f"![rubric]({path.name})", ""]
    write_text_atomic(out / "rubric_report.md", "\n".join(md))
    write_text_atomic(out / "rubric_report.json", json.dumps(result, indent=1, default=str))
    console.print(f"written: {out / 'rubric_report.md'}, {out / 'rubric_report.json'}")
    return result


# --- audit -------------------------------------------------------------------------------------

def parse_audit_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.report audit",
                                 description="Judge run A's discovered penalties on run B's replies.")
    ap.add_argument("--penalties", required=True, metavar="RUN_A", help="the run whose penalties are applied")
    ap.add_argument("--rollouts", required=True, nargs="+", metavar="RUN_B", help="the run(s) whose replies are judged")
    ap.add_argument("--step", type=int, help="rollout step to judge (default: each run's last)")
    ap.add_argument("--rollouts-kind", default="step", choices=("step", "eval"),
                    help="training rollouts (step) or held-out generations (eval)")
    ap.add_argument("--which", default="all", choices=("all", "active"),
                    help="every penalty ever added (all) or only those active at the end (active)")
    ap.add_argument("--judge", help="LLM judge for penalties without a regex (JSON or YAML/JSON file)")
    ap.add_argument("--concurrency", type=int, default=16, help="judge calls in flight at once")
    ap.add_argument("--compare", metavar="RUN_OLD",
                    help="also match RUN_A's penalties to RUN_OLD's: both judged on the same replies, a pair "
                         "matches by identical regex or by overlapping verdicts (--match-threshold)")
    ap.add_argument("--match-threshold", type=float, default=0.5,
                    help="--compare: Jaccard overlap of the replies two penalties fire on that makes them one "
                         "(default 0.5)")
    ap.add_argument("--out", help="output directory (default <RUN_A>/plots)")
    return ap.parse_args(argv)


async def run_audit(args: argparse.Namespace) -> tuple[list[Any], list[Any], dict[str, Any] | None]:
    from .analysis.audit import audit, judge_from_spec
    from .analysis.penalties import penalty_history

    source = Run(args.penalties)
    chosen = penalty_history(source).select(args.which)
    if not chosen:
        raise ReportError(f"{source.path} has no {'active ' if args.which == 'active' else ''}penalties "
                          f"(penalties.jsonl or a checkpoint's buffer)")
    judge = judge_from_spec(args.judge, args.concurrency)
    targets = [Run(p, n) for p, n in zip(args.rollouts, unique_names(args.rollouts))]
    results = [await audit(chosen, source.name, t, judge, args.step, args.rollouts_kind) for t in targets]
    matches = await compare_penalties(chosen, Run(args.compare), targets, judge, args) if args.compare else None
    return results, chosen, matches


async def compare_penalties(chosen: list[Any], old_run: Run, targets: list[Run], judge: Any,
                            args: argparse.Namespace) -> dict[str, Any]:
    """`--compare`: RUN_A's penalties matched to RUN_OLD's on the pooled replies of the audited runs."""
    from .analysis.audit import match_penalties, replies_of, rollout_rows
    from .analysis.penalties import penalty_history

    old = penalty_history(old_run).select(args.which)
    if not old:
        raise ReportError(f"{old_run.path} has no penalties to compare with (penalties.jsonl or a checkpoint's buffer)")
    texts: list[str] = []
    contexts: list[str | None] = []
    for t in targets:
        t_texts, t_contexts = replies_of(rollout_rows(t, args.step, args.rollouts_kind)[1])
        texts += t_texts
        contexts += t_contexts
    matches, undecided = await match_penalties(chosen, old, judge, texts, contexts, args.match_threshold)
    return {"old": old_run.name, "replies": len(texts), "undecided": undecided,
            "matches": [m.to_json() for m in matches],
            "not_found_again": [p.id for p in old if not any(m.matched and m.old is p for m in matches)],
            "old_titles": {p.id: p.title for p in old}}


def audit_report(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = checked_output(Path(args.out) if args.out else Path(args.penalties) / "plots", "--out")
    results, chosen, matches = anyio.run(run_audit, args)
    header = ["replies of", "step", "replies", "≥ 1 penalty", "mean per reply", "undecided verdicts"]
    body = [[r.target, str(r.step), str(r.n_replies), f"{100 * r.share_any:.1f}%", f"{r.mean_count:.3f}",
             str(r.undecided)] for r in results]
    title = f"penalties of {results[0].source} ({args.which}: {len(chosen)}) judged on {args.rollouts_kind} rollouts"
    per_header = ["penalty", "regex", *[r.target for r in results]]
    per_body = [[f"{p.id}: {p.title}", "yes" if p.regex else f"detector {p.detector}" if p.detector else "no",
                 *[_rate(r.per_penalty[p.id]["rate"]) for r in results]] for p in chosen]
    console.print(rich_table(title, header, body))
    console.print(rich_table("trigger rate per penalty", per_header, per_body))
    notes = []
    if any(r.undecided for r in results):
        no_regex = sum(1 for p in chosen if not p.regex and not p.detector)
        notes.append(f"{sum(r.undecided for r in results)} verdicts undecided (counted as not triggered)"
                     + (f": {no_regex} penalties have no regex; pass --judge to judge them" if not args.judge else ""))
    md_match = match_tables(results[0].source, matches, notes) if matches else []
    for n in notes:
        console.print(f"[yellow]note:[/] {n}")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"audit_{_slug(results[0].source)}_{args.which}"
    md = [f"# {title}", "", markdown(header, body), "", markdown(per_header, per_body), ""] + md_match
    md += [f"- {n}" for n in notes]
    write_text_atomic(out / f"{stem}.md", "\n".join(md) + "\n")
    rows = [r.to_json() for r in results]
    write_text_atomic(out / f"{stem}.json", json.dumps({"audits": rows, "compare": matches} if matches else rows, indent=1))
    console.print(f"written: {out / (stem + '.md')}, {out / (stem + '.json')}")
    return rows


def match_tables(source: str, m: dict[str, Any], notes: list[str]) -> list[str]:
    """Print the `--compare` tables; return them as Markdown."""
    header = ["penalty of " + source, f"closest of {m['old']}", "overlap (Jaccard)", "fires: new / old / both", "same?"]
    body = [[f"{x['new']}: {x['new_title']}", f"{x['old']}: {x['old_title']}" if x["old"] else "—",
             "n/a" if x["jaccard"] is None else f"{x['jaccard']:.2f}",
             f"{x['new_hits']} / {x['old_hits']} / {x['both']}",
             ("same regex" if x["same_regex"] else "yes") if x["matched"] else "new"] for x in m["matches"]]
    title = f"{source}'s penalties matched to {m['old']}'s on {m['replies']} replies"
    console.print(rich_table(title, header, body))
    gone = [f"{pid}: {m['old_titles'][pid]}" for pid in m["not_found_again"]]
    console.print(f"{m['old']}'s penalties no penalty of {source} matches: " + ("; ".join(gone) or "none"))
    if m["undecided"]:
        notes.append(f"--compare: {m['undecided']} verdicts undecided (counted as not firing)")
    return [f"## {title}", "", markdown(header, body), "",
            f"{m['old']}'s penalties no penalty of {source} matches: " + ("; ".join(gone) or "none"), ""]


def _rate(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


# --- entry point -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "audit":
            audit_report(parse_audit_args(argv[1:]))
        elif argv and argv[0] == "rubric":
            rubric_report(parse_rubric_args(argv[1:]))
        elif (args := parse_report_args(argv)).html:
            runs = [Run(p, n) for p, n in zip(args.runs, unique_names(args.runs))]
            html = checked_output(Path(args.html), "--html")
            console.print(f"written: {write_html_report(runs, html, args.rollout_steps)}")
        else:
            build_report(args)
    except (ReportError, ConfigError, FileNotFoundError) as e:  # ConfigError: a damaged run file (runlog)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if problem := filesystem_problem(e, "nothing was half written: fix the cause and run the report again"):
            print(f"error: {problem}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
