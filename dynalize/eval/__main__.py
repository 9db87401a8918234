"""`python -m dynalize.eval --run RUN --bench eqbench|mindeval|healthbench|researchqa --judge SPEC ...`

EQ-Bench and MindEval read a checkout of the benchmark (`--bench-dir`); HealthBench and
ResearchQA a data file in the official format (`--data`), and with `--heldout` grade a rubric
run's saved held-out replies instead of its checkpoints. Evaluates every saved checkpoint of a run
(or every N-th) with a benchmark protocol and writes `RUN/eval/<bench>.jsonl` (one line per
checkpoint) and `RUN/eval/<bench>_raw/step_N.jsonl`. Rerun the same command to resume (failed judge calls are judged again). `--rejudge LABEL` rates
the saved generations again with another `--judge`, into `RUN/eval/<bench>@LABEL.jsonl`. SPEC
(judge, patient) is a JSON object or a YAML/JSON file with a chat-model config and sampling keys,
e.g. '{"engine": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "judge"}'.

`--bench rubric` grades a rubric run's saved held-out replies again (dynalize/eval/rubric_regrade.py).

Exit status: 0 when every checkpoint evaluated now is complete and scored (warnings, such as judge
replies that named no criterion or ResearchQA items skipped as the official code skips them, are
printed and change nothing); 1 when one has failed judge (or patient) calls, no score, or (with
--heldout) held-out prompts the data file lacks; 2 for bad input or an endpoint that does not answer.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from ..caller_state import LOG_LEVEL_HELP
from .checkpoints import eval_paths, evaluate_run, run_policy_config
from .common import Benchmark, BenchmarkError
from .heldout import SavedReplies, heldout_sources
from .models import role_model
from .policy import load_policy

BENCHES = ("eqbench", "mindeval", "healthbench", "researchqa")
DATA_BENCHES = ("healthbench", "researchqa")
"""Benchmarks read from a data file (`--data`) rather than a checkout (`--bench-dir`)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.eval", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="run directory (runs/<name>)")
    ap.add_argument("--bench", required=True, choices=(*BENCHES, "rubric"),
                    help="the benchmark; rubric: grade a rubric run's saved held-out replies again, with the run's "
                         "own gold judge (its options: python -m dynalize.eval --bench rubric --help)")
    ap.add_argument("--bench-dir", help="eqbench, mindeval: local checkout of the benchmark's repository")
    ap.add_argument("--data", help="healthbench: the official JSONL (HealthBench, Hard or Consensus); "
                                   "researchqa: a split (test.json)")
    ap.add_argument("--attempts", type=int, help="healthbench: grader calls per rubric item (10); "
                                                 "researchqa: calls per batch on a wrong count (3)")
    ap.add_argument("--batch-size", type=int, help="researchqa: rubric items per grader call (8)")
    ap.add_argument("--heldout", action="store_true",
                    help="healthbench, researchqa: grade the run's saved held-out replies (rollouts/eval_*.jsonl) "
                         "instead of checkpoints, into eval/<bench>_heldout.jsonl")
    ap.add_argument("--judge", help="judge chat model: JSON object or YAML/JSON file (needed by every --bench "
                                    "but rubric)")
    ap.add_argument("--patient", help="mindeval: patient-simulator chat model (JSON or file)")
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"), help="policy generation engine")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                    help="policy weights (default: the run's policy.dtype, else float32)")
    ap.add_argument("--max-model-len", type=int, default=8192, help="vllm: context length")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vllm: share of GPU memory")
    ap.add_argument("--every", type=int, help="only checkpoints whose step is a multiple of N")
    ap.add_argument("--steps", help="only these steps, comma-separated (e.g. 150,175,200)")
    ap.add_argument("--base", action="store_true", help="also evaluate the starting policy as step 0")
    ap.add_argument("--redo", action="store_true", help="evaluate again checkpoints already in eval/<bench>.jsonl")
    ap.add_argument("--rejudge", metavar="LABEL",
                    help="judge the saved generations again with --judge (nothing is generated), into "
                         "eval/<bench>@LABEL.jsonl")
    ap.add_argument("--concurrency", type=int, default=16, help="judge / patient calls in flight at once")
    ap.add_argument("--limit", type=int, help="only N prompts: the first N (eqbench), profiles (mindeval), items (researchqa); "
                                                 "healthbench: N examples drawn as the official code draws them")
    ap.add_argument("--strict", action="store_true",
                    help="eqbench: keep only the listed criteria; mindeval: a score outside 1-6 counts as missing")
    ap.add_argument("--max-tokens", type=int, help="policy reply length (eqbench 4000, mindeval 1024)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the policy's sampling and the scores' bootstrap (default 0)")
    ap.add_argument("--iterations", type=int, default=3, help="eqbench: iterations per prompt")
    ap.add_argument("--min-chars", type=int, default=500, help="eqbench: shorter replies are retried")
    ap.add_argument("--turns", type=int, default=10, help="mindeval: clinician turns per conversation")
    ap.add_argument("--temperature", type=float,
                    help="policy sampling temperature (mindeval 1.0, healthbench 0.5, researchqa 0.5)")
    ap.add_argument("--clinician-template", default="v0_1", help="mindeval: version key or constant name")
    ap.add_argument("--patient-template", default="v0_2", help="mindeval: version key or constant name")
    ap.add_argument("--judge-template", default="v0_1_w_length_guidelines", help="mindeval: version key or name")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    args = ap.parse_args(argv)
    if not args.judge:
        ap.error(f"--bench {args.bench} needs --judge (the judge's chat model)")
    if args.bench == "mindeval" and not args.patient and not args.rejudge:
        ap.error("--bench mindeval needs --patient (the patient-simulator chat model)")
    if args.bench in DATA_BENCHES and not args.data:
        ap.error(f"--bench {args.bench} needs --data (the benchmark's data file)")
    if args.heldout and args.bench not in DATA_BENCHES:
        ap.error("--heldout is for --bench healthbench or researchqa")
    if args.heldout and args.base:
        ap.error("--heldout grades saved replies: --base has nothing to grade")
    if args.bench not in DATA_BENCHES and not args.bench_dir:
        ap.error(f"--bench {args.bench} needs --bench-dir (a checkout of the benchmark's repository)")
    for flag in ("every", "concurrency", "limit", "iterations", "turns", "max_tokens", "attempts", "batch_size"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def _steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise BenchmarkError(f"--steps: expected comma-separated integers, got {text!r}") from None


def build_protocol(args: argparse.Namespace) -> Benchmark:
    """The benchmark with its chat models (the protocol's defaults under each spec) and the settings
    recorded with each row."""
    show = not args.no_progress
    settings: dict[str, Any] = {"seed": args.seed}
    if args.heldout:
        settings["heldout"] = True  # the run's saved replies: nothing is generated
    elif not args.rejudge:
        settings.update(limit=args.limit, engine=args.engine, dtype=policy_dtype(args))
    if args.bench == "healthbench":
        from . import healthbench

        return healthbench.from_args(args, settings)
    if args.bench == "researchqa":
        from . import researchqa

        return researchqa.from_args(args, settings)
    settings.update(bench_dir=os.path.abspath(args.bench_dir), strict=args.strict)
    if args.bench == "eqbench":
        from .eqbench import JUDGE_SAMPLING, JUDGE_TIMEOUT, EQBench, EQBenchAssets, EQBenchSettings

        assets = EQBenchAssets.load(args.bench_dir)
        judge = role_model(args.judge, "--judge", JUDGE_SAMPLING, concurrency=args.concurrency, timeout=JUDGE_TIMEOUT)
        s = EQBenchSettings(iterations=args.iterations, min_chars=args.min_chars, strict=args.strict,
                            limit=args.limit, seed=args.seed, max_tokens=args.max_tokens or 4000,
                            judge_sampling=judge.sampling)
        if not args.rejudge:
            settings.update(iterations=s.iterations, min_chars=s.min_chars, max_tokens=s.max_tokens,
                            temperature=s.temperature, min_p=s.min_p)
        settings["judge"] = judge.public
        return EQBench(judge.model, assets, s, record=settings, roles=(judge,), show_progress=show)
    from .mindeval import JUDGE_SAMPLING, PATIENT_SAMPLING, TIMEOUT, MindEval, MindEvalAssets, MindEvalSettings

    assets = MindEvalAssets.load(args.bench_dir, args.clinician_template, args.patient_template, args.judge_template)
    judge = role_model(args.judge, "--judge", JUDGE_SAMPLING, concurrency=args.concurrency, timeout=TIMEOUT)
    patient = None
    if args.patient and not args.rejudge:
        patient = role_model(args.patient, "--patient", PATIENT_SAMPLING, concurrency=args.concurrency,
                             timeout=TIMEOUT)
    temperature = 1.0 if args.temperature is None else args.temperature
    s = MindEvalSettings(turns=args.turns, temperature=temperature, strict=args.strict, limit=args.limit,
                         seed=args.seed, max_tokens=args.max_tokens or 1024, judge_sampling=judge.sampling,
                         patient_sampling=patient.sampling if patient else {})
    if args.rejudge:  # the conversations are saved: no patient is called
        settings.update(judge_template=args.judge_template, judge=judge.public)
    else:
        settings.update(turns=s.turns, temperature=s.temperature, max_tokens=s.max_tokens,
                        templates=[args.clinician_template, args.patient_template, args.judge_template],
                        judge=judge.public)
    if patient is not None:
        settings["patient"] = patient.public
    roles = (judge,) if patient is None else (patient, judge)
    return MindEval(patient.model if patient else None, judge.model, assets, s, record=settings, roles=roles,
                    show_progress=show)


def results_name(args: argparse.Namespace) -> str:
    """What the results are filed under: the benchmark, `<bench>_heldout` for a run's saved replies."""
    return f"{args.bench}_heldout" if getattr(args, "heldout", False) else args.bench


def policy_dtype(args: argparse.Namespace) -> str:
    return args.dtype or run_policy_config(args.run).get("dtype") or "float32"


def policy_loader(args: argparse.Namespace):
    """How each checkpoint's policy is loaded: engine, dtype (the run's by default), engine options."""
    dtype = policy_dtype(args)
    extra = {}
    if args.engine == "vllm":
        extra = {"max_model_len": args.max_model_len, "gpu_memory_utilization": args.gpu_memory_utilization}
    return functools.partial(load_policy, engine=args.engine, dtype=dtype, **extra)


def results_table(bench: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=f"{bench}: checkpoints evaluated now")
    for col in ("step", "score", "95% CI", "scored", "complete", "other counts"):
        t.add_column(col, justify="right")
    for r in rows:
        c = r["counts"]
        ci = f"{r['ci_low']:.2f}–{r['ci_high']:.2f}" if r["ci_low"] is not None else "n/a"
        bad = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("pieces", "conversations", "scored") and v)
        t.add_row(str(r["step"]), "n/a" if r["score"] is None else f"{r['score']:.2f}", ci, str(c["scored"]),
                  "yes" if r["complete"] else f"no ({r['failed']} failed)", bad or "-")
    return t


def problems(args: argparse.Namespace, rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the checkpoints evaluated now: an error for each one that is not a
    finished, scored result (the exit status is then 1); a warning for what a complete, scored
    row says the user must see (it changes no exit status)."""
    name = results_name(args) if args.rejudge is None else f"{results_name(args)}@{args.rejudge}"
    raw = eval_paths(args.run, results_name(args), args.rejudge)[1]
    errors, warnings = [], []
    for r in rows:
        if not r["complete"]:
            errors.append(f"{name} step {r['step']}: {r['failed']} judge or patient call(s) failed; rerun the same "
                          f"command to do them again (the generations are kept in {raw})")
        elif r["score"] is None:
            errors.append(f"{name} step {r['step']}: no score (see {raw}/step_{r['step']:06d}.jsonl)")
        if (r.get("counts") or {}).get("not_in_data"):
            errors.append(f"{name} step {r['step']}: {r['counts']['not_in_data']} held-out prompt(s) of the run "
                          f"are not in --data and were not graded: the score covers the others only")
        warnings += [f"{name} step {r['step']}: {w}" for w in r.get("warnings", [])]
    return errors, warnings


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if "rubric" in given and given.index("rubric") > 0 and given[given.index("rubric") - 1] == "--bench" \
            or "--bench=rubric" in given:
        from .rubric_regrade import main as rubric_main

        return rubric_main(given)
    args = parse_args(argv)
    import torch

    from ..run import set_torch_threads, setup_logging

    setup_logging(args.log_level.upper())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    set_torch_threads()  # generation runs in a worker thread beside the event loop
    try:
        protocol = build_protocol(args)
        loader, sources = policy_loader(args), None
        if args.heldout:
            loader, sources = SavedReplies, heldout_sources(args.run)
        rows = anyio.run(functools.partial(evaluate_run, args.run, results_name(args), protocol, every=args.every,
                                           steps=_steps(args.steps), base=args.base, redo=args.redo,
                                           loader=loader, rejudge=args.rejudge, sources=sources))
    except (BenchmarkError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: checkpoints finished so far are kept; rerun to resume", file=sys.stderr)
        return 130
    finally:
        torch.set_num_threads(threads)
    summary = eval_paths(args.run, results_name(args), args.rejudge)[0]
    if not rows:
        print(f"nothing to do: every selected checkpoint is already complete in {summary}")
        return 0
    Console().print(results_table(results_name(args), rows))
    errors, warnings = problems(args, rows)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
