"""The rubric world: fixed-rubric GRPO against Rubric Dropout and POW3R-style reweighting, over seeds.

    python benchmarks/rubric_table.py [--lists default|alternative|FILE.yaml] [--steps 100]
                                      [--seeds 0 1 2] [--parallel 2] [--out DIR] [--window LO HI]
                                      [--arms base dropout_0.3 dropout_0.5 pow3r] [--reuse] [--no-run]
                                      [override ...]

Runs `configs/rubric_world.yaml` once per (arm, seed) as `python -m dynalize.run` subprocesses,
`--parallel` at a time, into `<out>/<arm>_s<seed>/`; the arms differ only in the `rubric` section:

    base          rubric.dropout.f=0 (fixed rubric)
    dropout_<f>   rubric.dropout.f=<f>: dropout_0.3 and dropout_0.5 by default (the f sweep:
                  --arms base dropout_0.2 dropout_0.3 dropout_0.4 dropout_0.5 dropout_0.6)
    pow3r         rubric.reweight.method=pow3r_port (the port the Rubric Dropout paper compared against)
    pow3r_full    rubric.reweight.method=pow3r (EMA, one-visit lag; not in the default arms)

`--lists` picks the world's rubric / evaluation rubric / flaw lists (a named set of
dynalize/tasks/rubric_world/lists.py, or a YAML file with `rubric`, `eval_rubric`, `flaws`);
extra `key=value` overrides go to every arm. `--reuse` keeps finished runs made with the same
command and config file; `--no-run` only reads `<out>`.

It prints, from each run's held-out evaluations (eval/task.jsonl: proxy and gold on the
out-of-distribution set, every `eval_every` steps) and training metrics (metrics.jsonl):

  - the arms' Peak / End / Final gold, proxy and gap at End, overclaim at End, the in-domain
    full-rubric reward over the last quarter of training steps, mean ± sd over seeds (End = the
    last quarter of evaluations);
  1. the world hacks: in the base arm, proxy keeps rising while gold peaks and falls, per seed
     (proxy at End above proxy at the gold peak, the peak before End, Peak − End ≥ 0.05);
  2. the matched-checkpoint table: gold per checkpoint for each arm (mean over seeds) and win
     counts against base (over seeds × checkpoints);
  3. window means over `--window` steps (gold, proxy, gap, overclaim);
  4. the per-criterion breakdown at End (proxy / gold met rates, mean over seeds);
  5. mask statistics (kept fraction, floor binds) and the judge's verdicts per step per arm
     (dropout asks the same questions);
  6. gold at matched proxy: gold where each run's proxy first reaches a level (does an arm trade
     proxy for gold better, or only optimise more slowly?);
  7. the reviewers' check: gold's score of the same saved replies (the first evaluation's),
     graded again at every evaluation interleaved with the new replies: first vs last, flips.

Plots go to `<out>/plots/` (proxy and gold against step, gap and overclaim against step,
per-criterion gold at End); `summary.json` keeps every number printed, `table.md` the text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_table import launch, ms, run_jobs, table, verdict  # noqa: E402  (same folder)

from dynalize.analysis.rubrics import rubric_run  # noqa: E402
from dynalize.analysis.runs import Run  # noqa: E402
from dynalize.tasks.rubric_world import LISTS  # noqa: E402  (the benchmark may know the lists)

ARMS = {
    "base": ["rubric.dropout.f=0.0"],
    "pow3r": ["rubric.reweight.method=pow3r_port"],
    "pow3r_full": ["rubric.reweight.method=pow3r"],
}
"""Arms besides `dropout_<f>` (any f in (0, 1): rubric.dropout.f=<f>)."""
LABEL = {"base": "fixed rubric", "pow3r": "POW3R-style (port)", "pow3r_full": "POW3R-style (full)"}


def arm_overrides(arm: str) -> list[str]:
    """The `rubric` overrides of an arm; ValueError for an unknown one."""
    if arm in ARMS:
        return ARMS[arm]
    f = float(arm.removeprefix("dropout_")) if arm.startswith("dropout_") else -1.0
    if not 0 < f < 1:
        raise ValueError(f"unknown arm {arm!r}: use base, pow3r, pow3r_full or dropout_<f> with 0 < f < 1")
    LABEL.setdefault(arm, f"dropout f={f:g}")
    return [f"rubric.dropout.f={f}"]
MARGIN = 0.05
"""A 'clear' fall of gold from its peak (gold is in [0, 1])."""
CONFIG = ROOT / "configs" / "rubric_world.yaml"


# --- running ------------------------------------------------------------------------------------

def load_lists(spec: str) -> tuple[str, dict[str, Any]]:
    """(name, task.args with the three lists) for a named set or a YAML/JSON file."""
    if spec in LISTS:
        make_rubric, make_eval, make_flaws = LISTS[spec]
        return spec, {"rubric": [t.model_dump() for t in make_rubric()],
                      "eval_rubric": [t.model_dump() for t in make_eval()],
                      "flaws": [f.model_dump() for f in make_flaws()]}
    path = Path(spec)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return path.stem, {k: data[k] for k in ("rubric", "eval_rubric", "flaws") if k in data}


def run_one(arm: str, seed: int, args: argparse.Namespace, lists: dict[str, Any]) -> dict[str, Any]:
    name = f"{arm}_s{seed}"
    cmd = [sys.executable, "-m", "dynalize.run", "--config", str(CONFIG), f"output_dir={args.out}", f"name={name}",
           f"seed={seed}", f"steps={args.steps}", "progress=false", *arm_overrides(arm),
           *(f"task.args.{k}={json.dumps(v)}" for k, v in lists.items()), *args.overrides]
    return launch(cmd, Path(args.out) / name, CONFIG, args.steps, args.reuse)


# --- reading ------------------------------------------------------------------------------------

def read_run(run_dir: Path, window: tuple[int, int]) -> dict[str, Any]:
    """A run's measurement (dynalize.analysis.rubrics), flat: End over the last quarter of
    evaluations, `window` means over the given steps."""
    r = rubric_run(Run(run_dir))
    w = rubric_run(Run(run_dir), window).end
    return {"steps": r.steps, **r.series, "peak": r.peak, "peak_step": r.peak_step, "proxy_at_peak": r.proxy_at_peak,
            "end": r.end["gold"], "final": r.final, "proxy_end": r.end["proxy"], "proxy_first": r.series["proxy"][0],
            "gap_end": r.end["gap"], "overclaim_end": r.end["overclaim"], "end_steps": [r.end_steps[0], r.end_steps[-1]],
            "window": {k: w[k] for k in ("gold", "proxy", "gap", "overclaim")},
            "criteria_end": r.criteria_end, "criteria_first": r.criteria_first, **r.train}


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and v == v]
    return statistics.fmean(values) if values else float("nan")


# --- the report ---------------------------------------------------------------------------------

def report(res: dict[str, Any], name: str, window: tuple[int, int]) -> tuple[str, dict[str, bool]]:
    seeds, arms, runs = res["seeds"], res["arms"], res["runs"]
    R = lambda arm: [runs[f"{arm}_s{s}"] for s in seeds]  # noqa: E731
    base0 = runs[f"base_s{seeds[0]}"]
    out = [f"## Rubric world, lists `{name}`: {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
           f"{base0['steps'][-1]} steps, held-out proxy/gold every "
           f"{base0['steps'][1] - base0['steps'][0] if len(base0['steps']) > 1 else '?'} steps\n"]
    rows = [[LABEL[a], ms([x["peak"] for x in R(a)]), ms([x["end"] for x in R(a)]), ms([x["final"] for x in R(a)]),
             ms([x["proxy_end"] for x in R(a)]), ms([x["gap_end"] for x in R(a)]), ms([x["overclaim_end"] for x in R(a)]),
             ms([x["full_end"] for x in R(a)])] for a in arms]
    out.append(table(rows, ["arm", "gold Peak", "gold End", "gold Final", "proxy End", "gap End", "overclaim End",
                            "in-domain full (End)"]))
    out.append(f"\nmean ± sd over seeds. Gold and proxy: benchmark scores (HealthBench scoring, clipped to [0, 1]) on "
               f"the held-out, out-of-distribution set, full rubrics; End = mean of the last quarter of evaluations "
               f"(steps {base0['end_steps'][0]}–{base0['steps'][-1]}); in-domain full = the full-rubric reward on "
               f"training batches (proxy judge), mean of the last quarter of steps.\n")
    checks: dict[str, bool] = {}

    rows, ok = [], True
    for s in seeds:
        r = runs[f"base_s{s}"]
        margin = r["peak"] - r["end"]
        good = margin >= MARGIN and r["proxy_end"] > r["proxy_at_peak"] and r["peak_step"] < r["end_steps"][0]
        ok &= good
        rows.append([s, f"{r['proxy_first']:.3f}", f"{r['proxy_at_peak']:.3f}", f"{r['proxy_end']:.3f}",
                     f"{r['peak']:.3f} @ {r['peak_step']}", f"{r['end']:.3f}", f"{margin:+.3f}", verdict(good)])
    checks["the world hacks (base)"] = ok
    out.append(f"### 1. The world hacks: {verdict(ok)} (base arm: proxy End > proxy at the gold peak, peak before "
               f"End, gold Peak − End ≥ {MARGIN})\n")
    out.append(table(rows, ["seed", "proxy first", "proxy @ gold peak", "proxy End", "gold Peak @ step", "gold End",
                            "Peak − End", "ok"]))

    steps = base0["steps"]
    rows = []
    wins = {a: 0 for a in arms if a != "base"}
    pairs = 0
    for k, step in enumerate(steps):
        row = [step]
        for a in arms:
            vals = [x["gold"][k] for x in R(a) if k < len(x["gold"])]
            row.append(f"{mean(vals):.3f}")
        if step > 0:
            pairs += len(seeds)
            for a in wins:
                wins[a] += sum(x["gold"][k] > b["gold"][k] for x, b in zip(R(a), R("base")) if k < len(x["gold"]))
        rows.append(row)
    out.append("\n### 2. Matched checkpoints: held-out gold per checkpoint (mean over seeds)\n")
    out.append(table(rows, ["step", *[LABEL[a] for a in arms]]))
    out.append("\nWins against the fixed rubric (same seed, same checkpoint, step > 0): "
               + ", ".join(f"{LABEL[a]} {w}/{pairs}" for a, w in wins.items()) + ".")

    rows = [[LABEL[a], *[ms([x["window"][k] for x in R(a)]) for k in ("gold", "proxy", "gap", "overclaim")]]
            for a in arms]
    out.append(f"\n### 3. Window means, steps {window[0]}–{window[1]}\n")
    out.append(table(rows, ["arm", "gold", "proxy", "gap", "overclaim"]))

    crit = list(base0["criteria_end"])
    rows = [[c, *[f"{mean([x['criteria_first'][c][0] for x in R('base')]):.2f} / "
                  f"{mean([x['criteria_first'][c][1] for x in R('base')]):.2f}"],
             *[f"{mean([x['criteria_end'][c][0] for x in R(a)]):.2f} / {mean([x['criteria_end'][c][1] for x in R(a)]):.2f}"
               for a in arms]] for c in crit]
    out.append("\n### 4. Per criterion: held-out met rate, proxy / gold (step 0, then End per arm; mean over seeds)\n")
    out.append(table(rows, ["criterion", "step 0", *[LABEL[a] for a in arms]]))

    rows = [[LABEL[a], ms([x["kept_frac"] for x in R(a)]), ms([x["floor_binds"] for x in R(a)]),
             ms([x["verdicts_per_step"] for x in R(a)]), ms([1000 * x["score_s"] for x in R(a)]),
             ms([x["step_s"] for x in R(a)])] for a in arms]
    out.append("\n### 5. Masks and the judge: kept fraction of positive criteria, groups where the floor binds, "
               "verdicts asked per step, score phase (ms) and step time (s) per step\n")
    out.append(table(rows, ["arm", "kept fraction", "floor binds", "verdicts / step", "score ms", "step s"]))

    levels = proxy_levels(res)
    rows = [[LABEL[a], *[matched_proxy(R(a), level) for level in levels]] for a in arms]
    out.append("\n### 6. Gold at matched proxy: held-out gold where each run's held-out proxy first reaches a "
               "level (linear between evaluations; mean ± sd over seeds, n/a for a run that never reaches it)\n")
    out.append(table(rows, ["arm", *[f"proxy {v:.2f}" for v in levels]]))
    out.append("\nAn arm above the fixed rubric here trades proxy for gold better; an arm that only wins at matched "
               "checkpoints (section 2) optimises the same trade-off more slowly.")

    rows = []
    for a in arms:
        for s in seeds:
            x = runs[f"{a}_s{s}"]
            first, last = x["anchor_gold"][0], x["anchor_gold"][-1]
            rows.append([f"{LABEL[a]} s{s}", f"{first:.3f}", f"{last:.3f}", f"{max(x['anchor_flips']):.3f}",
                         f"{x['gold'][0]:.3f} → {x['gold'][-1]:.3f}"])
    stable = all(r[1] == r[2] for r in rows)
    checks["gold stable on identical text"] = stable
    out.append(f"\n### 7. Reviewers' check: the first evaluation's replies graded by gold again at every evaluation, "
               f"interleaved with the new ones: {verdict(stable)}\n")
    out.append(table(rows, ["run", "anchor gold, first", "anchor gold, last", "max flips", "gold on new replies"]))
    return "\n".join(out), checks


def proxy_levels(res: dict[str, Any], n: int = 4) -> list[float]:
    """`n` proxy levels every run passes through: from just above the highest first proxy to the
    lowest best proxy."""
    runs = list(res["runs"].values())
    lo = max(r["proxy"][0] for r in runs) + 0.05
    hi = min(max(r["proxy"]) for r in runs)
    return [round(lo + (hi - lo) * k / (n - 1), 3) for k in range(n)] if hi > lo else [hi]


def gold_at_proxy(run: dict[str, Any], level: float) -> float:
    """Gold where the run's proxy first reaches `level`, linear between evaluations (NaN if never)."""
    xs, ys = run["proxy"], run["gold"]
    for i in range(1, len(xs)):
        if xs[i - 1] < level <= xs[i]:
            t = (level - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return float("nan")


def matched_proxy(runs: list[dict[str, Any]], level: float) -> str:
    return ms([gold_at_proxy(r, level) for r in runs])


# --- plots --------------------------------------------------------------------------------------

def plots(res: dict[str, Any], plot_dir: Path, name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    seeds, arms, runs = res["seeds"], res["arms"], res["runs"]
    palette = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive"]
    colors = dict(zip(arms, palette * 2))
    written = []

    def panel(ax, key: str, title: str) -> None:
        for a in arms:
            curves = [runs[f"{a}_s{s}"][key] for s in seeds]
            x = runs[f"{a}_s{seeds[0]}"]["steps"]
            n = min(map(len, curves))
            for c in curves:
                ax.plot(x[:len(c)], c, color=colors[a], alpha=0.2, lw=0.8)
            ax.plot(x[:n], [mean([c[i] for c in curves]) for i in range(n)], color=colors[a], lw=2, label=LABEL[a])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panel(axes[0], "proxy", "held-out proxy score (training judge)")
    panel(axes[1], "gold", "held-out gold score")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Rubric world, lists '{name}' (thin: seeds; thick: mean)")
    fig.tight_layout()
    written.append(plot_dir / "proxy_gold.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panel(axes[0], "gap", "proxy − gold")
    panel(axes[1], "overclaim", "overclaim: proxy-met criteria gold marks unmet")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    written.append(plot_dir / "gap_overclaim.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    crit = list(runs[f"base_s{seeds[0]}"]["criteria_end"])
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(crit) + 2), 4))
    width = 0.8 / len(arms)
    for i, a in enumerate(arms):
        ys = [mean([runs[f"{a}_s{s}"]["criteria_end"][c][1] for s in seeds]) for c in crit]
        ax.bar([k + i * width for k in range(len(crit))], ys, width, color=colors[a], label=LABEL[a])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(crit))])
    ax.set_xticklabels(crit, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("gold met rate at End")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    written.append(plot_dir / "criteria_end.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lists", default="default", help="default, alternative, or a YAML/JSON file")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["base", "dropout_0.3", "dropout_0.5", "pow3r"],
                    help="base, dropout_<f> (e.g. dropout_0.2 ... dropout_0.6 for the f sweep), pow3r, pow3r_full")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (each uses torch_threads threads)")
    ap.add_argument("--window", nargs=2, type=int, default=[50, 100], metavar=("LO", "HI"))
    ap.add_argument("--out", default=None, help="runs and plots go here (default runs/rubric_table_<lists>)")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs made with the same command")
    ap.add_argument("--no-run", action="store_true", help="only analyse the runs already in --out")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for every arm, e.g. trainer.lr=2e-4")
    args = ap.parse_args(argv)
    if "base" not in args.arms:
        ap.error("--arms must include base (everything is compared with it)")
    try:
        for arm in args.arms:
            arm_overrides(arm)
    except ValueError as e:
        ap.error(str(e))
    name, lists = load_lists(args.lists)
    args.out = str(Path(args.out or ROOT / "runs" / f"rubric_table_{name}").resolve())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.no_run:
        run_jobs([(a, s) for s in args.seeds for a in args.arms], lambda a, s: run_one(a, s, args, lists),
                 args.parallel)
    window = (args.window[0], args.window[1])
    res = {"seeds": args.seeds, "arms": args.arms, "lists": name,
           "runs": {f"{a}_s{s}": read_run(Path(args.out) / f"{a}_s{s}", window) for a in args.arms for s in args.seeds}}
    text, checks = report(res, name, window)
    print(text)
    print(f"\n(wall time of this invocation: {(time.perf_counter() - t0) / 60:.1f} min; runs in {args.out})")
    written = plots(res, Path(args.out) / "plots", name)
    print("plots: " + ", ".join(str(p) for p in written))
    res["checks"] = checks
    (Path(args.out) / "summary.json").write_text(json.dumps(res, indent=1, default=str))
    (Path(args.out) / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
