"""The rubric world: fixed-rubric GRPO against Rubric Dropout, its controls and POW3R-style reweighting, over seeds.

    python benchmarks/rubric_table.py [--world fast|paced|FILE.yaml] [--lists default|alternative|FILE.yaml]
                                      [--steps N] [--seeds 0 1 2] [--parallel 2] [--out DIR] [--window LO HI]
                                      [--arms base,dropout_0.3,dropout_0.5,pow3r] [--reuse] [--no-run]
                                      [override ...]

Runs the world's config (`--world fast`: configs/rubric_world.yaml, 100 steps at lr 3e-4, where the
hack is complete by step 30-40; `paced`: configs/rubric_world_paced.yaml, the same world over 150
steps at lr 1e-4 with a 75-step warmup, where the fixed rubric's gold peaks at 40-53 % of the run on
3 seeds) once per (arm, seed) as `python -m dynalize.run` subprocesses, `--parallel` at a time,
into `<out>/<arm>_s<seed>/`; the arms differ only in their own fields (set after the overrides):

    base / fixed      rubric.dropout.f=0 (fixed rubric)
    dropout_<f>       rubric.dropout.f=<f> (the f sweep: dropout_0.2 ... dropout_0.6)
    lr_scaled_<f>     the fixed rubric at trainer.lr × (1 − f): dropout's expected step (Observation 1)
    annealed_<f>      dropout from f to 0 over the run (schedule linear); annealed_cosine_<f>: cosine
    noise_<f>         the fixed rubric plus dropout's variance at f as zero-mean noise (rubric.noise.f)
    pow3r             rubric.reweight.method=pow3r_port (the port the Rubric Dropout paper compared against)
    pow3r_full        rubric.reweight.method=pow3r (EMA, one-visit lag; not in the default arms)

The question the controls answer: is dropout better, or only slower (the lr_scaled arm), or only
noisier (noise), or an implicit early stop (annealed)? Section 8, the frontier, says.

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
     (proxy at End above proxy at the gold peak, the peak before End, Peak − End ≥ 0.05), and
     where in the run the peak is (paced: 40-60 % on every seed);
  2. the matched-checkpoint table: gold per checkpoint for each arm (mean over seeds) and win
     counts against base (over seeds × checkpoints);
  3. window means over `--window` steps (gold, proxy, gap, overclaim);
  4. the per-criterion breakdown at End (proxy / gold met rates, mean over seeds);
  5. mask statistics (kept fraction, floor binds) and the judge's verdicts per step per arm
     (dropout asks the same questions);
  6. gold at matched proxy: gold where each run's proxy first reaches a level (does an arm trade
     proxy for gold better, or only optimise more slowly?);
  7. the reviewers' check: gold's score of the same saved replies (the first evaluation's),
     graded again at every evaluation interleaved with the new replies: first vs last, flips;
  8. the frontier (dynalize.analysis.frontier): per arm, gold against overclaim and against proxy
     over all checkpoints, each seed against the fixed rubric's seed at matched overclaim / proxy,
     the mean difference with a t interval over seeds, and a verdict made from it (above / on it /
     below), then which reading the dropout arms support.

Plots go to `<out>/plots/` (proxy and gold against step, gap and overclaim against step,
per-criterion gold at End, the frontier); `summary.json` keeps every number printed, `table.md` the text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_table import launch, ms, run_jobs, table, verdict  # noqa: E402  (same folder)

from rubric_plots import mean, plots  # noqa: E402  (same folder)

from dynalize.analysis import frontier  # noqa: E402
from dynalize.analysis.rubrics import rubric_run  # noqa: E402
from dynalize.analysis.runs import Run  # noqa: E402
from dynalize.tasks.rubric_world import LISTS  # noqa: E402  (the benchmark may know the lists)

ARMS = {
    "base": ["rubric.dropout.f=0.0"],
    "pow3r": ["rubric.reweight.method=pow3r_port"],
    "pow3r_full": ["rubric.reweight.method=pow3r"],
}
"""Arms without a fraction; `fixed` is another name for `base`."""
LABEL = {"base": "fixed rubric", "pow3r": "POW3R-style (port)", "pow3r_full": "POW3R-style (full)"}
KINDS = {  # arm kind with a fraction f: (its overrides, its label)
    "dropout": (lambda f, lr: [f"rubric.dropout.f={f}"], "dropout f={f:g}"),
    "lr_scaled": (lambda f, lr: ["rubric.dropout.f=0.0", f"trainer.lr={lr * (1 - f):.6g}"], "fixed rubric, lr × {c:g}"),
    "annealed": (lambda f, lr: [f"rubric.dropout.f={f}", "rubric.dropout.schedule=linear"], "dropout f={f:g} → 0"),
    "annealed_cosine": (lambda f, lr: [f"rubric.dropout.f={f}", "rubric.dropout.schedule=cosine"],
                        "dropout f={f:g} → 0 (cosine)"),
    "noise": (lambda f, lr: ["rubric.dropout.f=0.0", f"rubric.noise.f={f}"], "noise control (f={f:g})"),
}
"""dropout_<f>: Rubric Dropout at f; lr_scaled_<f>: the fixed rubric at lr × (1 − f), dropout's expected
step (Observation 1); annealed_<f> / annealed_cosine_<f>: dropout from f to 0 over the run;
noise_<f>: the fixed rubric plus dropout's variance at f as noise (rubric.noise)."""
WORLDS = {"fast": "rubric_world.yaml", "paced": "rubric_world_paced.yaml"}


def parse_arm(arm: str) -> tuple[str, float | None]:
    """(kind, f) of an arm name: `base` / `fixed`, `pow3r`, `pow3r_full`, or `<kind>_<f>` / `<kind><f>`
    with kind in KINDS and 0 < f < 1; ValueError for anything else."""
    if arm in ("base", "fixed") or arm in ARMS:
        return ("base" if arm == "fixed" else arm), None
    m = re.fullmatch(r"([a-z_]+?)_?(0?\.[0-9]+)", arm)
    if not m or m.group(1) not in KINDS or not 0 < float(m.group(2)) < 1:
        raise ValueError(f"unknown arm {arm!r}: use base (fixed), pow3r, pow3r_full or "
                         f"{' / '.join(KINDS)} followed by a fraction 0 < f < 1 (e.g. dropout_0.3, noise0.5)")
    return m.group(1), float(m.group(2))


def canonical(arm: str) -> str:
    """The arm's run-directory name: `fixed` -> `base`, `dropout0.3` -> `dropout_0.3`."""
    kind, f = parse_arm(arm)
    return kind if f is None else f"{kind}_{f:g}"


def arm_overrides(arm: str, lr: float = 3e-4) -> list[str]:
    """The overrides of an arm (`lr`: the world's learning rate, which lr_scaled arms scale)."""
    kind, f = parse_arm(arm)
    if f is None:
        return ARMS[kind]
    make, label = KINDS[kind]
    LABEL.setdefault(canonical(arm), label.format(f=f, c=1 - f))
    return make(f, lr)


MARGIN = 0.05
"""A 'clear' fall of gold from its peak (gold is in [0, 1])."""
PACE = (0.4, 0.6)
"""The paced world's aim: the fixed rubric's gold peaks in this share of the run."""
CONFIG = ROOT / "configs" / "rubric_world.yaml"
"""The fast world's config (`--world fast`, the default)."""


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


def world_config(spec: str) -> Path:
    """The config of a world: `fast`, `paced` (configs/) or a YAML file."""
    return ROOT / "configs" / WORLDS[spec] if spec in WORLDS else Path(spec).resolve()


def world_lr(config: Path, overrides: list[str]) -> float:
    """The learning rate every arm runs at: a `trainer.lr=` override, else the config's."""
    for o in reversed(overrides):
        if o.startswith("trainer.lr="):
            return float(o.split("=", 1)[1])
    return float(yaml.safe_load(config.read_text(encoding="utf-8"))["trainer"]["lr"])


def run_one(arm: str, seed: int, args: argparse.Namespace, lists: dict[str, Any]) -> dict[str, Any]:
    name = f"{arm}_s{seed}"
    cmd = [sys.executable, "-m", "dynalize.run", "--config", str(args.config), f"output_dir={args.out}", f"name={name}",
           f"seed={seed}", f"steps={args.steps}", "progress=false",
           *(f"task.args.{k}={json.dumps(v)}" for k, v in lists.items()), *args.overrides,
           *arm_overrides(arm, world_lr(args.config, args.overrides))]  # the arm's fields win
    return launch(cmd, Path(args.out) / name, args.config, args.steps, args.reuse)


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

    rows, ok, paced = [], True, True
    for s in seeds:
        r = runs[f"base_s{s}"]
        margin = r["peak"] - r["end"]
        good = margin >= MARGIN and r["proxy_end"] > r["proxy_at_peak"] and r["peak_step"] < r["end_steps"][0]
        ok &= good
        share = r["peak_step"] / r["steps"][-1] if r["steps"][-1] else float("nan")
        paced &= PACE[0] <= share <= PACE[1]
        rows.append([s, f"{r['proxy_first']:.3f}", f"{r['proxy_at_peak']:.3f}", f"{r['proxy_end']:.3f}",
                     f"{r['peak']:.3f} @ {r['peak_step']}", f"{100 * share:.0f} %", f"{r['end']:.3f}",
                     f"{margin:+.3f}", verdict(good)])
    checks["the world hacks (base)"] = ok
    checks["paced: gold peaks at 40-60 % of the run (base)"] = paced
    out.append(f"### 1. The world hacks: {verdict(ok)} (base arm: proxy End > proxy at the gold peak, peak before "
               f"End, gold Peak − End ≥ {MARGIN}); paced (gold peak at {100 * PACE[0]:.0f}–{100 * PACE[1]:.0f} % of "
               f"the run on every seed): {'yes' if paced else 'no'}\n")
    out.append(table(rows, ["seed", "proxy first", "proxy @ gold peak", "proxy End", "gold Peak @ step",
                            "peak at % of run", "gold End", "Peak − End", "ok"]))

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

    results = frontier.frontiers({a: R(a) for a in arms}, "base")
    res["frontier"] = frontier.summary(results)
    out.append("\n### 8. The frontier: held-out gold against overclaim and against proxy, every checkpoint "
               "(step > 0), each seed against the fixed rubric's seed at the same overclaim / proxy (its curve "
               "interpolated; checkpoints outside its range left out); Δ = mean over seeds, 95 % t interval\n")
    out.append(table(*reversed(frontier.frontier_rows(results, LABEL))))
    out.append("")
    out += [f"- {line}" for line in frontier.sentences(results, LABEL)]
    dropout_arms = [a for a in arms if parse_arm(a)[0] == "dropout"]
    out.append(f"\n**Reading.** {frontier.reading(results, dropout_arms)}")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lists", default="default", help="default, alternative, or a YAML/JSON file")
    ap.add_argument("--world", default="fast", help="fast (configs/rubric_world.yaml), paced "
                    "(configs/rubric_world_paced.yaml) or a config file")
    ap.add_argument("--steps", type=int, default=None, help="default: the world config's")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seed values (e.g. 0 1 2)")
    ap.add_argument("--arms", nargs="+", default=["base", "dropout_0.3", "dropout_0.5", "pow3r"],
                    help="space- or comma-separated: base (or fixed), dropout_<f>, lr_scaled_<f>, annealed_<f>, "
                         "annealed_cosine_<f>, noise_<f>, pow3r, pow3r_full (the _ is optional: dropout0.3)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (each uses torch_threads threads)")
    ap.add_argument("--window", nargs=2, type=int, default=None, metavar=("LO", "HI"),
                    help="default: the second half of the run")
    ap.add_argument("--out", default=None,
                    help="runs and plots go here (default runs/rubric_table_<lists>, _<world> for other worlds)")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs made with the same command")
    ap.add_argument("--no-run", action="store_true", help="only analyse the runs already in --out")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for every arm, e.g. trainer.lr=2e-4")
    args = ap.parse_args(argv)
    args.config = world_config(args.world)
    if not args.config.is_file():
        ap.error(f"--world {args.world}: no such config ({args.config})")
    try:
        args.arms = list(dict.fromkeys(canonical(a) for spec in args.arms for a in spec.split(",") if a))
        for arm in args.arms:
            arm_overrides(arm, world_lr(args.config, args.overrides))
    except (ValueError, KeyError, TypeError) as e:
        ap.error(str(e))
    if "base" not in args.arms:
        ap.error("--arms must include base (or fixed): everything is compared with it")
    args.steps = args.steps or int(yaml.safe_load(args.config.read_text(encoding="utf-8"))["steps"])
    name, lists = load_lists(args.lists)
    suffix = "" if args.world == "fast" else f"_{args.config.stem.removeprefix('rubric_world_')}"
    args.out = str(Path(args.out or ROOT / "runs" / f"rubric_table_{name}{suffix}").resolve())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.no_run:
        run_jobs([(a, s) for s in args.seeds for a in args.arms], lambda a, s: run_one(a, s, args, lists),
                 args.parallel)
    window = (args.window[0], args.window[1]) if args.window else (args.steps // 2, args.steps)
    res = {"seeds": args.seeds, "arms": args.arms, "lists": name, "world": str(args.config),
           "runs": {f"{a}_s{s}": read_run(Path(args.out) / f"{a}_s{s}", window) for a in args.arms for s in args.seeds}}
    text, checks = report(res, name, window)
    print(text)
    print(f"\n(wall time of this invocation: {(time.perf_counter() - t0) / 60:.1f} min; runs in {args.out})")
    written = plots(res, Path(args.out) / "plots", name, LABEL)
    written.append(frontier.plot({LABEL[a]: [res["runs"][f"{a}_s{s}"] for s in args.seeds] for a in args.arms},
                                 Path(args.out) / "plots" / "frontier.png",
                                 title=f"Rubric world, lists '{name}', world '{args.world}': gold frontier per seed"))
    print("plots: " + ", ".join(str(p) for p in written))
    res["checks"] = checks
    (Path(args.out) / "summary.json").write_text(json.dumps(res, indent=1, default=str))
    (Path(args.out) / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
