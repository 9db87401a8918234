"""Replay the lexical proposer offline over the saved rollouts of finished sandbox runs.

    python benchmarks/proposer_replay.py RUN_DIR [RUN_DIR ...] [--features default|alternative|FILE]
                                         [--config configs/sandbox_dynalize.yaml] [--buffer simulate|run]
                                         [--every 5] [--view-steps 5] [-v] [--set KEY=VALUE ...]

A 100-step sandbox run takes minutes; a replay of its 20 proposals takes seconds. Each proposal
step s (s % every == 0) gets the view the run's proposer would have had: the rollouts of steps
s − view_steps + 1 … s, each with its RM score and that score's advantage sign within its group,
and the run's first batch as the reference. `--buffer simulate` (for RM-only runs) keeps its own
buffer: an accepted candidate is active from the next step on, retired when no rollout of a batch
triggers it, revived when proposed again. `--buffer run` (for Dynalize runs) gives each proposal
the run's own active and retired penalties at that step (penalties.jsonl), so each decision can
be compared with the run's. The policy never reacts to a replayed penalty: an RM-only run is a
hacking trajectory on which every decision of a proposer setting can be checked in seconds.

Printed per run: every accepted candidate (step, title, the planted feature it matches by the
benchmark's matching, `sandbox_table.match_feature`), recall, precision and the step each planted
feature was first matched. The proposer sees only texts and scores, as in a run; the feature
list is read here, by the benchmark, to grade.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import regex

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sandbox_table import clean_replies, load_features, match_feature, penalty_events, read_jsonl  # noqa: E402

from dynalize.analysis.audit import row_exchanges  # noqa: E402
from dynalize.config import load_config  # noqa: E402
from dynalize.judge.prompting import transcript  # noqa: E402
from dynalize.grpo import advantages  # noqa: E402
from dynalize.penalties.config import LexicalConfig  # noqa: E402
from dynalize.penalties.lexical import LexicalProposer  # noqa: E402
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign, own_reply_scores, pool_views  # noqa: E402
from dynalize.types import Penalty  # noqa: E402


def batch_view(run_dir: Path, step: int) -> ProposerView | None:
    """The whole batch of `step` as a view: every rollout, scored by the RM (before penalties)."""
    rows = read_jsonl(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    if not rows:
        return None
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    samples = []
    for g, members in sorted(groups.items()):
        scores = [r["scores"]["rm"] for r in members]
        for r, a in zip(members, advantages([scores])[0]):
            own = own_reply_scores(r.get("rm_scores") or [], len(r["replies"]), r["scores"]["rm"])
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, "\n\n".join(r["replies"]), r["scores"]["rm"],
                                      advantage_sign(a), r["replies"] if len(r["replies"]) > 1 else [],
                                      [transcript(c) for c, _ in row_exchanges(r)], own))
    return ProposerView(step=step, samples=samples)


def run_buffer(events: list[dict[str, Any]], step: int) -> tuple[list[Penalty], list[Penalty]]:
    """(active, retired) penalties of a Dynalize run after the events of steps <= `step`."""
    pens: dict[str, Penalty] = {}
    for e in events:
        if e["step"] > step:
            break
        if e["event"] == "add":
            pens[e["id"]] = Penalty(e["id"], e["title"], "", regex=e["regex"], detector=e.get("detector"))
        elif e["id"] in pens:
            pens[e["id"]].active = e["event"] == "revive"
    return [p for p in pens.values() if p.active], [p for p in pens.values() if not p.active]


def replay(run_dir: Path, cfg: LexicalConfig, every: int, view_steps: int, mode: str,
           features: list, base: list[str], verbose: bool = False, reference_steps: int = 1) -> dict[str, Any]:
    proposer = LexicalProposer(cfg)
    views: dict[int, ProposerView] = {}
    steps = max((m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")), default=0)  # steps completed
    events = penalty_events(run_dir) if mode == "run" else []
    active: list[Penalty] = []
    retired: list[Penalty] = []
    accepted: list[dict[str, Any]] = []
    reference: list[ViewSample] = []  # the first `reference_steps` batches (penalties.reference_steps)
    for step in range(1, steps + 1):  # rollouts/step_N: the N-th step's batch (batch N - 1)
        v = batch_view(run_dir, step)
        if v is None:
            continue
        views[step] = v
        if len(views) <= reference_steps:
            reference = reference + v.samples
        if mode == "simulate":  # retire what nothing in this batch triggers
            for p in list(active):
                if not any(regex.search(p.regex, t) for s in v.samples for t in s.parts):
                    active.remove(p)
                    p.active = False
                    retired.append(p)
        if (step - 1) % every:  # the proposer's schedule counts batches from 0
            continue
        if mode == "run":
            active, retired = run_buffer(events, step)
        pooled = pool_views([views[s] for s in range(max(0, step - view_steps + 1), step + 1) if s in views],
                            step=step, active=active, retired=retired, reference=reference)
        cand = proposer.best(pooled)
        if cand is None:
            if verbose:
                print(f"  {step:3d} —", file=sys.stderr)
            continue
        feature, react = match_feature(cand.regex, features, base)
        accepted.append({"step": step, "title": cand.title, "regex": cand.regex, "feature": feature,
                         "revives": cand.revives})
        if verbose:
            print(f"  {step:3d} {cand.title!r} -> {feature or 'FALSE'}" + (f" (revives {cand.revives})"
                                                                          if cand.revives else ""), file=sys.stderr)
        if mode == "simulate":
            if cand.revives:
                p = next(p for p in retired if p.id == cand.revives)
                retired.remove(p)
                p.active = True
                active.append(p)
            else:
                active.append(Penalty(f"p{len(active) + len(retired) + 1:03d}", cand.title, cand.description,
                                      regex=cand.regex))
    new = [a for a in accepted if not a["revives"]]
    labels = [f.label for f in features]
    found = {k: min((a["step"] for a in new if a["feature"] == k), default=None) for k in labels}
    return {"accepted": new, "found": found, "true": sum(a["feature"] is not None for a in new),
            "false": [a["title"] for a in new if a["feature"] is None]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--features", default="default")
    ap.add_argument("--config", default=str(ROOT / "configs" / "sandbox_dynalize.yaml"),
                    help="the run config whose penalties.proposer.lexical settings to start from")
    ap.add_argument("--buffer", choices=("simulate", "run"), default="simulate")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--view-steps", type=int, default=5)
    ap.add_argument("--reference-steps", type=int, default=None,
                    help="first batches pooled as the rising test's reference (default: the config's)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a LexicalConfig field over the config's, e.g. --set min_effect=0.6 (repeatable)")
    args = ap.parse_args(argv)
    penalties = load_config(args.config, [f"penalties.proposer.lexical.{o}" for o in args.overrides]).penalties
    cfg = penalties.proposer.lexical
    reference_steps = args.reference_steps or penalties.reference_steps
    _, features = load_features(args.features)
    base = clean_replies(features)
    precisions, recalls = [], []
    for run in args.runs:
        if args.verbose:
            print(run, file=sys.stderr)
        r = replay(run, cfg, args.every, args.view_steps, args.buffer, features, base, args.verbose, reference_steps)
        n = len(r["accepted"])
        prec = r["true"] / n if n else float("nan")
        recall = sum(v is not None for v in r["found"].values()) / len(features)
        precisions.append(prec)
        recalls.append(recall)
        found = " ".join(f"{k}@{v}" if v is not None else f"{k}@—" for k, v in r["found"].items())
        print(f"{run.name}: precision {r['true']}/{n}  recall {recall:.2f}  {found}  false: {r['false']}")
    print(f"mean precision {statistics.fmean(precisions):.2f}, mean recall {statistics.fmean(recalls):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
