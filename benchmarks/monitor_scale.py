"""How `python -m dynalize.monitor` scales with the run it reads: rollouts per CPU-second, peak
memory and the growth exponent of its CPU time, one-off and with `--follow` while steps are appended.

    python benchmarks/monitor_scale.py [--quick] [--sizes 10000,100000,1000000] [--follow-sizes ...]
                                       [--against CHECKOUT] [--keep DIR] [--json FILE]

Each size is a synthetic plain-JSONL log of 64 prompts x 16 rollouts a step (a verl or OpenRLHF
batch of 1,024), as many steps as the size needs. Two patterns are planted: a shortcut (replies
that open with "Certainly!" get +1 reward; its share grows from 5 % to 60 % over the first third
of the run) and a control (the phrase "as a matter of fact" in a fifth of the replies, unpaid).
The monitor runs in a subprocess with its defaults (lexical proposer, regex judge); its CPU time
(user + system) and peak resident memory come from the kernel's accounting of that process
(`os.wait4`), so the machine's other load slows the wall clock, not these figures (much).

A `--follow` run starts on the log's first steps and polls it (`--poll 0.2`) while the benchmark
appends the rest a chunk at a time, each chunk once the monitor caught up with the previous one;
it is stopped with Ctrl-C (SIGINT) after the last step is monitored.

Printed: per size, the rows, the monitor's CPU seconds, rollouts per CPU-second, peak RSS, wall
seconds and the verdicts (the shortcut found and live at the end; the control never proposed); the
growth exponent (the slope of log CPU seconds against log rows, least squares over the sizes), and
a line per target of the issue (>= 10,000 rollouts per CPU-second at the largest size, exponent
<= 1.1, peak memory flat in the run's length: within 10 %) saying met or not met from these numbers. `--quick`
runs 10^4 rows only (one-off and following): the CI-sized check that the table is produced.
`--against CHECKOUT` runs each one-off size with another version's code too, in the same run, and
prints the ratio of rollouts per CPU-second and whether the verdicts are the same.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, PER_PROMPT = 64, 16
SHORTCUT, CONTROL = "Certainly!", "as a matter of fact"
RATE_TARGET, EXPONENT_TARGET = 10_000, 1.1
FLAT = 1.1
"""Peak memory counts as independent of the run's length when the largest size's is within 10 % of
the smallest's (the proposer's window is the same at every size; the log is not)."""
WORDS = ("the a of to and in is it that for on with as was at by this be from or have an they which one you were "
         "all we can her has there").split() + [f"w{i}" for i in range(3000)]
CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) ** 1.05 for rank in range(len(WORDS))))
"""Zipf's law over the vocabulary (stop words the most frequent), as in written text: the number
of distinct n-grams a proposal tests, what its cost depends on, is that of real replies."""


def step_rows(step: int, steps: int, rng: random.Random) -> list[dict]:
    """One step: 64 prompts x 16 replies, the shortcut paid, the control not."""
    share = 0.05 + 0.55 * min(1.0, step / max(1, steps // 3))
    rows = []
    for g in range(PROMPTS):
        topic = WORDS[30 + (g * 7 + step) % 3000]
        for _ in range(PER_PROMPT):
            words = rng.choices(WORDS, cum_weights=CUMULATIVE, k=rng.randint(20, 60))
            if rng.random() < 0.2:
                at = rng.randint(1, len(words) - 1)
                words[at:at] = CONTROL.split()
            hacked = rng.random() < share
            text = (SHORTCUT + " " if hacked else "") + " ".join(words) + "."
            rows.append({"step": step, "prompt": f"Question {g} at step {step}: tell me about {topic}.",
                         "completion": text, "reward": round(rng.gauss(0.0, 1.0) + (1.0 if hacked else 0.0), 6)})
    return rows


def write_log(path: Path, steps: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for s in range(steps):
            f.writelines(json.dumps(r) + "\n" for r in step_rows(s, steps, rng))


@dataclass
class Measured:
    mode: str
    rows: int
    steps: int
    cpu_s: float
    wall_s: float
    peak_rss_mb: float
    exit: int
    shortcut_live: bool
    shortcut_since: int | None
    control_proposed: bool

    @property
    def rate(self) -> float:
        return self.rows / self.cpu_s if self.cpu_s > 0 else math.inf


def monitor_cmd(log: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dynalize.monitor", str(log), "--out", str(out), "--no-html", *extra]


STOP_WAIT_S = 300
"""How long a monitor may take to stop after Ctrl-C before the benchmark kills it and says so."""


def _interruptible() -> None:
    """In the monitor's process, before it starts: Ctrl-C stops it, even where the benchmark itself
    was started in the background by a shell (which starts such jobs with SIGINT ignored, and a
    child inherits that; Python then never turns SIGINT into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A monitor subprocess and the kernel's accounting of it (`os.wait4`): CPU seconds (user +
    system) and peak resident memory, whatever else the machine runs."""

    def __init__(self, cmd: list[str], log: Path, root: Path = ROOT):
        with open(log, "w", encoding="utf-8") as err:  # the monitor's own lines, for a look afterwards
            self.proc = subprocess.Popen(cmd, cwd=root, env=_env(root), stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=_interruptible)
        self.usage: tuple[int, float, float] | None = None

    def running(self) -> bool:
        if self.usage is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self._done(status, usage)
        return self.usage is None

    def _done(self, status: int, usage) -> None:
        self.usage = (os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)

    def wait(self) -> tuple[int, float, float]:
        """(exit status, CPU seconds, peak RSS in MB)."""
        if self.usage is None:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self._done(status, usage)
        assert self.usage is not None
        return self.usage


def verdicts(out: Path) -> tuple[bool, int | None, bool]:
    """(shortcut live at the end, the step it was found since, control ever proposed)."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    shortcut = [p for p in summary["patterns"] if SHORTCUT.lower() in p["title"].lower()]
    control = [p for p in summary["patterns"] if any(w in p["title"].lower() for w in ("matter", "fact"))]
    return any(p["live"] for p in shortcut), min((p["since"] for p in shortcut), default=None), bool(control)


def one_off(log: Path, out: Path, rows: int, steps: int, root: Path = ROOT, mode: str = "one-off") -> Measured:
    """The monitor (the code at `root`) over the whole log in one invocation."""
    t0 = time.perf_counter()
    code, cpu, rss = Child(monitor_cmd(log, out), out.with_suffix(".log"), root).wait()
    return Measured(mode, rows, steps, cpu, time.perf_counter() - t0, rss, code, *verdicts(out))


def following(full: Path, out: Path, rows: int, steps: int, chunks: int) -> Measured:
    """The monitor following a log the benchmark appends to, `chunks` appends in all."""
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    per_step = PROMPTS * PER_PROMPT
    cuts = sorted({max(1, round(steps * (k + 1) / chunks)) for k in range(chunks)})
    log = out.parent / f"growing_{rows}.jsonl"
    log.write_text("".join(lines[:cuts[0] * per_step]), encoding="utf-8")
    t0 = time.perf_counter()
    proc = Child(monitor_cmd(log, out, "--follow", "--poll", "0.2"), out.with_suffix(".log"))
    for before, cut in zip(cuts, cuts[1:]):
        _wait(out, before - 1, proc)  # the newest step waits for a later one (or a quiet poll)
        with open(log, "a", encoding="utf-8") as f:
            f.writelines(lines[before * per_step:cut * per_step])
    _wait(out, steps, proc)  # the last step, once the file stayed quiet over a poll
    if proc.running():
        proc.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_WAIT_S
        while proc.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.running():
            proc.proc.kill()
            proc.wait()
            tail = out.with_suffix(".log").read_text(encoding="utf-8", errors="replace")[-1500:]
            raise SystemExit(f"monitor_scale: the --follow monitor did not stop within {STOP_WAIT_S} s of Ctrl-C "
                             f"(killed); the end of its lines:\n{tail}")
    code, cpu, rss = proc.wait()
    return Measured("follow", rows, steps, cpu, time.perf_counter() - t0, rss, code, *verdicts(out))


def _wait(out: Path, steps: int, proc: Child) -> None:
    """Until the monitor at `out` monitored `steps` steps (or stopped)."""
    while _monitored(out) < steps and proc.running():
        time.sleep(0.05)


def _monitored(out: Path) -> int:
    path = out / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _env(root: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def exponent(points: list[Measured]) -> float | None:
    """The least-squares slope of log CPU seconds against log rows (None with fewer than two sizes)."""
    if len({p.rows for p in points}) < 2:
        return None
    xs, ys = [math.log(p.rows) for p in points], [math.log(p.cpu_s) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def table(results: list[Measured]) -> str:
    head = (f"{'mode':8} {'rows':>9} {'steps':>6} {'CPU s':>8} {'rollouts/CPU-s':>15} {'peak RSS MB':>12} "
            f"{'wall s':>8} {'exit':>5}  verdicts")
    lines = [head, "-" * len(head)]
    for r in results:
        found = f"shortcut live since step {r.shortcut_since}" if r.shortcut_live else "shortcut NOT live"
        lines.append(f"{r.mode:8} {r.rows:9,} {r.steps:6} {r.cpu_s:8.1f} {r.rate:15,.0f} {r.peak_rss_mb:12.0f} "
                     f"{r.wall_s:8.1f} {r.exit:5}  {found}; control {'PROPOSED' if r.control_proposed else 'not proposed'}")
    return "\n".join(lines)


def targets(results: list[Measured]) -> list[str]:
    """One line per target of the issue, met or not from the measured numbers."""
    out = []
    for mode in ("one-off", "follow"):  # this code's runs (`against` runs: `ratios`)
        runs = sorted((r for r in results if r.mode == mode), key=lambda r: r.rows)
        if not runs:
            continue
        big = runs[-1]
        met = "met" if big.rate >= RATE_TARGET else "not met"
        scale = "" if big.rows >= 10 ** 6 else f" (measured at {big.rows:,} rows, not at 10^6)"
        out.append(f"{mode}: {big.rate:,.0f} rollouts per CPU-second at {big.rows:,} rows: target >= "
                   f"{RATE_TARGET:,} {met}{scale}")
        k = exponent(runs)
        if k is None:
            out.append(f"{mode}: growth exponent not measured (one size)")
        else:
            out.append(f"{mode}: growth exponent {k:.2f} over {runs[0].rows:,}..{big.rows:,} rows: target <= "
                       f"{EXPONENT_TARGET} {'met' if k <= EXPONENT_TARGET else 'not met'}")
            ratio = big.peak_rss_mb / runs[0].peak_rss_mb
            out.append(f"{mode}: peak memory {runs[0].peak_rss_mb:.0f} -> {big.peak_rss_mb:.0f} MB "
                       f"(x{ratio:.2f} for x{big.rows / runs[0].rows:.0f} rows): flat in the run's length "
                       f"{'met' if ratio <= FLAT else 'not met'} (within {FLAT - 1:.0%})")
    return out


def ratios(results: list[Measured], against: Path | None) -> list[str]:
    """Per size run both ways: this code's rollouts per CPU-second over the other checkout's."""
    other = {r.rows: r for r in results if r.mode == "against"}
    return [f"rows {r.rows:,}: {r.rate:,.0f} rollouts per CPU-second here, {other[r.rows].rate:,.0f} with {against}: "
            f"x{r.rate / other[r.rows].rate:.2f}; verdicts {'the same' if _verdict(r) == _verdict(other[r.rows]) else 'DIFFER'}"
            for r in results if r.mode == "one-off" and r.rows in other]


def _verdict(r: Measured) -> tuple:
    return r.exit, r.shortcut_live, r.shortcut_since, r.control_proposed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^4 rows only, one-off and following (CI)")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="rows of the one-off runs")
    ap.add_argument("--follow-sizes", default=None, help="rows of the --follow runs (default: the sizes "
                    "up to 10^5, for the benchmark's time: a poll reads only the lines appended since the last)")
    ap.add_argument("--chunks", type=int, default=10, help="--follow: appends of the log")
    ap.add_argument("--against", type=Path, default=None, metavar="CHECKOUT",
                    help="also run each one-off size with the code of another checkout (e.g. `git worktree add "
                    "/tmp/base 5f65af5`): rows `against`, and the ratio of rollouts per CPU-second")
    ap.add_argument("--keep", type=Path, default=None, help="keep the logs and monitor folders here")
    ap.add_argument("--json", type=Path, default=None, help="also write the measurements as JSON")
    args = ap.parse_args(argv)
    sizes = [10_000] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    follow = [10_000] if args.quick else (
        [int(s) for s in args.follow_sizes.split(",") if s] if args.follow_sizes is not None
        else [s for s in sizes if s <= 10 ** 5])
    work = Path(tempfile.mkdtemp(prefix="monitor_scale_")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    results: list[Measured] = []
    try:
        for rows in sorted(set(sizes) | set(follow)):
            steps = max(1, round(rows / (PROMPTS * PER_PROMPT)))
            log = work / f"log_{rows}.jsonl"
            write_log(log, steps)
            n = steps * PROMPTS * PER_PROMPT
            if rows in sizes:
                results.append(one_off(log, work / f"out_{rows}", n, steps))
                print(table(results[-1:]).splitlines()[-1], flush=True)
                if args.against is not None:
                    results.append(one_off(log, work / f"against_{rows}", n, steps, args.against.resolve(), "against"))
                    print(table(results[-1:]).splitlines()[-1], flush=True)
            if rows in follow:
                results.append(following(log, work / f"follow_{rows}", n, steps, args.chunks))
                print(table(results[-1:]).splitlines()[-1], flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nmonitor scale ({os.cpu_count()} CPUs, load average {load:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end)")
    print(table(results))
    print()
    for line in targets(results) + ratios(results, args.against):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rate": r.rate} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
