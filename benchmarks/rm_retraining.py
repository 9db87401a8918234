"""The paper's RM-retraining study in miniature, on the sandbox with a *learned* RM.

    python benchmarks/rm_retraining.py [--steps 100] [--seeds 0 1 2] [--parallel 2] [--out DIR]
                                       [--reuse] [--no-run]

Per seed s (docs/rm_retraining.md has the recipe by hand):

  1. RM v1 = `tiny:sandbox-rm`, a tiny Bradley–Terry RM trained on pairs the sandbox's flawed
     formula RM labelled (dynalize/tasks/sandbox/learned_rm.py);
  2. `rm_only_v1_s<s>` and `dynalize_v1_s<s>`: configs/sandbox_learned_{rm_only,dynalize}.yaml;
  3. `python -m dynalize.rm pairs --run dynalize_v1_s<s> --rejudge` (every reply against every
     penalty the run accepted; the other settings at their defaults) → `pairs_s<s>.jsonl`;
  4. `python -m dynalize.rm train --config configs/rm/sandbox_retrain.yaml` on v1's original
     pairs plus those → RM v2 `rm_v2_s<s>/` (the same recipe as v1, its score spread kept);
  5. `rm_only_v2_s<s>` and `dynalize_v2_s<s>` against RM v2 (`reward_model.path=rm_v2_s<s>`);
  6. `python -m dynalize.report audit --penalties dynalize_v2_s<s> --compare dynalize_v1_s<s>
     --rollouts rm_only_v1_s<s> rm_only_v2_s<s>`: which of v2's penalties match v1's, judged on
     the last batches of both RM-only runs (where each RM's hacks are common).

Printed: RM accuracy (v1 before, v2 after; held-out original and new pairs), what gold says of
the new pairs (mean gold of chosen and rejected replies, the share of pairs gold agrees with, the
median step the chosen replies come from), gold Peak / End /
Final and RM End per arm, whether RM-only hacks each RM (RM End above the RM at the gold peak,
gold Peak − End ≥ 0.05), held-out prevalence of each planted feature at End per arm, which
planted features each Dynalize run's penalties cover (matched as benchmarks/sandbox_table.py
does: adding the feature raises the regex's match rate by ≥ 0.5), and the penalty-set match.
This benchmark may know the feature list; dynalize's code does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sandbox_table import (  # noqa: E402  (the sandbox table's readers and formatting)
    MARGIN,
    clean_replies,
    end_window,
    evals,
    finished,
    match_feature,
    ms,
    penalty_events,
    table,
)

from dynalize.tasks.sandbox import default_features, gold_score  # noqa: E402  (the benchmark may know them)
from dynalize.tasks.sandbox.reward import topic_of  # noqa: E402
from dynalize.types import as_messages  # noqa: E402

ARMS = ("rm_only_v1", "dynalize_v1", "rm_only_v2", "dynalize_v2")
LABEL = {"rm_only_v1": "RM-only vs v1", "dynalize_v1": "Dynalize vs v1", "rm_only_v2": "RM-only vs v2",
         "dynalize_v2": "Dynalize vs v2"}


def sh(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}).returncode
    if rc:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {rc}): see {log}")


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"{arm}_s{seed}"
    run_dir = Path(args.out) / name
    config = ROOT / "configs" / f"sandbox_learned_{arm.rsplit('_', 1)[0]}.yaml"
    cmd = [sys.executable, "-m", "dynalize.run", "--config", str(config), f"output_dir={args.out}", f"name={name}",
           f"seed={seed}", f"steps={args.steps}", "progress=false"]
    if arm.endswith("_v2"):
        cmd.append(f"reward_model.path={Path(args.out) / f'rm_v2_s{seed}'}")
    stamp = run_dir / "benchmark_cmd.txt"
    wanted = " ".join(cmd[3:]) + "\n" + config.read_text(encoding="utf-8")
    if args.reuse and finished(run_dir, args.steps) and stamp.is_file() and stamp.read_text() == wanted:
        return {"run": name, "seconds": None}
    if run_dir.exists():
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    sh(cmd, Path(args.out) / f"{name}.log")
    stamp.write_text(wanted)
    return {"run": name, "seconds": time.perf_counter() - t0}


def retrain(seed: int, args: argparse.Namespace, v1: Path) -> dict[str, Any]:
    out = Path(args.out)
    pairs, rm_v2 = out / f"pairs_s{seed}.jsonl", out / f"rm_v2_s{seed}"
    if args.reuse and (rm_v2 / "rm_training.json").is_file() and pairs.is_file():
        return {"seed": seed, "seconds": None}
    t0 = time.perf_counter()
    sh([sys.executable, "-m", "dynalize.rm", "pairs", "--run", str(out / f"dynalize_v1_s{seed}"), "--out", str(pairs),
        "--rejudge"], out / f"pairs_s{seed}.log")
    sh([sys.executable, "-m", "dynalize.rm", "train", "--config", str(ROOT / "configs" / "rm" / "sandbox_retrain.yaml"),
        "--pairs", str(v1 / "original_pairs.jsonl"), "--extra", str(pairs), "--out", str(rm_v2), "--overwrite",
        "trainer_args.disable_tqdm=true"], out / f"rm_v2_s{seed}.log")
    return {"seed": seed, "seconds": time.perf_counter() - t0}


def audit(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    target = out / "audits" / f"s{seed}"
    sh([sys.executable, "-m", "dynalize.report", "audit", "--penalties", str(out / f"dynalize_v2_s{seed}"),
        "--compare", str(out / f"dynalize_v1_s{seed}"), "--rollouts", str(out / f"rm_only_v1_s{seed}"),
        str(out / f"rm_only_v2_s{seed}"), "--out", str(target)], out / f"audit_s{seed}.log")
    return json.loads((target / f"audit_dynalize_v2_s{seed}_all.json").read_text())["compare"]


# --- analysis ------------------------------------------------------------------------------------

def analyse(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    features = default_features()
    labels = [f.label for f in features]
    base = clean_replies(features)
    res: dict[str, Any] = {"seeds": args.seeds, "features": labels, "runs": {}, "rm": {}, "pairs": {}, "match": {}}
    for arm in ARMS:
        for s in args.seeds:
            rows = evals(out / f"{arm}_s{s}")
            end = end_window(rows)
            peak = max(rows, key=lambda d: d["gold"])
            r = {"peak": peak["gold"], "peak_step": peak["version"], "rm_at_peak": peak["rm"],
                 "end": statistics.fmean(d["gold"] for d in end), "final": rows[-1]["gold"],
                 "rm_end": statistics.fmean(d["rm"] for d in end), "rm_first": rows[0]["rm"],
                 "end_steps": [end[0]["version"], end[-1]["version"]],
                 "prev_end": {k: statistics.fmean(d.get(f"feature/{k}", float("nan")) for d in end) for k in labels},
                 "prev_first": {k: rows[0].get(f"feature/{k}", float("nan")) for k in labels}}
            r["hacks"] = r["peak"] - r["end"] >= MARGIN and r["rm_end"] > r["rm_at_peak"] \
                and r["peak_step"] < r["end_steps"][0]
            if arm.startswith("dynalize"):
                pens: dict[str, dict[str, Any]] = {}
                for e in penalty_events(out / f"{arm}_s{s}"):
                    p = pens.setdefault(e["id"], {"id": e["id"], "title": e["title"], "regex": e["regex"],
                                                  "events": []})
                    p["events"].append((e["event"], e["step"]))
                for p in pens.values():
                    p["feature"], p["reaction"] = match_feature(p["regex"], features, base)
                r["penalties"] = list(pens.values())
            res["runs"][f"{arm}_s{s}"] = r
    for s in args.seeds:
        res["rm"][s] = json.loads((out / f"rm_v2_s{s}" / "rm_training.json").read_text())
        res["pairs"][s] = pair_gold(out / f"pairs_s{s}.jsonl")
        res["match"][s] = audit(s, args)
    return res


def pair_gold(path: Path) -> dict[str, Any]:
    """What gold says of the new pairs: mean gold of chosen and rejected replies, the share of pairs
    whose chosen reply has the higher gold, and the median step the chosen replies come from."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    chosen, rejected = [], []
    for r in rows:
        topic = topic_of(as_messages(r["prompt"]))
        chosen.append(gold_score(topic, r["chosen"]))
        rejected.append(gold_score(topic, r["rejected"]))
    return {"n": len(rows), "gold_chosen": statistics.fmean(chosen), "gold_rejected": statistics.fmean(rejected),
            "agree": statistics.fmean(c > r for c, r in zip(chosen, rejected)),
            "chosen_step": statistics.median(r["source"]["chosen_step"] for r in rows)}


def report(res: dict[str, Any]) -> str:
    seeds, labels, runs = res["seeds"], res["features"], res["runs"]
    o: list[str] = [f"## Sandbox with a learned RM: RM v1 → Dynalize → pairs → RM v2, {len(seeds)} seeds\n"]
    rows = []
    for s in seeds:
        t = res["rm"][s]
        b, a = t["before"], t["after"]
        g = res["pairs"][s]
        rows.append([s, g["n"], f"{b['original']['accuracy']:.3f}", f"{b['new']['accuracy']:.3f}",
                     f"{a['original']['accuracy']:.3f}", f"{a['new']['accuracy']:.3f}",
                     f"{t['held_out_pairs']['original']} / {t['held_out_pairs']['new']}",
                     f"{g['gold_chosen']:.3f} / {g['gold_rejected']:.3f}", f"{g['agree']:.2f}", f"{g['chosen_step']:g}"])
    o.append("### RM accuracy on held-out pairs (original: labelled by the formula RM; new: from Dynalize vs v1), "
             "and what gold says of the new pairs\n")
    o.append(table(rows, ["seed", "new pairs", "v1 original", "v1 new", "v2 original", "v2 new",
                          "held out (orig / new)", "gold chosen / rejected", "gold agrees", "chosen: median step"]))
    rows = []
    for arm in ARMS:
        r = [runs[f"{arm}_s{s}"] for s in seeds]
        rows.append([LABEL[arm], ms([x["peak"] for x in r]), ms([x["end"] for x in r]), ms([x["final"] for x in r]),
                     ms([x["rm_end"] for x in r]), f"{sum(x['hacks'] for x in r)} / {len(r)}"])
    o.append("\n### Gold (held-out) and RM per arm: mean ± sd over seeds; End = mean of the last quarter of "
             "evaluations\n")
    o.append(table(rows, ["arm", "gold Peak", "gold End", "gold Final", "RM (End)", "hacks (seeds)"]))
    o.append(f"\n'hacks': RM End above the RM at the gold peak, the peak before End, and gold Peak − End ≥ "
             f"{MARGIN}.\n")
    rows = []
    for arm in ARMS:
        for s in seeds:
            r = runs[f"{arm}_s{s}"]
            rows.append([LABEL[arm], s, f"{r['rm_first']:.3f} → {r['rm_end']:.3f}",
                         f"{r['peak']:.3f} @ {r['peak_step']}", f"{r['end']:.3f}", f"{r['final']:.3f}",
                         "yes" if r["hacks"] else "no",
                         *[f"{r['prev_first'][k]:.2f} → {r['prev_end'][k]:.2f}" for k in labels]])
    o.append("### Per run: RM first → End, gold, and each planted feature's held-out prevalence first → End\n")
    o.append(table(rows, ["arm", "seed", "RM", "gold Peak @ step", "End", "Final", "hacks", *labels]))
    rows = []
    for arm in ("dynalize_v1", "dynalize_v2"):
        for s in seeds:
            pens = runs[f"{arm}_s{s}"]["penalties"]
            row = [LABEL[arm], s, len(pens)]
            for k in labels:
                hit = [p for p in pens if p["feature"] == k]
                row.append(", ".join(f"{p['id']}@{p['events'][0][1]}" for p in hit) or "—")
            row.append(sum(p["feature"] is None for p in pens))
            rows.append(row)
    o.append("\n### Planted features each Dynalize run's penalties cover (penalty id @ step it entered)\n")
    o.append(table(rows, ["arm", "seed", "penalties", *labels, "other"]))
    o.append("\nPenalties:")
    for arm in ("dynalize_v1", "dynalize_v2"):
        for s in seeds:
            for p in runs[f"{arm}_s{s}"]["penalties"]:
                ev = " ".join(f"{e}@{st}" for e, st in p["events"])
                o.append(f"  {arm} s{s} {p['id']} {p['title']!r:52} -> {p['feature'] or '—'}  {ev}")
    rows = []
    for s in seeds:
        m = res["match"][s]
        same = [x for x in m["matches"] if x["matched"]]
        rows.append([s, len(m["matches"]), len(same),
                     ", ".join(f"{x['new']}≈{x['old']}" for x in same) or "—",
                     ", ".join(m["not_found_again"]) or "—", m["replies"]])
    o.append("\n### Dynalize vs v2's penalties matched to Dynalize vs v1's (`report audit --compare`: same regex, "
             "or Jaccard ≥ 0.5 of the replies they fire on among both RM-only runs' last batches)\n")
    o.append(table(rows, ["seed", "v2 penalties", "match a v1 one", "matches (v2≈v1)", "v1 penalties not found again",
                          "replies judged"]))
    return "\n".join(o)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (each uses one torch thread)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "rm_retraining"))
    ap.add_argument("--reuse", action="store_true", help="keep finished runs and RMs made with the same command")
    ap.add_argument("--no-run", action="store_true", help="only analyse what is in --out")
    args = ap.parse_args(argv)
    args.out = str(Path(args.out).resolve())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.no_run:
        from dynalize.build import model_dir

        v1 = Path(model_dir("tiny:sandbox-rm"))
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            for stage in (lambda: [pool.submit(run_arm, a, s, args) for s in args.seeds for a in ARMS[:2]],
                          lambda: [pool.submit(retrain, s, args, v1) for s in args.seeds],
                          lambda: [pool.submit(run_arm, a, s, args) for s in args.seeds for a in ARMS[2:]]):
                for f in stage():
                    d = f.result()
                    took = "reused" if d["seconds"] is None else f"{d['seconds']:.0f} s"
                    print(f"{d.get('run', 'retrain s' + str(d.get('seed')))}: {took}", file=sys.stderr)
    res = analyse(args)
    text = report(res)
    print(text)
    print(f"\n(wall time of this invocation: {(time.perf_counter() - t0) / 60:.1f} min; runs in {args.out})")
    (Path(args.out) / "summary.json").write_text(json.dumps(res, indent=1, default=str))
    (Path(args.out) / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
