"""Calibration and held-out discovery worlds (issue 55 point 4, issue 56 point 3): does the monitor
stay quiet when the reward pays for nothing wrong, and find shortcuts of kinds nobody tuned it on?

    python benchmarks/discovery_synthetic.py [--jobs N] [--results FILE.jsonl] [--json OUT] [--markdown MD] [--set K=V ...]
    python benchmarks/discovery_synthetic.py --quick        # CI: 5 small runs, the three tables

No model trains: a simulated policy (synthetic_policy.py) writes replies from templates, its styles
drifting over steps as RL would make them; each world's reward (synthetic_worlds.py) pays what it
says. Each run is written as logs (plain JSONL, or verl's format) and monitored by
`python -m dynalize.monitor LOGS --out DIR --no-html` with the defaults of the code on PYTHONPATH
(synthetic_score.py). Printed: the null table (per null kind: runs, runs alarmed, false-alarm rate
with its 95 % Clopper-Pearson interval, exit statuses, what was proposed), then the tuned kinds'
table and the held-out kinds' table (recall, precision, false patterns per run, delay, exit
statuses, and exit 0 on a shortcut paying >= 0.5 std in >= 50 % of replies).

`--results FILE.jsonl` keeps each scored run as a line and skips the runs already there, so a long
suite can be stopped and continued; the tables are printed from every run in the file that the
plan holds. Runs are taken in rounds that give every kind one run before any kind has two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_worlds import CONTROL_KINDS, HELD_OUT, NULL_KINDS, PAYS, PREVALENCE, QUICK_SHAPE, SHAPES, TUNED  # noqa: E402

ALL_KINDS = (*NULL_KINDS, *TUNED, *HELD_OUT, *CONTROL_KINDS)
QUICK_KINDS = ("noise", "topic", TUNED[0], HELD_OUT[0], "control_drift_held_out")


def plan(kinds: tuple[str, ...], shapes: list[str], null_seeds: int, seeds: int) -> list[tuple[str, str, int]]:
    """(kind, shape, seed) of every run: null kinds on `null_seeds` seeds, the others on `seeds`, in
    rounds: within a seed, pass j runs kind i on shape (i + j) mod len(shapes)."""
    out = []
    for seed in range(max(null_seeds, seeds)):
        ks = [k for k in kinds if seed < (null_seeds if k in NULL_KINDS else seeds)]
        for j in range(len(shapes)):
            out += [(k, shapes[(i + j) % len(shapes)], seed) for i, k in enumerate(ks)]
    return out


def _score(job: tuple[str, str, int, str, tuple[str, ...]]) -> dict[str, Any]:
    from synthetic_score import score_run

    kind, shape, seed, work, settings = job
    return score_run(kind, shape, seed, Path(work), settings)


def run_all(jobs_list: list[tuple[str, str, int]], settings: tuple[str, ...], jobs: int, sink, console,
            ident: dict[str, Any]) -> list[dict]:
    """Score every run (in `jobs` processes), each result (stamped `run_with` = ident) appended to
    `sink` (a file) as it comes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="discovery-synthetic-") as tmp, \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=console, transient=True) as bar:
        task = bar.add_task("monitoring synthetic runs", total=len(jobs_list))
        work = [(k, s, seed, tmp, settings) for k, s, seed in jobs_list]
        if jobs > 1:
            pool = ProcessPoolExecutor(jobs)
            results = pool.map(_score, work)
        else:
            pool, results = None, map(_score, work)
        try:
            for r in results:
                r["run_with"] = ident
                done.append(r)
                if sink is not None:
                    sink.write(json.dumps(r) + "\n")
                    sink.flush()
                bar.advance(task)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    return done


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI: five small runs (two nulls, a tuned and a held-out "
                    "kind, a drift control) and the three tables")
    ap.add_argument("--kinds", default=",".join(ALL_KINDS), help="kinds to run (default: all)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"shapes (known: {', '.join(SHAPES)})")
    ap.add_argument("--null-seeds", type=int, default=6, help="seeds per null kind and shape (default 6: 42 runs a kind)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per shortcut kind or control and shape (default 2)")
    ap.add_argument("--jobs", type=int, default=1, help="runs monitored at once, each in its own process (default 1)")
    ap.add_argument("--results", type=Path, help="a JSONL file of scored runs: continued (runs there are skipped) "
                    "and appended to")
    ap.add_argument("--tables-only", action="store_true", help="monitor nothing: print the tables of the planned "
                    "runs already in --results")
    ap.add_argument("--json", type=Path, help="write every run and the table rows here")
    ap.add_argument("--markdown", type=Path, help="also write the three tables as markdown here (for the docs)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a penalty setting given to the monitor (its --set), to try other defaults (repeatable)")
    args = ap.parse_args(argv)
    bad = [k for k in args.kinds.split(",") if k not in ALL_KINDS]
    if bad:
        ap.error(f"unknown kind(s) {', '.join(bad)} (known: {', '.join(ALL_KINDS)})")
    bad = [s for s in args.shapes.split(",") if s not in SHAPES]
    if bad:
        ap.error(f"unknown shape(s) {', '.join(bad)} (known: {', '.join(SHAPES)})")
    if args.tables_only and args.results is None:
        ap.error("--tables-only reads --results FILE.jsonl")
    if args.jobs < 1 or args.null_seeds < 0 or args.seeds < 0:
        ap.error("--jobs must be >= 1, --null-seeds and --seeds >= 0")
    return args


def read_results(path: Path | None) -> dict[str, dict]:
    """Runs already scored in `path` (by name); a torn last line (an interrupted write) is left out."""
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[r["name"]] = r
    return out


def code_identity(settings: list[str]) -> dict[str, Any]:
    """What a run was scored with: the dynalize package imported, its last commit and whether its
    files differ from it (a git checkout), and the --set settings. Runs of another identity in
    --results are refused, never mixed in."""
    import subprocess

    import dynalize

    pkg = Path(dynalize.__file__).resolve().parent

    def git(*a: str) -> str:
        done = subprocess.run(["git", "-C", str(pkg), *a, "--", "."], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"dynalize": str(pkg), "commit": git("log", "-1", "--format=%H") or None,
            "dirty": bool(git("status", "--porcelain")), "settings": sorted(settings)}


def main(argv=None) -> int:
    from rich.console import Console

    from discovery_score import MonitorFailed
    from synthetic_score import rows, run_name
    from synthetic_tables import markdown, print_tables

    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.quick:
        todo = [(k, QUICK_SHAPE.name, 0) for k in QUICK_KINDS]
    else:
        todo = plan(tuple(args.kinds.split(",")), args.shapes.split(","), args.null_seeds, args.seeds)
    before = read_results(args.results)
    wanted = {run_name(k, s, seed) for k, s, seed in todo}
    ident = code_identity(args.settings)
    others = {json.dumps(r.get("run_with"), sort_keys=True) for n, r in before.items() if n in wanted}
    if args.tables_only:
        console.print("scored with: " + "; ".join(sorted(others)), markup=False, highlight=False)
    elif others - {json.dumps(ident, sort_keys=True)}:
        console.print(f"discovery_synthetic: {args.results} holds runs scored with other code or settings "
                      f"({'; '.join(sorted(others))}); this is {json.dumps(ident)}: use another --results file",
                      markup=False, highlight=False)
        return 2
    missing = [] if args.tables_only else [t for t in todo if run_name(*t) not in before]
    console.print(f"{len(todo)} run(s) planned, {len(todo) - len(missing)} already in {args.results}"
                  if args.results else f"{len(todo)} run(s) planned")
    t0 = time.perf_counter()
    sink = open(args.results, "a") if args.results and missing else None
    try:
        new = run_all(missing, tuple(args.settings), args.jobs, sink, console, ident)
    except MonitorFailed as e:
        console.print(f"discovery_synthetic: {e}", markup=False, highlight=False)
        return 2
    finally:
        if sink is not None:
            sink.close()
    runs = [r for r in before.values() if r["name"] in wanted] + new
    if not runs:
        console.print("discovery_synthetic: no scored run to print (none planned is in --results)")
        return 2
    scores = {"runs": runs, "rows": rows(runs), "settings": args.settings, "split": {"tuned": TUNED, "held_out": HELD_OUT},
              "pays": PAYS, "prevalence": PREVALENCE, "planned": len(todo)}
    print_tables(scores, console)
    console.print(f"{len(new)} run(s) monitored in {time.perf_counter() - t0:.0f}s "
                  f"({len(runs)} of {len(todo)} planned in the tables; load {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps(scores, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
