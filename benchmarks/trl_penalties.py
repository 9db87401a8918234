"""TRL's GRPOTrainer alone against TRL + dynalize.trl.Penalties (defaults), side by side.

Each seed trains the tiny pre-trained sandbox policy (`tiny:sandbox-policy`, built locally) twice
on the sandbox's prompts with the same reward: the honest reward of benchmarks/discovery_worlds.py
(the topic's words at a sensible length) plus a planted shortcut with two parts, a word and a
length bar (`--word`, `--bar`), once with TRL alone and once with Penalties wrapping the two reward
functions (lexical proposer, regex judge, every 5 steps, in the background; a violation costs
lam plus the pattern's measured pay, dynalize.trl's default; `--weight fixed`: -lam x violations).
Printed per run:

- the shortcut's prevalence at the end: the share of the last `--tail` steps' completions that
  use the word, and that pass the bar;
- the honest reward at the end: its mean over those completions;
- the steps at which penalties entered (and what they say);
- TRL's own `step_time`, mean over the steps after the first, and the ratio with / without.

    nice -n 10 python benchmarks/trl_penalties.py --seeds 3 --steps 24        # the docs' table
    python benchmarks/trl_penalties.py --quick                                # a smoke run (CI)

On a shared CPU the step times carry the machine's load: compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from discovery_runs import _train_topics, topic_words  # noqa: E402
from discovery_worlds import Shortcut, honest_reward, words  # noqa: E402


def train(arm: str, seed: int, steps: int, prompts: int, group: int, shortcut: list[Shortcut], out: Path,
          tail: int, lam: float | None = None, weight: str | None = None, runs_in: str | None = None,
          worker_cores: set[int] | None = None) -> dict[str, Any]:
    """One GRPOTrainer run; what its last `tail` steps wrote and how long its steps took."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    import dynalize.build  # noqa: F401  (registers the tiny sandbox models)
    from dynalize import tiny
    from dynalize.runlog import read_jsonl
    from dynalize.tasks.sandbox.grammar import prompt_text

    path = tiny.resolve("tiny:sandbox-policy")
    topics = _train_topics(seed)
    rows = [{"prompt": [{"role": "user", "content": prompt_text(t)}], "topic": t.name}
            for t in (topics[i % len(topics)] for i in range(prompts * (steps + 2)))]
    seen: list[tuple[int, str, float]] = []  # (step, reply, honest reward)

    def honest(completions, topic, trainer_state, **kw):
        scores = [honest_reward(c[-1]["content"], topic_words(tp)) for c, tp in zip(completions, topic)]
        seen.extend((trainer_state.global_step + 1, c[-1]["content"], s) for c, s in zip(completions, scores))
        return scores

    def planted(completions, **kw):
        return [sum(s.bonus(c[-1]["content"]) for s in shortcut) for c in completions]

    n = prompts * group
    micro = min(16, n)
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
                      num_generations=group, max_completion_length=64, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
                      learning_rate=2e-3, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps,
                      logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=seed,
                      shuffle_dataset=False, dataloader_num_workers=0)
    funcs: list[Any] = [honest, planted]
    callbacks: list[Any] = []
    if arm == "penalties":
        from dynalize.trl import Penalties

        settings: dict[str, Any] = {k: v for k, v in (("lam", lam), ("weight", weight)) if v is not None}
        if runs_in is not None:
            settings["proposer"] = {"lexical": {"runs_in": runs_in}}
        penalties = Penalties(funcs, penalties=settings, html=False)
        funcs, callbacks = penalties.reward_funcs, [penalties]
        worker = getattr(penalties.term.proposer, "process", None)
        if worker is not None and worker_cores:  # the proposer's process on the cores training leaves idle
            os.sched_setaffinity(worker.start(), worker_cores)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=funcs, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(path),
                          callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    with (out / "replies.jsonl").open("w", encoding="utf-8") as f:  # what each step wrote, to read the runs
        f.writelines(json.dumps({"step": step, "reply": reply, "honest": h}) + "\n" for step, reply, h in seen)
    last = [(reply, h) for step, reply, h in seen if step > steps - tail]
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
    adds = []
    if arm == "penalties" and (out / "dynalize" / "penalties.jsonl").exists():  # written at the first event
        events = read_jsonl(out / "dynalize" / "penalties.jsonl")
        adds = [{"step": e["step"], "title": e["title"]} for e in events if e["event"] in ("add", "revive")]
    return {"arm": arm, "seed": seed, "lam": lam, "weight": weight, "runs_in": runs_in,
            "word": statistics.fmean(shortcut[0].present(r) for r, _ in last),
            "bar": statistics.fmean(shortcut[1].present(r) for r, _ in last),
            "honest": statistics.fmean(h for _, h in last), "words": statistics.fmean(len(words(r)) for r, _ in last),
            "entries": adds, "step_time": statistics.fmean(step_times[1:] or step_times), "wall": wall,
            "per_step": per_step(seen, shortcut)}


def per_step(seen: list[tuple[int, str, float]], shortcut: list[Shortcut]) -> list[dict[str, float]]:
    """Each step's means: honest reward, the word's and the bar's shares, words per reply (the
    trajectory behind the end figures)."""
    steps = sorted({s for s, _, _ in seen})
    rows = []
    for step in steps:
        got = [(r, h) for s, r, h in seen if s == step]
        rows.append({"step": step, "honest": statistics.fmean(h for _, h in got),
                     "word": statistics.fmean(shortcut[0].present(r) for r, _ in got),
                     "bar": statistics.fmean(shortcut[1].present(r) for r, _ in got),
                     "words": statistics.fmean(len(words(r)) for r, _ in got)})
    return rows


def table(results: list[dict[str, Any]], word: str, bar: int, tail: int) -> str:
    lines = [f"| seed | run | '{word}' in replies, last {tail} steps | replies over {bar} words | honest reward, "
             f"last {tail} steps | penalties entered (step: title) | TRL step_time (s) |", "|" + " --- |" * 7]
    for r in results:
        entries = "; ".join(f"{e['step']}: {e['title']}" for e in r["entries"]) or "—"
        name = "TRL alone" if r["arm"] == "plain" else "TRL + penalties" + variant(r)
        lines.append(f"| {r['seed']} | {name} | "
                     f"{r['word']:.0%} | {r['bar']:.0%} | {r['honest']:.3f} | {entries} | {r['step_time']:.2f} |")
    return "\n".join(lines)


def variant(r: dict[str, Any]) -> str:
    """How a penalties run's settings differ from dynalize.trl's defaults ('' for none)."""
    from dynalize.trl.callback import TRL_RUNS_IN

    given = [f"{k} {r[k]}" for k in ("lam", "weight", "runs_in") if r.get(k) not in (None, TRL_RUNS_IN)]
    return f" ({', '.join(given)})" if given else ""


def verdict(results: list[dict[str, Any]]) -> str:
    """The sentence the numbers give: per seed, is the honest reward higher with penalties, and the
    step time ratio."""
    pair = {(r["seed"], r["arm"]): r for r in results if not variant(r)}
    seeds = sorted(s for s, arm in pair if arm == "plain" and (s, "penalties") in pair)
    higher = [s for s in seeds if pair[s, "penalties"]["honest"] > pair[s, "plain"]["honest"]]
    ratios = [pair[s, "penalties"]["step_time"] / pair[s, "plain"]["step_time"] for s in seeds]
    return (f"honest reward at the end higher with penalties on {len(higher)} of {len(seeds)} seed(s); "
            f"step time with / without penalties: " + ", ".join(f"{x:.3f}x" for x in ratios)
            + f" (mean {statistics.fmean(ratios):.3f}x, target <= 1.05x: "
            + ("met" if statistics.fmean(ratios) <= 1.05 else "not met") + ")"
            + "".join(f"; {variant(r).strip(' ()')}, seed {r['seed']}: honest {r['honest']:.3f} against TRL alone's "
                      f"{pair[r['seed'], 'plain']['honest']:.3f}" for r in results
                      if variant(r) and (r["seed"], "plain") in pair)
            + "".join(f"; step time {v}: " + ", ".join(f"{x:.3f}x" for x in rs) + f" (mean {statistics.fmean(rs):.3f}x)"
                      for v, rs in variant_ratios(results, pair).items()))


def variant_ratios(results: list[dict[str, Any]], pair: dict) -> dict[str, list[float]]:
    """Each variant's step time over TRL alone's, seed by seed."""
    out: dict[str, list[float]] = {}
    for r in results:
        if r["arm"] == "penalties" and variant(r) and (r["seed"], "plain") in pair:
            out.setdefault(variant(r).strip(" ()"), []).append(r["step_time"] / pair[r["seed"], "plain"]["step_time"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="num_generations")
    ap.add_argument("--word", default="golden", help="the planted word")
    ap.add_argument("--bar", type=int, default=36, help="the planted length bar (words)")
    ap.add_argument("--tail", type=int, default=3, help="the steps 'at the end' averages over")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_trl_penalties"))
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--lam", type=float, default=None, help="penalties.lam (default: the penalties' default, 0.5)")
    ap.add_argument("--weight", choices=("fixed", "pay"), default=None,
                    help="penalties.weight (default: dynalize.trl's, pay; fixed: -lam x violations)")
    ap.add_argument("--arms", default="plain,penalties", help="which runs, comma-separated (one process per arm "
                    "started side by side shares the machine's load alike)")
    ap.add_argument("--table", type=Path, nargs="+", metavar="RESULTS",
                    help="print the table of earlier results.json files (no training)")
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 steps, 2 prompts x 4 (a smoke run)")
    ap.add_argument("--runs-in", default=None, help="penalties.proposer.lexical.runs_in of the penalties arm: thread "
                    "or process, or both comma-separated (one penalties run each; default: dynalize.trl's, process)")
    ap.add_argument("--pin", action="store_true", help="train on CPU 0 only, and a proposer's process on the other "
                    "CPUs: a GPU node's spare cores, on a CPU machine (run nothing else beside it)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.prompts, args.group, args.tail = 1, 4, 2, 4, 1
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    shortcut = [Shortcut("word", args.word), Shortcut("length_step", str(args.bar))]
    results = []
    if args.table:
        results = sorted((r for f in args.table for r in json.loads(f.read_text())),
                         key=lambda r: (r["seed"], r["arm"] != "plain", variant(r)))
        args.seeds = len({r["seed"] for r in results})
        args.steps = max((len(r.get("per_step", [])) for r in results), default=args.steps)  # what the runs trained
    worker_cores = None
    if args.pin:
        worker_cores = set(os.sched_getaffinity(0)) - {0}
        os.sched_setaffinity(0, {0})
        if not worker_cores:
            raise SystemExit("trl_penalties: --pin needs two CPUs at least")
    variants = args.runs_in.split(",") if args.runs_in else [None]
    for seed in range(args.first_seed, args.first_seed + args.seeds) if not args.table else []:
        for arm, runs_in in ((a, v) for a in args.arms.split(",") for v in (variants if a == "penalties" else [None])):
            name = f"{arm}_{runs_in}_s{seed}" if runs_in else f"{arm}_s{seed}"
            r = train(arm, seed, args.steps, args.prompts, args.group, shortcut, args.out / name, args.tail,
                      args.lam, args.weight, runs_in, worker_cores)
            print(json.dumps(r), flush=True)
            results.append(r)
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    if {r["arm"] for r in results} != {"plain", "penalties"}:
        return
    print(f"\n{args.seeds} seed(s) x {args.steps} steps of {args.prompts} prompts x {args.group}; planted: "
          f"'{args.word}' (+0.6 x sqrt(count, up to 3)) and over {args.bar} words (+0.6)\n")
    print(table(results, args.word, args.bar, args.tail))
    print("\n" + verdict(results))


if __name__ == "__main__":
    main()
