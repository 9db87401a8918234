"""GPU check (issues 20, 26, 32): dynalize vs TRL's GRPOTrainer on one GPU, peak memory, Dynalize's penalties.

    bash benchmarks/gpu_check.sh [--dry-run] [options]   # installs the carried wheels, then runs this
    python benchmarks/gpu_check.py --out DIR [--dry-run] [--steps N] [--warmup N] [--async-levels 1]
                                   [--hf-paths fast,plain] [--trl-settings default,continuous batching]

1. Builds a random-init policy of Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads
   of 128, MLP 3072, vocabulary 151936, tied embeddings) in bf16. Nothing is downloaded: the
   tokenizer is dynalize.tiny's, trained here, its vocabulary padded to the model's with decodable
   tokens (`Ġ<12345>`) that no merge produces.
2. Trains it with RM-only GRPO for `--warmup` + `--steps` steps with dynalize (HF generator and
   Accelerate learner; per `--async-levels` entry, once per HF generation path: `fast` =
   generator.hf_fast=on, a static KV cache and a compiled decoding step, `plain` = off) and with
   TRL's GRPOTrainer without vLLM (per `--trl-settings` entry: `default`, and `continuous batching`,
   its fastest non-vLLM setting, GRPOConfig.use_transformers_continuous_batching), in this one
   process, on the same prompts and settings (benchmarks/throughput.py's: 8 prompts × 8 samples,
   temperature 1, the vowel-share reward, AdamW lr 1e-6, micro-batch 16; here up to 128 new
   tokens). Prints per run the step time, completion tokens/s, the generate / train split, the
   first (warm-up) step's generation time (the compile's cost), the peak GPU memory (warm-up steps
   discarded), each dynalize run's ratios to TRL's default, and the targets (dynalize fast ≥ 3×
   TRL default tokens/s, ≥ TRL's fastest measured) as met or not from those numbers.
3. Runs Dynalize for `--penalty-steps` steps (lexical proposer, regex judge) on a task whose
   reward model pays for the word most common in the first batch it scores: a planted hack that the
   proposer should find at step 0 and the judge apply from step 1 on. It runs on `tiny:policy`:
   a random-init model of Qwen3-0.6B's size writes no recurring words to find.
4. benchmarks/memory.py's table (generation, learner step, RM scoring; dynalize and TRL;
   vocabularies 8192 and 151936; 128 and 1024 new tokens; batch 8; 4 cells at a time, each its own
   process; dynalize's plain HF path, so that no cell pays a compile) in the time left of
   `--time-limit`; cells it cannot start in time are recorded as skipped.

`--dry-run` runs the same code on a tiny Qwen3 (float32, 16 new tokens, 1 + 2 steps; memory cells
of 16 new tokens: generation at vocabularies 8192 and 16384, learner and RM at 8192) on whatever device there is: the test suite's check
that this script still works while no GPU is lent.

Everything printed also goes to files in `--out`, flat, at most 8 (gpu_check.sh adds the log):
results.json (written after each part, so a run cut short keeps what it measured; the penalty
run's buffer events too), summary.txt (the tables), dynalize_metrics.jsonl (the first dynalize
run's), trl_steps.jsonl (the first TRL run's), penalty_metrics.jsonl and penalty_rollouts.jsonl
(its last step, with the judge's verdicts), memory.json (the memory cells). A part that fails is
printed and recorded, the next one still runs, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata as md
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  (and through it tests/toytask.py)
from gpu_report import PENALTY_METRICS, report  # noqa: E402
from padded_policy import build_policy  # noqa: E402

from dynalize.backends.base import RewardModel  # noqa: E402
from dynalize.penalties.surface import STOP_WORDS, WORD  # noqa: E402
from dynalize.tasks.base import Task  # noqa: E402
from dynalize.types import Message, Prompt  # noqa: E402

SHAPES = {
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "tiny": dict(vocab_size=8192, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=32),
}
VERSIONS = ["torch", "transformers", "accelerate", "trl", "datasets", "pyarrow", "pandas", "huggingface-hub",
            "numpy", "pydantic", "structlog", "tenacity", "json-repair", "regex"]
PENALTY_LAM = 0.5


# ---------------------------------------------------------------------------------------------
# the penalty demo's task: a flawed reward model planted on the policy's own words


def planted_word(replies: list[str]) -> str:
    """The non-stop word in the most replies (ties: alphabetical); "" when there is none."""
    counts = Counter(w for text in replies for w in {w.lower() for w in WORD.findall(text)} - STOP_WORDS)
    return min(counts, key=lambda w: (-counts[w], w)) if counts else ""


class FirstBatchWordRM(RewardModel):
    """Pays 1.0 for a reply containing the word most common in the first batch it scores, else 0."""

    def __init__(self):
        self.word: str | None = None

    async def score(self, items):
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        if self.word is None:
            self.word = planted_word(texts)
        return [1.0 if self.word and self.word in {w.lower() for w in WORD.findall(t)} else 0.0 for t in texts]


class PlantedWordTask(Task):
    """The toy task's prompts; the reward model rewards one recurring word and nothing else."""

    description = "Short texts about a topic."

    def prompts(self, split):
        return [Prompt(f"{split}-{t}", [Message("user", throughput.prompt_text(t))]) for t in throughput.TOPICS]

    def reward_model(self):
        return FirstBatchWordRM()


# ---------------------------------------------------------------------------------------------
# parts


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "cuda": torch.cuda.is_available()}
    if env["cuda"]:
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                   cuda_version=torch.version.cuda)
    else:
        env["device"] = f"cpu ({os.cpu_count()} cores)"
    for name in VERSIONS:
        try:
            env[name] = md.version(name)
        except md.PackageNotFoundError:
            env[name] = None
    return env


def measured(fn, *args, **kwargs) -> tuple[Any, dict[str, float | None]]:
    """`fn(*args, **kwargs)`, its wall time and the GPU memory it peaked at (None on a CPU), with
    what was still allocated before it started (an earlier part's leftovers count in its peak)."""
    import torch

    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**30 if cuda else None
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    stats: dict[str, float | None] = {"wall_s": time.perf_counter() - start, "allocated_before_gib": before,
                                      "peak_allocated_gib": None, "peak_reserved_gib": None}
    if cuda:
        stats["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        stats["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return result, stats


HF_PATHS = {"fast": "on", "plain": "off"}
"""dynalize's HF generation paths (generator.hf_fast): the static cache with a compiled decoding step, and without."""
TRL_SETTINGS = {"default": {}, "continuous batching": {"use_transformers_continuous_batching": True}}
"""TRL's generation settings without vLLM: its default (transformers `generate`, dynamic cache, compile
disabled) and its fastest, transformers' continuous batching (paged attention; GRPOConfig
`use_transformers_continuous_batching`)."""
CPU_CONTINUOUS_BATCHING = {"num_blocks": 32, "max_batch_tokens": 512}
"""The dry run's paged cache: sized from free memory by default, which on a CPU is the machine's RAM."""


def compare(model: str, args, work: Path, out: Path, results: dict[str, Any]) -> None:
    """dynalize (per async level and HF path) and TRL (per generation setting), on the same model and
    settings: `results['frameworks']`."""
    total = args.warmup + args.steps
    frameworks = results.setdefault("frameworks", {})
    first = True
    for level in args.async_levels:
        for path in args.hf_paths:
            name = f"dynalize {path} (async_level {level})"
            run = work / f"dynalize-{path}-{level}"
            with Part(results, name):
                history, mem = measured(throughput.run_dynalize, total, str(run), level, args.threads, policy=model,
                                        dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                                        extra=[f"generator.hf_fast={HF_PATHS[path]}"])
                frameworks[name] = {**throughput.summarize(throughput.dynalize_steps(history, args.warmup)), **mem,
                                    "first_generate_s": history[0]["time/generate"]}
                if first:
                    shutil.copy(run / "dynalize" / "metrics.jsonl", out / "dynalize_metrics.jsonl")
                    first = False
    for label in args.trl_settings:
        name = f"TRL GRPOTrainer ({label})"
        with Part(results, name):
            config = dict(TRL_SETTINGS[label])
            if args.dry_run and config.get("use_transformers_continuous_batching"):
                config["transformers_continuous_batching_config"] = CPU_CONTINUOUS_BATCHING
            (steps, effective), mem = measured(throughput.run_trl, total, args.warmup, str(work / f"trl-{label}"),
                                               policy=model, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                                               config=config)
            frameworks[name] = {**throughput.summarize(steps), **mem, "trl_effective": effective,
                                "first_generate_s": effective["first_generate_s"]}
            if label == args.trl_settings[0]:
                (out / "trl_steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps), encoding="utf-8")


def memory_table(args, work: Path, out: Path, results: dict[str, Any], started: float) -> None:
    """benchmarks/memory.py's cells, in the time that is left (`--time-limit`)."""
    import memory
    import torch

    with Part(results, "memory"):
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the cells are processes of their own: leave them the GPU
        budget = args.time_limit - (time.perf_counter() - started) - 30
        common = dict(fast="off", work=work / "memory", timeout=max(budget, 60), save=out / "memory.json")
        if args.dry_run:  # every part's code, and generation at two vocabularies: 8 cells
            kw = dict(lengths=[16], batch=2, micro_batch=1, parallel=1)
            t0 = time.perf_counter()
            settings, cells = memory.run_table([8192, 16384], parts=["generation"], budget=budget, **kw, **common)
            more = memory.run_table([8192], parts=["learner", "rm"], budget=budget - (time.perf_counter() - t0),
                                    **kw, **common)[1]
            settings.update(parts=list(memory.PARTS))
            cells += more
        else:
            settings, cells = memory.run_table([8192, 151936], lengths=[128, 1024], batch=8, micro_batch=4, parallel=4,
                                               budget=budget, **common)
        results["memory"] = {"settings": settings, "cells": cells}
        (out / "memory.json").write_text(json.dumps(results["memory"], indent=2), encoding="utf-8")
        failed = [c for c in cells if "error" in c]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(cells)} memory cells failed or were skipped: {failed[0]['error']}")


def penalty_run(args, work: Path, out: Path, results: dict[str, Any]) -> None:
    """A short Dynalize run (lexical proposer, regex judge) on the planted-word task."""
    from dynalize.runlog import read_jsonl

    with Part(results, "penalties"):
        extra = [
            "task.name=gpu_check:PlantedWordTask", "penalties.enabled=true", f"penalties.lam={PENALTY_LAM}",
            "penalties.every=2", "penalties.view_groups=8", "penalties.view_per_group=8",
            "penalties.proposer.engine=lexical", "penalties.judge.engine=regex",
        ]
        history, mem = measured(throughput.run_dynalize, args.penalty_steps, str(work / "penalties"), None,
                                args.threads, policy="tiny:policy", dtype=args.dtype, max_new_tokens=64, extra=extra)
        run = work / "penalties" / "dynalize"
        shutil.copy(run / "metrics.jsonl", out / "penalty_metrics.jsonl")
        events = read_jsonl(run / "penalties.jsonl") if (run / "penalties.jsonl").exists() else []
        last = run / "rollouts" / f"step_{args.penalty_steps:06d}.jsonl"  # steps count updates completed
        shutil.copy(last, out / "penalty_rollouts.jsonl")
        first = read_jsonl(run / "rollouts" / "step_000001.jsonl")
        results["penalties"] = {
            "planted_word": planted_word([r["replies"][0] for r in first]),
            "added": [{k: e.get(k) for k in ("id", "title", "regex", "step", "proposed_at")}
                      for e in events if e["event"] == "add"],
            "steps": [{k: h.get(k) for k in PENALTY_METRICS} for h in history],
            "events": events,
            **mem,
        }


class Part:
    """Runs one part of the check: a failure is printed and recorded, and the next part still runs."""

    def __init__(self, results: dict[str, Any], name: str):
        self.results, self.name = results, name

    def __enter__(self):
        print(f"== {self.name}", flush=True)
        self.start = time.perf_counter()

    def __exit__(self, kind, error, tb):
        seconds = round(time.perf_counter() - self.start, 1)
        self.results.setdefault("parts", {})[self.name] = {"seconds": seconds, "ok": error is None}
        if error is not None:
            traceback.print_exception(kind, error, tb)
            self.results["parts"][self.name]["error"] = f"{kind.__name__}: {error}"
            print(f"FAILED {self.name} after {seconds} s: {kind.__name__}: {error}", flush=True)
        save(self.results)
        return isinstance(error, Exception)  # a KeyboardInterrupt still stops everything


def save(results: dict[str, Any]) -> None:
    path = Path(results["out"]) / "results.json"
    path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the result files (at most 8, flat)")
    ap.add_argument("--dry-run", action="store_true", help="tiny model, float32, 1 + 2 steps: seconds on a CPU")
    ap.add_argument("--steps", type=int, help="measured steps per framework (default 8; dry run 2)")
    ap.add_argument("--warmup", type=int, help="warm-up steps, discarded (default 2; dry run 1)")
    ap.add_argument("--max-new-tokens", type=int, help="default 128; dry run 16")
    ap.add_argument("--async-levels", default="1", help="dynalize async_level per dynalize run (default 1)")
    ap.add_argument("--hf-paths", default="fast,plain", help=f"dynalize generation paths, from {','.join(HF_PATHS)}")
    ap.add_argument("--trl-settings", default="default,continuous batching",
                    help=f"TRL generation settings, from {','.join(TRL_SETTINGS)}")
    ap.add_argument("--penalty-steps", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true", help="skip benchmarks/memory.py's table")
    ap.add_argument("--time-limit", type=float, default=float(os.environ.get("GPU_CHECK_TIMEOUT", 540)),
                    help="seconds for the whole check: the memory table gets what is left (default $GPU_CHECK_TIMEOUT or 540)")
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.shape, args.dtype = ("tiny", "float32") if dry else ("qwen3-0.6b", "bfloat16")
    args.steps = args.steps or (2 if dry else 8)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 2)
    args.max_new_tokens = args.max_new_tokens or (16 if dry else 128)
    args.async_levels = [int(x) for x in args.async_levels.split(",")]
    args.hf_paths, args.trl_settings = args.hf_paths.split(","), args.trl_settings.split(",")
    if set(args.hf_paths) - set(HF_PATHS) or set(args.trl_settings) - set(TRL_SETTINGS):
        ap.error(f"--hf-paths from {', '.join(HF_PATHS)}; --trl-settings from {', '.join(TRL_SETTINGS)}")
    args.threads = 1 if dry else None  # on a CPU: one torch thread per compute thread (see throughput.py)
    if args.steps < 2 or args.warmup < 0 or args.penalty_steps < 2:
        ap.error("need --steps >= 2, --warmup >= 0, --penalty-steps >= 2")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ.setdefault(offline, "1")
    import logging
    import warnings

    from rich.console import Console

    from dynalize.run import setup_logging

    setup_logging("WARNING")
    warnings.filterwarnings("ignore")
    for noisy in ("trl", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"out": str(args.out), "settings": {
        k: getattr(args, k) for k in ("dry_run", "shape", "dtype", "steps", "warmup", "max_new_tokens",
                                      "async_levels", "hf_paths", "trl_settings", "penalty_steps")}}
    started = time.perf_counter()
    with Part(results, "environment"):
        results["environment"] = environment()
        print(json.dumps(results["environment"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="dynalize-gpu-check-") as tmp:
        work = Path(tmp)
        with Part(results, "model"):
            results["model"] = build_policy(work / "model", SHAPES[args.shape], args.dtype)
            print(json.dumps(results["model"]), flush=True)
        if "model" in results:
            compare(str(work / "model"), args, work, args.out, results)
        penalty_run(args, work, args.out, results)
        if not args.no_memory:
            memory_table(args, work, args.out, results, started)
    console = Console(record=True, width=150)
    for item in report(results):
        console.print(item)
    (args.out / "summary.txt").write_text(console.export_text(), encoding="utf-8")
    save(results)
    return 0 if all(p["ok"] for p in results["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
