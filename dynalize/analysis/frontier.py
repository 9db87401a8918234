"""The gold frontier of rubric runs: is an arm better than the fixed rubric, or only slower?

An arm that only delays the hack moves along the fixed rubric's trade-off more slowly: at each
checkpoint its gold is what the fixed rubric had at the same overclaim (or proxy). An arm that is
better lies above that curve. Per arm, over all its checkpoints (step > 0) and seeds:

- seeds are paired (arm seed s against the fixed arm's seed s: the same initial policy and data
  order); the reference is the fixed run's curve, its checkpoints (step 0 included) sorted by the
  axis (overclaim or proxy; ties averaged), gold interpolated linearly between them;
- each checkpoint of the arm's run whose axis value lies inside the reference's range contributes
  gold − reference(axis) (outside it nothing is extrapolated: counted as `outside`); the seed's
  difference is their mean;
- the arm's difference is the mean over seeds; its spread, the 95 % Student-t interval over seeds
  (n − 1 degrees of freedom: wide with 3 seeds, as it should be);
- the verdict: `above` when the whole interval is above 0, `below` when below, `on it` when it
  covers 0, `n/a` with fewer than two seeds (no spread) or no comparable checkpoint.

A run is a mapping with `steps`, `gold`, `proxy`, `overclaim` (lists, one value per evaluation),
as `benchmarks/rubric_table.py` reads them (`dynalize.analysis.rubrics.rubric_run`'s series).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

AXES = ("overclaim", "proxy")
Run = Mapping[str, Sequence[float]]


@dataclass
class Frontier:
    """One arm against the reference on one axis."""

    arm: str
    axis: str
    diff: float
    """Mean over the arm's checkpoints of gold − the reference's gold at the same axis value."""
    lo: float
    hi: float
    """The 95 % Student-t interval over seeds (NaN with one seed)."""
    per_seed: list[float]
    points: int
    outside: int
    verdict: str


def _finite(*xs: float) -> bool:
    return all(isinstance(x, int | float) and x == x and not math.isinf(x) for x in xs)


def reference_curve(runs: Sequence[Run], axis: str) -> tuple[np.ndarray, np.ndarray]:
    """The reference's (axis, gold) points over all its checkpoints, sorted by axis, ties averaged."""
    pts: dict[float, list[float]] = {}
    for r in runs:
        for x, g in zip(r[axis], r["gold"]):
            if _finite(x, g):
                pts.setdefault(float(x), []).append(float(g))
    xs = sorted(pts)
    return np.array(xs), np.array([sum(pts[x]) / len(pts[x]) for x in xs])


def differences(run: Run, ref: tuple[np.ndarray, np.ndarray], axis: str) -> tuple[list[float], int]:
    """(gold − reference gold at each step > 0 checkpoint inside the reference's range, checkpoints outside)."""
    xs, ys = ref
    out, outside = [], 0
    for step, x, g in zip(run["steps"], run[axis], run["gold"]):
        if step <= 0 or not _finite(x, g):
            continue
        if len(xs) == 0 or not xs[0] <= x <= xs[-1]:
            outside += 1
            continue
        out.append(float(g) - float(np.interp(x, xs, ys)))
    return out, outside


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045)
"""Student's t, 97.5th percentile, for 1..29 degrees of freedom (1.96 beyond)."""


def compare(name: str, arm: Sequence[Run], base: Sequence[Run], axis: str) -> Frontier:
    """`arm` (its seeds' runs) against `base` (the same seeds', in the same order) on `axis`."""
    per = [differences(r, reference_curve([b], axis), axis) for r, b in zip(arm, base)]
    per_seed = [sum(ds) / len(ds) if ds else math.nan for ds, _ in per]
    vals = [d for d in per_seed if d == d]
    points, outside = sum(len(ds) for ds, _ in per), sum(o for _, o in per)
    diff = sum(vals) / len(vals) if vals else math.nan
    lo = hi = math.nan
    if len(vals) >= 2:
        sd = math.sqrt(sum((v - diff) ** 2 for v in vals) / (len(vals) - 1))
        half = (T975[len(vals) - 2] if len(vals) - 1 <= len(T975) else 1.96) * sd / math.sqrt(len(vals))
        lo, hi = diff - half, diff + half
    verdict = "n/a" if lo != lo else "above" if lo > 0 else "below" if hi < 0 else "on it"
    return Frontier(name, axis, diff, lo, hi, per_seed, points, outside, verdict)


def frontiers(arms: Mapping[str, Sequence[Run]], base: str) -> list[Frontier]:
    """Every arm but `base` against `base`, on both axes."""
    return [compare(a, runs, arms[base], axis) for axis in AXES for a, runs in arms.items() if a != base]


def _v(x: float) -> str:
    return "n/a" if x != x else f"{x:+.3f}"


def frontier_rows(results: Sequence[Frontier], labels: Mapping[str, str] | None = None) -> tuple[list[str], list[list[str]]]:
    """The table: arm, axis, Δ gold [interval], per seed, checkpoints compared (outside), verdict."""
    labels = labels or {}
    body = [[labels.get(f.arm, f.arm), f.axis, f"{_v(f.diff)} [{_v(f.lo)}, {_v(f.hi)}]",
             " ".join(_v(x) for x in f.per_seed), f"{f.points} ({f.outside})", f.verdict] for f in results]
    return ["arm", "matched", "Δ gold [95 % over seeds]", "Δ per seed", "checkpoints (outside)", "frontier"], body


def sentences(results: Sequence[Frontier], labels: Mapping[str, str] | None = None,
              base_label: str = "the fixed rubric") -> list[str]:
    """One sentence per (arm, axis), each made from its numbers."""
    labels = labels or {}
    out = []
    for f in results:
        where = {"above": "lies above", "below": "lies below", "on it": "lies on",
                 "n/a": "cannot be placed against"}[f.verdict]
        spread = (f"95 % interval over seeds [{_v(f.lo)}, {_v(f.hi)}]" if f.lo == f.lo else
                  "no spread: fewer than two seeds or no comparable checkpoint")
        out.append(f"{labels.get(f.arm, f.arm)} {where} {base_label}'s frontier at matched {f.axis}: gold "
                   f"{_v(f.diff)} on average over {f.points} checkpoints ({spread}).")
    return out


def reading(results: Sequence[Frontier], dropout_arms: Sequence[str]) -> str:
    """Which reading the numbers support for the dropout arms, at matched overclaim."""
    at = [f for f in results if f.axis == "overclaim" and f.arm in dropout_arms]
    if not at or any(f.verdict == "n/a" for f in at):
        return "No reading: the dropout arms' frontier could not be placed (fewer than two seeds, or no overlap)."
    above = [f.arm for f in at if f.verdict == "above"]
    if above:
        return (f"At matched overclaim, {', '.join(above)} lie above the fixed rubric's frontier: "
                f"better, not only slower ({len(above)} of {len(at)} dropout arms).")
    below = [f.arm for f in at if f.verdict == "below"]
    if below:
        return (f"At matched overclaim, {', '.join(below)} lie below the fixed rubric's frontier (a worse trade-off) "
                f"and none above ({len(below)} of {len(at)} dropout arms below).")
    return (f"At matched overclaim, every dropout arm ({len(at)}) lies on the fixed rubric's frontier: whatever it "
            f"gains at matched checkpoints is a delay (only slower), not a better trade-off.")


def plot(arms: Mapping[str, Sequence[Run]], path: Path, labels: Mapping[str, str] | None = None,
         title: str = "") -> Path:
    """Gold against overclaim and against proxy, every checkpoint, one line per (arm, seed) in step order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    palette = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for (arm, runs), color in zip(arms.items(), palette * 4):
        for i, r in enumerate(runs):
            for ax, axis in zip(axes, AXES):
                ax.plot(r[axis], r["gold"], "-o", color=color, ms=3, lw=0.9, alpha=0.7,
                        label=labels.get(arm, arm) if i == 0 else None)
    for ax, axis in zip(axes, AXES):
        ax.set_xlabel(f"held-out {axis}")
        ax.set_ylabel("held-out gold")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "gold frontier: every checkpoint, one line per seed")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary(results: Sequence[Frontier]) -> list[dict[str, Any]]:
    """The numbers, for summary.json."""
    return [dict(vars(f)) for f in results]
