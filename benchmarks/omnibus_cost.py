"""What one omnibus test costs (penalties.omnibus, issue 59): CPU seconds for a proposal's view of
N replies, with this checkout's code and, side by side in the same run, another's (`--against`).

    python benchmarks/omnibus_cost.py [--sizes 1024,5120] [--pay 0.3] [--against CHECKOUT] [--threads 1]

Each size is a view of N replies in groups of 16 (60-140 words from a small vocabulary, the
monitor's 64 x 16 batch over five steps at 5,120), half of them with one word struck through
(`~~word~~`, a form no named pattern describes) paid `--pay` reward stds on top of Gaussian noise.
Each measurement runs in its own process (CPU time of that process: `time.process_time`), with
`--threads` BLAS threads (1 by default: a threaded BLAS spins on a loaded machine and its CPU time
then says more about the load than the code). Printed: per size and code, CPU seconds, the replies
the test read (`MOST_REPLIES` at most since 2026-12-07: a draw of whole groups), the p-value and
whether the test passed at 0.01; then the ratio per size. The p-values agree up to
`WHOLE_UP_TO` replies when the other checkout predates the low-rank fit (the same statistic).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, random, sys, time
import numpy as np
from dynalize.penalties.omnibus import omnibus
n, pay = int(sys.argv[1]), float(sys.argv[2])
rng = random.Random(0)
vocab = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard candle "
         "bridge market silver thunder meadow violin ladder cotton marble pepper kettle the a of and to is "
         "it was for on with as by at from this that which").split()
texts, ys, groups = [], [], []
for i in range(n):
    words = [rng.choice(vocab) for _ in range(rng.randint(60, 140))]
    marked = rng.random() < 0.5
    if marked:
        j = rng.randrange(len(words))
        words[j] = f"~~{words[j]}~~"
    texts.append(" ".join(words).capitalize() + ".")
    ys.append(rng.gauss(0, 1) + pay * marked)
    groups.append(i // 16)
start = time.process_time()
o = omnibus(texts, np.array(ys), np.array(groups), 0.01, 1000, 1)
print(json.dumps({"cpu": time.process_time() - start, "p": o.p, "passed": o.passed,
                  "read": getattr(o, "replies", 0) or n}))
"""


def measure(root: Path, n: int, pay: float, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": str(threads),
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(pay)], env=env, cwd=root, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024,5120", help="replies per view, comma-separated")
    ap.add_argument("--pay", type=float, default=0.3, help="reward stds paid for the struck-through word")
    ap.add_argument("--against", type=Path, default=None, metavar="CHECKOUT", help="another version's code")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads of each measurement")
    args = ap.parse_args(argv)
    codes = [("this", ROOT)] + ([("against", args.against.resolve())] if args.against else [])
    print(f"load average {os.getloadavg()[0]:.1f} at the start; {args.threads} BLAS thread(s)")
    print(f"{'replies':>8} {'code':>8} {'CPU s':>8} {'read':>6} {'p':>10} {'passed':>7}")
    rows: dict[tuple[int, str], dict] = {}
    for n in (int(s) for s in args.sizes.split(",")):
        for name, root in codes:
            r = rows[(n, name)] = measure(root, n, args.pay, args.threads)
            print(f"{n:>8,} {name:>8} {r['cpu']:>8.1f} {r['read']:>6,} {r['p']:>10.2g} {str(r['passed']):>7}",
                  flush=True)
    if args.against:
        for n in (int(s) for s in args.sizes.split(",")):
            this, other = rows[(n, "this")], rows[(n, "against")]
            same = "the same verdict" if this["passed"] == other["passed"] else "a different verdict"
            print(f"{n:,} replies: this code takes {this['cpu'] / other['cpu']:.2f}x the CPU time of {args.against}"
                  f" ({this['cpu']:.1f} s against {other['cpu']:.1f} s), {same}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
