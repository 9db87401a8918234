"""Penalty overhead: Dynalize step time against RM-only on the same config (issue 3, "Cost and speed").

    python benchmarks/penalty_overhead.py [--steps 8] [--warmup 2] [--repeats 2] [--threads 1]
                                          [--latency 0.02] [--only ARM ...] [--json out.json]

All arms run in this one process, one after the other, on the same task, tiny policy, seed and
sampling (8 prompts × G samples, 64 new tokens, temperature 1), each for `--warmup` discarded
steps then `--steps` measured ones:

  rm-only         penalties off: reward = RM                                       (the baseline)
  lexical+regex   the CPU default: lexical proposer (every 2 steps) + regex judge
  phrase          a proposer that proposes the phrase "the" at every proposal (every 2 steps), regex
                  judge, without and with confirmation (penalties.confirm, on by default in a run
                  with an RM): each proposal's candidate checked by the run's RM on up to 4 x 32
                  edited replies before it enters. Its step time against the arm without, paired
                  by pass, and the replies it rescored: issue 57's target ≤ 1.02 (the lexical
                  proposer finds no candidate in a short tiny-policy run, so it would check none)
  llm-judge ×k    a ChatModel judge with a fixed injected latency, k = 1, 4, 16 active penalties
                  pre-loaded (no regex, so every one goes to the LLM). The scripted judge answers
                  valid JSON, `true` for every id it is asked about: no penalty retires, every
                  reward moves by the same −λ·k, so advantages, updates and generated text stay
                  those of rm-only and the step-time difference is the judge's alone.
  slow-proposer   a proposer that sleeps 30 s and proposes nothing, started at step 0: training
                  must not wait for it (target: step time ≤ 1.02 × rm-only).

`llm-judge` and `rm-only` also run at 2× the batch (G = 16) to show that judge calls grow with
rollouts (one call per rollout, whatever the number of penalties) and not with penalties.

Reported per arm: step time (median, mean ± sd), time spent scoring (RM + judge), judge calls
per step and per rollout, judge latency (mean, max per call), and the step-time ratio against
rm-only at the same batch size (median step time of each pass over the rm-only median of the
same pass, geometric mean over passes), and each run's wall time (model loading, all steps and
the final checkpoint: the slow proposer must not hold up the end of a run either) with the
end-of-run wait (the last step's `time/finish`: the proposal still in flight is not awaited,
`penalties.finish_timeout` 0, but kept in the checkpoint). The slow-proposer sentence is computed
from these numbers. Step times are the loop's `time/step` (the final checkpoint, written after the
last step, is not in it). The task is the sandbox task when it imports, else
the toy task of tests/toytask.py. Nothing is downloaded: the tiny policy is built locally.

Timing on a shared 2-core machine is noisy: every arm runs `--repeats` times (default 2), the
order reversed on every other pass (so rm-only and the slow-proposer arm run a, d, d, a), and
the load average is printed under the table. The whole benchmark takes about 2-3 minutes on 2
cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):  # the package, and tests/toytask.py for the fallback task
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

TARGET = 1.02
PROMPTS_PER_STEP, GROUP, MAX_NEW_TOKENS = 8, 8, 64
PROPOSER_SLEEP = 30.0


@dataclass(frozen=True)
class Arm:
    key: str
    label: str
    kind: str  # rm | lexical | phrase | confirm | llm | sleepy
    group: int = GROUP
    penalties: int = 0

    @property
    def batch(self) -> int:
        return PROMPTS_PER_STEP * self.group


ARMS = [  # (d) right after (a): with the order reversed on every other pass they run a, d, d, a
    Arm("rm", "(a) rm-only", "rm"),
    Arm("sleepy", f"(d) proposer sleeping {PROPOSER_SLEEP:.0f} s", "sleepy"),
    Arm("lexical", "(b) lexical + regex judge", "lexical"),
    Arm("phrase", "(b) phrase proposer + regex judge", "phrase"),
    Arm("confirm", "(b) phrase proposer + regex judge + confirmation", "confirm"),
    Arm("llm1", "(c) llm judge, 1 penalty", "llm", penalties=1),
    Arm("llm4", "(c) llm judge, 4 penalties", "llm", penalties=4),
    Arm("llm16", "(c) llm judge, 16 penalties", "llm", penalties=16),
    Arm("rm_2x", "(a) rm-only, 2x batch", "rm", group=2 * GROUP),
    Arm("llm16_2x", "(c) llm judge, 16 penalties, 2x batch", "llm", group=2 * GROUP, penalties=16),
]


def pick_task() -> tuple[str, str]:
    """(task name for the config, what to print): sandbox if it is there and has prompts, else toy."""
    try:
        from dynalize.tasks.base import build_task

        task = build_task("sandbox", {}, 0)
        if len(task.prompts("train")) >= PROMPTS_PER_STEP and task.reward_model() is not None:
            return "sandbox", "sandbox"
    except Exception as e:  # noqa: BLE001 - any failure means: not ready, use the toy task
        print(f"sandbox task unavailable ({type(e).__name__}: {e}); using the toy task", file=sys.stderr)
    return "toytask:ToyTask", "toy (tests/toytask.py)"


# --- the injected proposer and judge ----------------------------------------------------------

_IDS = re.compile(r"exactly these keys: (.+?) \(values true or false\)")


def verdicts_for(messages) -> str:
    """A valid judge answer: `true` for every penalty id the prompt asks about (the last id list)."""
    found = _IDS.findall(messages[-1].content)
    ids = [i.strip() for i in found[-1].split(",")] if found else []
    return json.dumps(dict.fromkeys(ids, True))


class NoProposer:
    """Proposes nothing, at once (keeps the llm-judge arms' penalty count fixed)."""

    async def propose(self, view):
        from dynalize.penalties.candidate import ProposalResult

        return ProposalResult(step=view.step)


class PhraseProposer:
    """Proposes the phrase "the" at every proposal: a candidate every proposal's confirmation checks."""

    async def propose(self, view):
        from dynalize.penalties.candidate import Candidate, ProposalResult
        from dynalize.penalties.surface import WORD_END, WORD_START

        candidate = Candidate('Replies use "the"', 'The reply uses the word "the".', regex=f"(?i){WORD_START}the{WORD_END}")
        return ProposalResult(step=view.step, accepted=candidate)


class SleepyProposer:
    """Sleeps `delay` seconds, then proposes nothing: stands in for a slow proposer LLM."""

    def __init__(self, delay: float):
        self.delay = delay
        self.started: list[int] = []

    async def propose(self, view):
        import anyio

        from dynalize.penalties.candidate import ProposalResult

        self.started.append(view.step)
        t0 = time.perf_counter()
        await anyio.sleep(self.delay)
        return ProposalResult(step=view.step, latency=time.perf_counter() - t0)


def preloaded_buffer(n: int):
    """A buffer holding `n` active penalties with no regex (so an LLM must judge them)."""
    from dynalize.penalties.buffer import PenaltyBuffer
    from dynalize.types import Penalty

    penalties = [Penalty(id=f"p{i:03d}", title=f"Behaviour number {i}",
                         description=f"The reply shows behaviour number {i} (a benchmark stand-in).",
                         created_step=0, history=[{"step": 0, "event": "add"}]).to_dict()
                 for i in range(1, n + 1)]
    buf = PenaltyBuffer()
    buf.load_json({"version": n, "next_id": n + 1, "last_add_step": None, "penalties": penalties})
    return buf


def make_term(arm: Arm, domain: str, seed: int, latency: float, others: list):
    """The arm's penalty term (None: RM only); `others`: the run's other reward terms (the RM)."""
    from dynalize.backends.chat import ScriptedChatModel
    from dynalize.build import build_penalty_term
    from dynalize.penalties.config import JudgeConfig, PenaltiesConfig
    from dynalize.judge.judge import Judge, RegexJudge
    from dynalize.rewards import PenaltyTerm

    cfg = PenaltiesConfig(enabled=True, every=1)
    if arm.kind == "rm":
        return None
    if arm.kind == "lexical":  # what `penalties.enabled=true` builds, proposing every 2 steps, not confirming
        return build_penalty_term(PenaltiesConfig(enabled=True, every=2), domain=domain, seed=seed)
    if arm.kind in ("phrase", "confirm"):
        from dynalize.rewards.rescore import confirm_in_run

        term = PenaltyTerm(PenaltiesConfig(enabled=True, every=2), PhraseProposer(), RegexJudge(), seed=seed,
                           domain=domain)
        if arm.kind == "confirm" and confirm_in_run(term, list(others)) is None:
            raise RuntimeError("confirmation is unavailable with this task's reward")
        return term
    if arm.kind == "llm":
        judge = Judge(ScriptedChatModel(verdicts_for, latency=latency), JudgeConfig(max_concurrency=32, retries=3))
        return PenaltyTerm(cfg, NoProposer(), judge, preloaded_buffer(arm.penalties), seed=seed, domain=domain)
    if arm.kind == "sleepy":
        return PenaltyTerm(cfg, SleepyProposer(PROPOSER_SLEEP), RegexJudge(), seed=seed, domain=domain)
    raise ValueError(arm.kind)


# --- running ----------------------------------------------------------------------------------


def config_for(arm: Arm, task: str, steps: int, workdir: str, name: str):
    from dynalize.config import load_config

    return load_config(None, [
        f"name={name}", f"output_dir={workdir}", "seed=0", f"steps={steps}",
        f"batch_size={arm.batch}", f"group_size={arm.group}",
        "progress=false", "checkpoint_every=0", "eval_every=0",
        "policy.path=tiny:policy", f"generator.max_new_tokens={MAX_NEW_TOKENS}", "generator.temperature=1.0",
        f"generator.batch_size={arm.batch}", "trainer.lr=1e-6", "trainer.micro_batch_size=16",
        f"task.name={task}", "reward_model.engine=task",
        "penalties.enabled=false",  # the benchmark builds (or leaves out) the penalty term itself
    ])


async def run_arm(arm: Arm, task: str, steps: int, workdir: str, name: str, latency: float) -> list[dict[str, Any]]:
    from dynalize.build import build_parts
    from dynalize.loop import Orchestrator

    cfg = config_for(arm, task, steps, workdir, name)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    parts = build_parts(cfg)
    term = make_term(arm, parts.task.description, cfg.seed, latency, parts.terms)
    if term is not None:
        parts.terms.append(term)
    # The final checkpoint is written after the last step's metrics: `time/step` excludes it.
    return await Orchestrator(parts).run()


def summarize(arm: Arm, histories: list[list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    measured = [h for hist in histories for h in hist[warmup:]]
    times = [h["time/step"] for h in measured]

    def mean(key: str) -> float:
        return statistics.fmean(h.get(key, 0.0) for h in measured)

    calls = mean("judge/calls")
    return {
        "label": arm.label, "batch": arm.batch, "penalties_loaded": arm.penalties,
        "steps": len(times), "step_times": times,
        "step_median": statistics.median(times), "step_mean": statistics.fmean(times),
        "step_sd": statistics.stdev(times) if len(times) > 1 else 0.0,
        "score_mean": mean("time/score"), "generate_mean": mean("time/generate"), "train_mean": mean("time/train"),
        "judge_calls_per_step": calls, "judge_calls_per_rollout": calls / arm.batch,
        "judge_latency_mean": mean("judge/latency_mean") if calls else None,
        "judge_latency_max": max((h.get("judge/latency_max", 0.0) for h in measured), default=0.0) if calls else None,
        "judge_failures": sum(h.get("judge/failures", 0.0) for h in measured),
        "judge_cache_hits": sum(h.get("judge/cache_hits", 0.0) for h in measured),
        "penalties_active_mean": mean("penalties/active"),
        "penalty_adds": sum(h.get("penalties/adds", 0.0) for hist in histories for h in hist),
        "confirm_calls": sum(h.get("confirm/reward_calls", 0.0) for hist in histories for h in hist),
        "confirm_s": sum(h.get("confirm/seconds", 0.0) for hist in histories for h in hist),
        "co_travellers": sum(h.get("proposer/rejected/co_traveller", 0.0) for hist in histories for h in hist),
        "proposer_in_flight_frac": mean("proposer/in_flight"),
        "reward_mean": mean("reward/mean"), "rm_mean": mean("rm/mean"), "gen_len_mean": mean("gen_len/mean"),
    }


def ratios_by_pass(mine: list[list[dict[str, Any]]], theirs: list[list[dict[str, Any]]], warmup: int) -> list[float]:
    """Per pass, the median measured step time of `mine` over that of `theirs` in the same pass."""
    return [statistics.median(h["time/step"] for h in a[warmup:]) / statistics.median(h["time/step"] for h in b[warmup:])
            for a, b in zip(mine, theirs)]


def end_wait(history: list[dict[str, Any]]) -> float:
    """Seconds the run's last step spent waiting for background work at the end (`time/finish`)."""
    return history[-1].get("time/finish", 0.0) if history else 0.0


def slow_proposer_verdict(sleepy: list[list[dict[str, Any]]], rm: list[list[dict[str, Any]]],
                          sleepy_walls: list[float], rm_walls: list[float]) -> str:
    """The slow-proposer sentence, from the measured numbers: a step (or the run's end) "waited"
    when it lasted more than half the proposer's sleep beyond rm-only's longest step (what that
    step would cost without the proposer); the end-of-run wait is the last step's `time/finish`."""
    slowest = max(h["time/step"] for hist in sleepy for h in hist)
    rm_slowest = max(h["time/step"] for hist in rm for h in hist)
    waits = [end_wait(hist) for hist in sleepy]
    margin = PROPOSER_SLEEP / 2
    step_waited = slowest > rm_slowest + margin
    end_waited = max(waits) > margin
    if step_waited or end_waited:
        what = " and ".join(x for x, hit in (("a step", step_waited), ("the run's end", end_waited)) if hit)
        verdict = f"{what} waited for it"
    else:
        verdict = "no step and no run end waited for it"
    return (f"slow proposer: longest step {slowest:.2f} s (rm-only {rm_slowest:.2f} s), end-of-run wait "
            f"{', '.join(f'{w:.2f}' for w in waits)} s, run {statistics.fmean(sleepy_walls):.1f} s (rm-only "
            f"{statistics.fmean(rm_walls):.1f} s) against its {PROPOSER_SLEEP:.0f} s sleep: {verdict} "
            f"(waiting = more than {margin:.0f} s over rm-only)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="measured steps per arm")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per arm, run and discarded")
    ap.add_argument("--latency", type=float, default=0.02, help="injected judge latency per call, seconds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared CPU)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="passes over all arms, in alternating order, measured steps pooled")
    ap.add_argument("--only", nargs="*", choices=[a.key for a in ARMS], help="run only these arms")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.warmup < 0 or args.repeats < 1:
        ap.error("--steps must be ≥ 2, --warmup ≥ 0, --repeats ≥ 1")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import warnings

    import anyio
    import torch
    from rich.console import Console
    from rich.table import Table

    from dynalize.run import setup_logging

    torch.set_num_threads(args.threads)
    setup_logging("WARNING")
    warnings.filterwarnings("ignore")
    console = Console()
    if not console.is_terminal:  # piped or redirected: keep the table on one line per arm
        console = Console(width=200)
    task, task_shown = pick_task()
    arms = [a for a in ARMS if not args.only or a.key in args.only]
    total = args.warmup + args.steps
    histories: dict[str, list[list[dict[str, Any]]]] = {a.key: [] for a in arms}
    walls: dict[str, list[float]] = {a.key: [] for a in arms}
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dynalize-penalty-bench-") as tmp:
        for rep in range(args.repeats):
            for arm in (arms if rep % 2 == 0 else arms[::-1]):  # alternate the order against drift
                console.print(f"[dim]{arm.label}: {total} steps × {arm.batch} rollouts "
                              f"(pass {rep + 1}/{args.repeats}) …[/dim]")
                torch.manual_seed(0)
                t0 = time.perf_counter()
                hist = anyio.run(run_arm, arm, task, total, tmp, f"{arm.key}_{rep}", args.latency)
                walls[arm.key].append(time.perf_counter() - t0)  # load, all steps, final checkpoint
                histories[arm.key].append(hist)
    wall = time.perf_counter() - t_start
    load_after = os.getloadavg()[0]

    res = {a.key: summarize(a, histories[a.key], args.warmup)
           | {"run_wall_s": walls[a.key], "end_wait_s": [end_wait(h) for h in histories[a.key]]} for a in arms}
    base_for = {GROUP: "rm", 2 * GROUP: "rm_2x"}
    for a in arms:
        base = res.get(base_for[a.group])
        r = res[a.key]
        r["ratio_vs_rm_only"] = r["step_median"] / base["step_median"] if base else None
        r["ratio_vs_rm_only_mean"] = r["step_mean"] / base["step_mean"] if base else None
        if base:  # per pass, against the rm-only run of the same pass (nearer in time), geometric mean
            per_pass = ratios_by_pass(histories[a.key], histories[base_for[a.group]], args.warmup)
            r["ratio_per_pass"] = per_pass
            r["ratio_paired"] = statistics.geometric_mean(per_pass)

    t = Table(title=f"Penalty overhead — {task_shown} task, tiny:policy, {PROMPTS_PER_STEP} prompts × G, "
                    f"{MAX_NEW_TOKENS} new tokens, {args.steps} measured steps × {args.repeats} pass(es), "
                    f"judge latency {args.latency * 1000:.0f} ms, {args.threads} torch thread(s)")
    for col, just in [("arm", "left"), ("rollouts/step", "right"), ("penalties", "right"),
                      ("step s (median)", "right"), ("step s (mean ± sd)", "right"), ("score s", "right"),
                      ("judge calls/step", "right"), ("calls/rollout", "right"),
                      ("judge latency ms (mean / max)", "right"), ("x rm-only", "right"),
                      ("run s", "right"), ("end wait s", "right")]:
        t.add_column(col, justify=just)
    for a in arms:
        r = res[a.key]
        lat = (f"{r['judge_latency_mean'] * 1000:.1f} / {r['judge_latency_max'] * 1000:.1f}"
               if r["judge_latency_mean"] is not None else "—")
        ratio = f"{r['ratio_paired']:.3f}" if r.get("ratio_paired") is not None else "—"
        t.add_row(a.label, str(a.batch), f"{r['penalties_active_mean']:.1f}", f"{r['step_median']:.3f}",
                  f"{r['step_mean']:.3f} ± {r['step_sd']:.3f}", f"{r['score_mean']:.3f}",
                  f"{r['judge_calls_per_step']:.1f}", f"{r['judge_calls_per_rollout']:.2f}", lat, ratio,
                  f"{statistics.fmean(r['run_wall_s']):.1f}", f"{max(r['end_wait_s']):.2f}")
    console.print(t)

    lines = []
    if "sleepy" in res and "rm" in res:
        d = res["sleepy"]
        ok = d["ratio_paired"] <= TARGET
        passes = ", ".join(f"{x:.3f}" for x in d["ratio_per_pass"])
        lines.append(f"slow proposer / rm-only step time: {d['ratio_paired']:.3f} (medians paired by pass: "
                     f"{passes}), pooled median {d['ratio_vs_rm_only']:.3f}, mean {d['ratio_vs_rm_only_mean']:.3f}; "
                     f"target ≤ {TARGET}: {'[green]met[/green]' if ok else '[red]missed[/red]'}; "
                     f"a proposal was in flight during {d['proposer_in_flight_frac']:.0%} of measured steps")
        lines.append(slow_proposer_verdict(histories["sleepy"], histories["rm"], d["run_wall_s"],
                                           res["rm"]["run_wall_s"]))
    if "rm" in res and len(histories["rm"]) > 1:
        medians = [statistics.median(h["time/step"] for h in hist[args.warmup:]) for hist in histories["rm"]]
        lines.append(f"noise floor: rm-only median step time over its {len(medians)} passes "
                     f"{', '.join(f'{m:.3f}' for m in medians)} s (spread {max(medians) / min(medians) - 1:.1%})")
    llm = [k for k in ("llm1", "llm4", "llm16") if k in res]
    if llm:
        calls = ", ".join(f"{res[k]['penalties_loaded']}: {res[k]['judge_calls_per_step']:.1f}" for k in llm)
        lines.append(f"judge calls/step by active penalties ({calls}) — one call per rollout, "
                     f"independent of the number of penalties")
    if "llm16" in res and "llm16_2x" in res:
        a, b = res["llm16"], res["llm16_2x"]
        lines.append(f"judge calls/step by batch: {a['batch']} rollouts → {a['judge_calls_per_step']:.0f}, "
                     f"{b['batch']} → {b['judge_calls_per_step']:.0f} "
                     f"(×{b['judge_calls_per_step'] / max(a['judge_calls_per_step'], 1e-9):.2f} for ×"
                     f"{b['batch'] / a['batch']:.0f} rollouts); score time {a['score_mean']:.3f} s → "
                     f"{b['score_mean']:.3f} s")
    if "lexical" in res:
        x = res["lexical"]
        lines.append(f"lexical + regex: {x['penalty_adds']:.0f} penalt(y/ies) added, "
                     f"{x['penalties_active_mean']:.1f} active on average over measured steps")
    if "confirm" in res and "phrase" in res:
        c, x = res["confirm"], res["phrase"]
        paired = ratios_by_pass(histories["confirm"], histories["phrase"], args.warmup)
        ratio = statistics.geometric_mean(paired)
        verdict = ("not measured: no candidate reached confirmation" if not c["confirm_calls"]
                   else "met" if ratio <= TARGET else "missed")
        lines.append(f"confirmation / no confirmation step time: {ratio:.3f} (medians paired by pass: "
                     f"{', '.join(f'{v:.3f}' for v in paired)}); target ≤ {TARGET}: {verdict}; it rescored "
                     f"{c['confirm_calls']:.0f} replies in {c['confirm_s']:.1f} s over {args.repeats} pass(es) "
                     f"({c['co_travellers']:.0f} co-traveller(s) rejected, {c['penalty_adds']:.0f} penalt(y/ies) "
                     f"added; without it {x['penalty_adds']:.0f})")
    failures = sum(r["judge_failures"] for r in res.values())
    lines.append(f"judge failures: {failures:.0f}; cache hits: {sum(r['judge_cache_hits'] for r in res.values()):.0f}")
    lines.append(f"load average (1 min) before {load_before:.2f}, after {load_after:.2f} on {os.cpu_count()} CPUs; "
                 f"benchmark wall time {wall:.0f} s")
    for line in lines:
        console.print(line)

    if args.json:
        out = {"task": task, "policy": "tiny:policy", "prompts_per_step": PROMPTS_PER_STEP,
               "max_new_tokens": MAX_NEW_TOKENS, "steps": args.steps, "warmup": args.warmup,
               "repeats": args.repeats, "latency": args.latency, "threads": args.threads, "target": TARGET,
               "load_before": load_before, "load_after": load_after, "wall_s": wall, "arms": res}
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
        console.print(f"[dim]wrote {args.json}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
