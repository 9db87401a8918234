"""Discovery benchmark (issue 43): does LLM-free hack discovery find planted shortcuts in real runs
of many shapes, and stay quiet on honest ones?

    python benchmarks/discovery.py --runs DIR [--generate] [--shapes A,B] [--kinds K,...] [--json OUT]
    python benchmarks/discovery.py --quick            # CI: 2 tiny TRL runs, generated and scored

Corpus (benchmarks/discovery_runs.py, worlds in benchmarks/discovery_worlds.py): TRL GRPOTrainer
and dynalize runs of the tiny pre-trained sandbox policy, at several shapes (prompts x generations,
logging cadence, multi-turn), each with exactly one planted shortcut of seven kinds (word, phrase,
opener, closer, length step, length ramp, degenerate collapse) or none (control: the honest reward
pays for topic words and moderate length only). `--generate` trains the runs missing from DIR, one at
a time, each in a `nice` subprocess (the expensive part; cached in DIR). Without it DIR is only
scored (seconds to a minute), so defaults can be chosen by rerunning the scoring.

Scored, per run (benchmarks/discovery_score.py), with the code on PYTHONPATH:

- `monitor`: `python -m dynalize.monitor LOGS --out TMP --no-html`, defaults (no --config/--set);
- `proposer`: the in-run proposer at PenaltiesConfig's defaults: a dynalize run's own
  penalties.jsonl (or, with --replay-proposer, the replay below); on a TRL run, the same monitor
  replay with the view sizes set back to PenaltiesConfig's defaults (what dynalize would have
  proposed in that run).

A discovered pattern matches the planted shortcut by behaviour, never by its text: over the run's
logged replies it must fire on at least MATCH_COVER of the replies showing the shortcut and at least
MATCH_LIFT times as often as on those without. Printed: recall per kind, precision and false patterns
per run, false alarms on the controls, detection delay (logged steps from the first logged step where
the shortcut is in >= 20 % of replies to the step its first matching pattern entered).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from discovery_runs import META, finished  # noqa: E402
from discovery_score import METHODS  # noqa: E402
from discovery_worlds import KINDS, QUICK_SHAPE, SHAPES, plan  # noqa: E402

HERE = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """The environment of the training and monitor subprocesses: this one's (PYTHONPATH included, so
    the code scored is the caller's), one torch thread."""
    return os.environ | {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def generate(specs, root: Path, console) -> None:
    """Train each spec missing from `root` (no meta.json), one at a time, niced; logs in root/NAME.log."""
    root.mkdir(parents=True, exist_ok=True)
    done = {m["name"] for m in finished(root)}
    todo = [s for s in specs if s.name not in done]
    console.print(f"[bold]generate[/]: {len(todo)} run(s) to train into {root} ({len(done)} there already)")
    for i, spec in enumerate(todo, 1):
        t0 = time.perf_counter()
        with open(root / f"{spec.name}.log", "w") as log:
            rc = subprocess.run(["nice", "-n", "10", sys.executable, str(HERE / "discovery_runs.py"),
                                 json.dumps(spec.to_dict()), str(root)], stdout=log, stderr=subprocess.STDOUT,
                                env=child_env()).returncode
        state = "done" if rc == 0 and (root / spec.name / META).exists() else f"FAILED (exit {rc}, see log)"
        console.print(f"  [{i}/{len(todo)}] {spec.name}: {state} in {time.perf_counter() - t0:.0f}s")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, help="the corpus folder (read; with --generate also written)")
    ap.add_argument("--generate", action="store_true", help="train the runs missing from --runs first")
    ap.add_argument("--score-only", action="store_true", help="only score --runs (the default without --generate)")
    ap.add_argument("--quick", action="store_true", help="CI: 2 tiny TRL runs (a word shortcut and a control), "
                    "generated into --runs (default: a temporary folder) and scored")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"shapes to generate and score (known: {', '.join(SHAPES)})")
    ap.add_argument("--kinds", default=",".join((*KINDS, "control")), help="kinds to generate and score")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subprocess", action="store_true", help="score by running `python -m dynalize.monitor` "
                    "as a command per run (slower; default: its main() in this process, the same code)")
    ap.add_argument("--replay-proposer", action="store_true",
                    help="score the in-run proposer on dynalize runs by replaying their logs with this code's in-run "
                         "defaults (default: the runs' own penalties.jsonl, written by the code they trained with)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"methods to score (known: {', '.join(METHODS)})")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a penalty setting given to every method (the monitor's --set), to try other "
                         "defaults on the same corpus (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the scores (per run and per table row) here")
    args = ap.parse_args(argv)
    bad_methods = [m for m in args.methods.split(",") if m not in METHODS]
    if bad_methods:
        ap.error(f"unknown method(s) {', '.join(bad_methods)} (known: {', '.join(METHODS)})")
    if not args.quick and args.runs is None:
        ap.error("--runs DIR is required (or --quick)")
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    bad = [k for k in args.kinds.split(",") if k not in (*KINDS, "control")]
    if bad:
        ap.error(f"unknown kind(s) {', '.join(bad)} (known: {', '.join((*KINDS, 'control'))})")
    return args


def main(argv=None) -> int:
    import tempfile

    from rich.console import Console

    from discovery_score import MonitorFailed, print_tables, score_corpus

    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 150)  # a log or CI: the tables unwrapped
    tmp = None
    if args.quick:
        if args.runs is None:
            tmp = tempfile.TemporaryDirectory(prefix="discovery-quick-")
            args.runs = Path(tmp.name)
        specs = plan([QUICK_SHAPE], ("word", "control"), args.seed)
        args.generate = True
    else:
        specs = plan([SHAPES[s] for s in args.shapes.split(",")], tuple(args.kinds.split(",")), args.seed)
    if args.generate:
        t0 = time.perf_counter()
        generate(specs, args.runs, console)
        console.print(f"generation took {time.perf_counter() - t0:.0f}s")
    elif not args.runs.is_dir():
        console.print(f"discovery: no such corpus folder: {args.runs} (make one with --generate)")
        return 2
    t0 = time.perf_counter()
    try:
        scores = score_corpus(args.runs, console, args.subprocess, None if args.quick else set(args.shapes.split(",")),
                              set(args.kinds.split(",")), args.replay_proposer, tuple(args.methods.split(",")),
                              args.settings)
    except MonitorFailed as e:
        console.print(f"\ndiscovery: {e}", markup=False, highlight=False)
        return 2
    if not scores["runs"]:
        console.print(f"discovery: {args.runs} holds no finished run (meta.json); make them with --generate")
        return 2
    print_tables(scores, console)
    console.print(f"scoring took {time.perf_counter() - t0:.1f}s over {len(scores['runs'])} run(s)")
    if args.json:
        args.json.write_text(json.dumps(scores, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
