"""Penalty regexes under `re` and through saferegex: one judge pass over a step's replies (issue 21).

    python benchmarks/penalty_regex.py [--replies 16]

For each pattern (the issue's two that froze training, one that backtracks in any engine, and
two ordinary penalties): the seconds `re.search` takes over `--replies` replies, and the seconds
the regex judge takes on the same replies through saferegex, with what it decided. `re` rows
are skipped (`-`) where they would run for minutes. Then the ordinary case at scale: 10 usual
penalties over 512 replies of ~1,400 characters, `re` against the judge (the cost of the time
limits and the worker thread). Numbers move with the machine's load; the load average is
printed with each table.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dynalize.judge.judge import RegexJudge  # noqa: E402
from dynalize.types import Penalty  # noqa: E402

CASES = [  # pattern, reply, run it under `re` too
    (r"(a+)+$", "a" * 20 + "!", True),  # the issue: 23 characters took 0.3 s each
    (r"(?i)(\w+\s?)+\?\s*$", "Is this what you wanted friend", True),  # 30 characters, no "?"
    (r"(a|aa)+$", "a" * 60 + "!", False),  # fib(60) steps in `re`: years
    (r"(?i)\bcertainly\b", "Certainly! Here is a story about the sea. " * 40, True),
    (r"\A\s*(?:\S+\s+){200}\S", "word " * 400, True),
]

ORDINARY = [r"(?i)\bcertainly\b", r"(?i)(?<!\w)(?<!\w')sea(?!\w)(?!'\w)", r"\A\s*(?:\S+\s+){150}\S",
            r"\?[\s\"')\]*_]*\Z", r"(?i)\A\s*Certainly!", r"(?i)\bgreat question\b", r"!\s*\Z",
            r"(?i)\briver\W+number\b", r"(?i)\bzorbly\b", r"(?i)\bdelve\b"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replies", type=int, default=16)
    args = ap.parse_args()
    table = Table(title=f"one judge pass over {args.replies} replies (load {os.getloadavg()[0]:.2f})")
    for col in ("pattern", "reply chars", "re s", "saferegex s", "judge says"):
        table.add_column(col, no_wrap=True)
    for pattern, reply, with_re in CASES:
        texts = [reply] * args.replies
        re_s = "-"
        if with_re:
            t0 = time.perf_counter()
            for t in texts:
                re.search(pattern, t)
            re_s = f"{time.perf_counter() - t0:.4f}"
        judge = RegexJudge()
        t0 = time.perf_counter()
        out = anyio.run(judge.assess, texts, [Penalty("p001", "x", "x", regex=pattern)], 1)
        safe_s = time.perf_counter() - t0
        said = (f"set aside ({judge.stats.regex_timeouts} timeout)" if judge.unusable_regexes
                else f"{sum(j.verdicts['p001'] for j in out)}/{len(out)} match")
        table.add_row(pattern, str(len(reply)), re_s, f"{safe_s:.4f}", said)
    Console(width=120).print(table)

    texts = [f"Certainly! Here is a story about the sea and the river number {i}. " * 20 for i in range(512)]
    pens = [Penalty(f"p{i:03d}", "x", "x", regex=p) for i, p in enumerate(ORDINARY)]
    t0 = time.perf_counter()
    for p in ORDINARY:
        for t in texts:
            re.search(p, t)
    re_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    anyio.run(RegexJudge().assess, texts, pens, 1)
    judge_s = time.perf_counter() - t0
    scale = Table(title=f"{len(ORDINARY)} ordinary penalties x {len(texts)} replies (load {os.getloadavg()[0]:.2f})")
    for col in ("re s", "judge (saferegex) s", "ratio"):
        scale.add_column(col)
    scale.add_row(f"{re_s:.3f}", f"{judge_s:.3f}", f"{judge_s / re_s:.2f}")
    Console(width=120).print(scale)


if __name__ == "__main__":
    main()
