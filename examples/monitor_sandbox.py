"""Worked example of `python -m dynalize.monitor`: watch a run that had no penalties for hacks.

    python examples/monitor_sandbox.py [--steps 100] [--out runs/monitor_example] [--set KEY=VALUE ...]

1. trains the sandbox's RM-only arm (configs/sandbox_rm_only.yaml): its RM pays for planted
   features, nothing stops it, and the policy learns them;
2. writes its rollouts in the monitor's plain format (one JSON line per rollout: step, group,
   prompt, completion, reward), as any framework could;
3. monitors that file with the penalty settings of the sandbox's Dynalize arm
   (configs/sandbox_dynalize.yaml): what would Dynalize have found, and since when;
4. trains the Dynalize arm with the same seed and compares: `python -m dynalize.report audit`
   judges the monitor's patterns and the Dynalize run's penalties on the RM-only run's last
   replies and matches them (identical regex, or overlapping verdicts).

Every stage is the command a user would type; `--set` overrides apply to both training runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export_plain(run_dir: Path, out: Path) -> int:
    """A dynalize run's training rollouts as the monitor's plain JSONL; the number of rows."""
    from dynalize.runlog import read_jsonl

    n = 0
    with out.open("w", encoding="utf-8") as f:
        for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
            for r in read_jsonl(path):
                f.write(json.dumps({"step": r["step"], "group": f"{r['prompt_id']}#{r['group']}",
                                    "prompt": r["prompt"], "completion": "\n\n".join(r["replies"]),
                                    "reward": r["scores"]["rm"]}, ensure_ascii=False) + "\n")
                n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("runs/monitor_example"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    from dynalize.monitor.__main__ import main as monitor
    from dynalize.report import main as report
    from dynalize.run import main as run

    common = [f"output_dir={args.out}", f"steps={args.steps}", "eval_every=0", "progress=false", *args.overrides]
    for arm in ("rm_only", "dynalize"):
        if not (args.out / arm / "metrics.jsonl").exists():
            code = run(["--config", str(ROOT / "configs" / f"sandbox_{arm}.yaml"), f"name={arm}", *common])
            if code:
                return code
    rows = export_plain(args.out / "rm_only", args.out / "rm_only_rollouts.jsonl")
    print(f"exported {rows} rollouts of the RM-only run to {args.out / 'rm_only_rollouts.jsonl'}")
    status = monitor([str(args.out / "rm_only_rollouts.jsonl"), "--out", str(args.out / "monitor"),
                      "--config", str(ROOT / "configs" / "sandbox_dynalize.yaml"),
                      *(f"--set={o.removeprefix('penalties.')}" for o in args.overrides if o.startswith("penalties."))])
    print(f"monitor exit status: {status}")
    report(["audit", "--penalties", str(args.out / "monitor"), "--rollouts", str(args.out / "rm_only"),
            "--compare", str(args.out / "dynalize"), "--out", str(args.out / "audit")])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
