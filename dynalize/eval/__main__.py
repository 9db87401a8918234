"""`python -m dynalize.eval --run RUN --bench eqbench|mindeval --bench-dir CHECKOUT --judge SPEC ...`

Evaluates every saved checkpoint of a run (or every N-th) with a benchmark protocol and writes
`RUN/eval/<bench>.jsonl` (one line per checkpoint) and `RUN/eval/<bench>_raw/step_N.jsonl`.
Rerun the same command to resume. SPEC (judge, patient) is a JSON object or a YAML/JSON file with a
chat-model config, e.g. '{"engine": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "judge"}'.
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

from .checkpoints import evaluate_run, run_policy_config
from .common import BenchmarkError, chat_model_from_spec, read_chat_spec
from .policy import load_policy

BENCHES = ("eqbench", "mindeval")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dynalize.eval", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="run directory (runs/<name>)")
    ap.add_argument("--bench", required=True, choices=BENCHES)
    ap.add_argument("--bench-dir", required=True, help="local checkout of the benchmark's repository")
    ap.add_argument("--judge", required=True, help="judge chat model: JSON object or YAML/JSON file")
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
    ap.add_argument("--concurrency", type=int, default=16, help="judge / patient calls in flight at once")
    ap.add_argument("--limit", type=int, help="only the first N prompts (eqbench) or profiles (mindeval)")
    ap.add_argument("--strict", action="store_true",
                    help="eqbench: keep only the listed criteria; mindeval: a score outside 1-6 counts as missing")
    ap.add_argument("--max-tokens", type=int, help="policy reply length (eqbench 4000, mindeval 1024)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=3, help="eqbench: iterations per prompt")
    ap.add_argument("--min-chars", type=int, default=500, help="eqbench: shorter replies are retried")
    ap.add_argument("--turns", type=int, default=10, help="mindeval: clinician turns per conversation")
    ap.add_argument("--temperature", type=float, default=1.0, help="mindeval: clinician sampling temperature")
    ap.add_argument("--clinician-template", default="v0_1", help="mindeval: version key or constant name")
    ap.add_argument("--patient-template", default="v0_2", help="mindeval: version key or constant name")
    ap.add_argument("--judge-template", default="v0_1_w_length_guidelines", help="mindeval: version key or name")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    if args.bench == "mindeval" and not args.patient:
        ap.error("--bench mindeval needs --patient (the patient-simulator chat model)")
    for flag in ("every", "concurrency", "limit", "iterations", "turns", "max_tokens"):
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


def _public(spec: dict[str, Any]) -> dict[str, Any]:
    """What of a chat-model config identifies it in the results (no secrets are ever in it)."""
    return {k: spec[k] for k in ("engine", "model", "base_url", "path", "temperature") if spec.get(k) is not None}


def build_protocol(args: argparse.Namespace):
    """(protocol coroutine taking a policy, settings recorded with each row)."""
    judge = chat_model_from_spec(args.judge, "--judge", args.concurrency)
    show = not args.no_progress
    settings: dict[str, Any] = {"bench_dir": os.path.abspath(args.bench_dir), "strict": args.strict,
                                "limit": args.limit, "seed": args.seed, "engine": args.engine,
                                "dtype": policy_dtype(args),
                                "judge": _public(read_chat_spec(args.judge, "--judge"))}
    if args.bench == "eqbench":
        from .eqbench import EQBenchAssets, EQBenchSettings, run_eqbench

        assets = EQBenchAssets.load(args.bench_dir)
        s = EQBenchSettings(iterations=args.iterations, min_chars=args.min_chars, strict=args.strict,
                            limit=args.limit, seed=args.seed, max_tokens=args.max_tokens or 4000)
        settings.update(iterations=s.iterations, min_chars=s.min_chars, max_tokens=s.max_tokens)
        protocol = functools.partial(_call, run_eqbench, judge=judge, assets=assets, settings=s, show_progress=show)
        return protocol, settings
    from .mindeval import MindEvalAssets, MindEvalSettings, run_mindeval

    assets = MindEvalAssets.load(args.bench_dir, args.clinician_template, args.patient_template, args.judge_template)
    patient = chat_model_from_spec(args.patient, "--patient", args.concurrency)
    s = MindEvalSettings(turns=args.turns, temperature=args.temperature, strict=args.strict, limit=args.limit,
                         seed=args.seed, max_tokens=args.max_tokens or 1024)
    settings.update(turns=s.turns, temperature=s.temperature, max_tokens=s.max_tokens,
                    templates=[args.clinician_template, args.patient_template, args.judge_template],
                    patient=_public(read_chat_spec(args.patient, "--patient")))
    return functools.partial(_call, run_mindeval, patient=patient, judge=judge, assets=assets, settings=s,
                             show_progress=show), settings


def policy_dtype(args: argparse.Namespace) -> str:
    return args.dtype or run_policy_config(args.run).get("dtype") or "float32"


def policy_loader(args: argparse.Namespace):
    """How each checkpoint's policy is loaded: engine, dtype (the run's by default), engine options."""
    dtype = policy_dtype(args)
    extra = {}
    if args.engine == "vllm":
        extra = {"max_model_len": args.max_model_len, "gpu_memory_utilization": args.gpu_memory_utilization}
    return functools.partial(load_policy, engine=args.engine, dtype=dtype, **extra)


async def _call(fn, policy, **kw):
    return await fn(policy, **kw)


def results_table(bench: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=f"{bench}: checkpoints evaluated now")
    for col in ("step", "score", "95% CI", "scored", "other counts"):
        t.add_column(col, justify="right")
    for r in rows:
        c = r["counts"]
        ci = f"{r['ci_low']:.2f}–{r['ci_high']:.2f}" if r["ci_low"] is not None else "n/a"
        bad = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("pieces", "conversations", "scored") and v)
        t.add_row(str(r["step"]), "n/a" if r["score"] is None else f"{r['score']:.2f}", ci, str(c["scored"]),
                  bad or "-")
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ..run import set_torch_threads, setup_logging

    setup_logging(args.log_level.upper())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    set_torch_threads()  # generation runs in a worker thread beside the event loop
    try:
        protocol, settings = build_protocol(args)
        rows = anyio.run(functools.partial(evaluate_run, args.run, args.bench, protocol, settings=settings,
                                           every=args.every, steps=_steps(args.steps), base=args.base,
                                           redo=args.redo, loader=policy_loader(args)))
    except (BenchmarkError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: checkpoints finished so far are kept; rerun to resume", file=sys.stderr)
        return 130
    finally:
        torch.set_num_threads(threads)
    if rows:
        Console().print(results_table(args.bench, rows))
    else:
        print(f"nothing to do: every selected checkpoint is already in {args.run}/eval/{args.bench}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
