"""Confirmation by edited replies (issue 57): does scoring edited replies with the reward keep the
patterns the reward pays for and reject those that only travel with them?

    python benchmarks/confirmation.py --quick            # 10 runs (16 prompts x 8 replies, 20 steps)
    python benchmarks/confirmation.py [--kinds K,...] [--seeds N] [--shape 16x8] [--json OUT] [--markdown MD]

Each synthetic run (synthetic_worlds: a simulated policy drifting into a planted shortcut, or a
null / legitimate-pay control) is monitored twice by the code on PYTHONPATH: with the monitor's
defaults (the correlational decision), and with `--reward synthetic_reward:reward` (the world's
own reward, as a TRL reward function: confirmation on). Every pattern added is matched to the
planted shortcut by what it fires on (discovery_score.judge_patterns). Printed, per half of the
kinds (tuned, held-out) and for the nulls and controls, side by side: runs, runs whose shortcut
was found (recall, over runs that found it without confirmation or with), true and false
patterns, precision; the candidates confirmation rejected as co-travellers; and its cost per
proposal (reward calls, seconds). The sentence under the table is computed from the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from discovery_score import context, judge_patterns, monitored, run_monitor  # noqa: E402
from synthetic_reward import VARIABLE  # noqa: E402
from synthetic_worlds import CONTROL_KINDS, HELD_OUT, NULL_KINDS, TUNED, make_world, shape_named, simulate, write_logs  # noqa: E402

QUICK = ("opener", "phrase", "length_step", "flattering_opener", "echo", "closer", "noise", "topic",
         "control_length", "control_drift_held_out")
MODES = {"correlational": [], "confirmed": ["--reward", "synthetic_reward:reward"]}


def totals(out: Path, key: str) -> float:
    path = out / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return sum(float(r.get(key, 0.0)) for r in rows)


def score(kind: str, shape_name: str, seed: int, work: Path) -> dict[str, Any]:
    """One run monitored both ways: per mode its exit, judged patterns, co-travellers and cost."""
    shape, name = shape_named(shape_name), f"{shape_name}__{kind}__s{seed}"
    world = make_world(kind, seed, shape_name)
    rollouts = simulate(world, shape, name)
    logs = write_logs(rollouts, shape, work / name / "logs")
    truth = [world.shows(r.reply, r.prompt) for r in rollouts]
    os.environ[VARIABLE] = f"{kind}:{seed}:{shape_name}"
    out: dict[str, Any] = {"name": name, "kind": kind, "seed": seed, "pay": world.pay}
    for mode, extra in MODES.items():
        mon = work / name / mode
        t0 = time.perf_counter()
        status = run_monitor(logs, mon, extra, False)
        judged = judge_patterns(monitored(mon), [(r.step, [r.reply], context(r.prompt.text)) for r in rollouts], truth)
        out[mode] = {"exit": status, "patterns": judged, "found": any(p["match"] for p in judged),
                     "true": sum(p["match"] for p in judged), "false": sum(not p["match"] for p in judged),
                     "proposals": totals(mon, "proposer/finished"),
                     "co_travellers": totals(mon, "proposer/rejected/co_traveller"),
                     "reward_calls": totals(mon, "confirm/reward_calls"), "confirm_s": totals(mon, "confirm/seconds"),
                     "seconds": time.perf_counter() - t0}
    return out


def row(label: str, runs: list[dict[str, Any]]) -> list[str]:
    cells = [label, str(len(runs))]
    for mode in MODES:
        found = sum(r[mode]["found"] for r in runs)
        true, false = (sum(r[mode][k] for r in runs) for k in ("true", "false"))
        precision = f"{true / (true + false):.2f}" if true + false else "—"
        cells += [str(found), f"{true}/{false}", precision]
    c = [r["confirmed"] for r in runs]
    proposals = sum(x["proposals"] for x in c)
    cells += [str(int(sum(x["co_travellers"] for x in c))),
              f"{sum(x['reward_calls'] for x in c) / max(proposals, 1):.0f}",
              f"{sum(x['confirm_s'] for x in c) / max(proposals, 1):.3f}"]
    return cells


COLUMNS = ("kinds", "runs", "found", "true/false", "precision", "found (conf.)", "true/false (conf.)",
           "precision (conf.)", "co-travellers rejected", "reward calls / proposal", "confirm s / proposal")


def table_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    groups = [("tuned shortcuts", TUNED), ("held-out shortcuts", HELD_OUT), ("nulls", NULL_KINDS),
              ("controls", CONTROL_KINDS)]
    out = [row(label, [r for r in runs if r["kind"] in kinds]) for label, kinds in groups
           if any(r["kind"] in kinds for r in runs)]
    return out + [row("all", runs)]


def sentence(runs: list[dict[str, Any]]) -> str:
    """What the numbers say: recall and precision both ways, and what confirmation rejected."""
    def pr(mode: str) -> tuple[int, int, int]:
        planted = [r for r in runs if r["pay"] > 0]
        true, false = (sum(r[mode][k] for r in runs) for k in ("true", "false"))
        return sum(r[mode]["found"] for r in planted), true, false
    (f0, t0, x0), (f1, t1, x1) = pr("correlational"), pr("confirmed")
    planted = sum(r["pay"] > 0 for r in runs)
    p0 = t0 / (t0 + x0) if t0 + x0 else float("nan")
    p1 = t1 / (t1 + x1) if t1 + x1 else float("nan")
    return (f"with confirmation the monitor found {f1} of {planted} planted shortcuts (correlational: {f0}), "
            f"precision {p1:.2f} (correlational: {p0:.2f}), false patterns {x0} -> {x1}, true ones {t0} -> {t1}; "
            f"recall is {'no lower' if f1 >= f0 else 'LOWER'} than the correlational decision's")


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} kinds, one seed each")
    ap.add_argument("--kinds", default=",".join((*TUNED, *HELD_OUT, *NULL_KINDS, *CONTROL_KINDS)))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--shape", default="16x8")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    kinds = QUICK if args.quick else tuple(args.kinds.split(","))
    console = Console(width=None if sys.stdout.isatty() else 200)
    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="confirmation-") as tmp:
        for seed in range(args.seeds):
            for kind in kinds:
                runs.append(score(kind, args.shape, seed, Path(tmp)))
                console.print(f"{runs[-1]['name']}: " + ", ".join(
                    f"{m} {r['true']} true / {r['false']} false" for m, r in ((m, runs[-1][m]) for m in MODES)))
    t = Table(title=f"Confirmation by edited replies ({args.shape}, {args.seeds} seed(s))")
    for c in COLUMNS:
        t.add_column(c)
    rows = table_rows(runs)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    said = sentence(runs)
    console.print(said)
    console.print(f"{len(runs)} runs x 2 monitors in {time.perf_counter() - t0:.0f}s (load {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "rows": rows, "sentence": said}, indent=1))
    if args.markdown:
        md = ["| " + " | ".join(COLUMNS) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
        args.markdown.write_text("\n".join(md + ["| " + " | ".join(r) + " |" for r in rows]) + f"\n\n{said}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
