"""Throughput: RM-only GRPO step time and rollouts/s, dynalize vs TRL's GRPOTrainer (issue 2, "Speed").

    python benchmarks/throughput.py [--steps 10] [--warmup 2] [--rounds 2] [--threads 1]
                                    [--async-level N] [--json out.json]

Both frameworks train the tiny policy (`tiny:policy`) in this one process, in turn (ABBA order
over `--rounds`, so drifting machine load hits both alike), on the same prompts (8 prompts × 8 samples = 64 rollouts per optimizer step), up to 64 new
tokens at temperature 1, the same Python reward (share of vowels in the reply), AdamW at the
same lr, the same micro-batch (16) and the same torch thread count. Warm-up steps are discarded.
The table prints step time (mean ± sd), rollouts/s, completion tokens/s and mean completion
length per framework, then the dynalize/TRL rollouts/s ratio against the target (≥ 1.5×).

Threads: the default is 1 (`--threads` changes it for both). The tiny model's ops take a few ms;
with 2 intra-op threads on a 2-core box shared with other jobs, OpenMP teams stall whenever
another process holds a core: seen here as up to 10× slower steps, worse in the main thread (where
TRL computes) than in worker threads (where dynalize computes), and worse still unless
MKL_NUM_THREADS is set too. So both OMP_NUM_THREADS and MKL_NUM_THREADS are set before torch loads.

Nothing is downloaded: the tiny policy is built locally (dynalize.tiny).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:  # the toy task and its vowel reward live with the tests
    sys.path.insert(0, str(ROOT / "tests"))

from toytask import TOPICS, vowel_share  # noqa: E402

TARGET = 1.5
PROMPTS_PER_STEP, GROUP, MAX_NEW_TOKENS, LR, MICRO_BATCH = 8, 8, 64, 1e-6, 16


def prompt_text(topic: str) -> str:
    return f"Write about the {topic}."  # as toytask.ToyTask words it


# ---------------------------------------------------------------------------------------------
# dynalize


def run_dynalize(total_steps: int, workdir: str, async_level: int | None = None, threads: int | None = None,
                 policy: str = "tiny:policy", dtype: str = "float32", max_new_tokens: int = MAX_NEW_TOKENS,
                 extra: list[str] = ()) -> list[dict[str, Any]]:
    """RM-only GRPO on the toy task; `extra` overrides come last (benchmarks/gpu_check.py's penalty run)."""
    import anyio

    from dynalize.config import RunConfig, load_config
    from dynalize.run import train

    overrides = [
        "name=dynalize", f"output_dir={workdir}", "seed=0", f"steps={total_steps}",
        f"batch_size={PROMPTS_PER_STEP * GROUP}", f"group_size={GROUP}",
        "progress=false", "checkpoint_every=0", "eval_every=0",
        f"policy.path={policy}", f"policy.dtype={dtype}",
        "generator.engine=hf", f"generator.max_new_tokens={max_new_tokens}", "generator.temperature=1.0",
        f"generator.batch_size={PROMPTS_PER_STEP * GROUP}",
        "reward_model.engine=task", f"trainer.lr={LR}", f"trainer.micro_batch_size={MICRO_BATCH}",
        "task.name=toytask:ToyTask", "penalties.enabled=false",
    ]
    if async_level is not None:
        overrides.append(f"async_level={async_level}")
    if threads is not None and "torch_threads" in RunConfig.model_fields:
        overrides.append(f"torch_threads={threads}")  # else dynalize picks its own count (half the cores)
    overrides += extra
    cfg = load_config(None, overrides)
    # Stamp each step's end (its metrics line) to get step-to-step wall time, as for TRL. The final
    # checkpoint is written after the last step's metrics: neither `time/step` nor the stamps include it.
    from dynalize.runlog import RunDir

    stamps: list[float] = []
    original = RunDir.log_metrics

    def stamped(self, record):
        original(self, record)
        stamps.append(time.perf_counter())

    RunDir.log_metrics = stamped
    try:
        history = anyio.run(train, cfg, False)
    finally:
        RunDir.log_metrics = original
    for h, prev, now in zip(history, [float("nan"), *stamps], stamps):
        h["bench/step_to_step"] = now - prev
    return history


def dynalize_steps(history: list[dict[str, Any]], warmup: int) -> list[dict[str, float]]:
    """Per measured step: wall time, rollouts, completion tokens, truncated count and the loop's phases."""
    out = []
    for h in history[warmup:]:
        n = PROMPTS_PER_STEP * GROUP - h["dropped"]
        out.append({"time": h["time/step"], "rollouts": n, "tokens": h["gen_len/mean"] * n,
                    "truncated": h["truncated_frac"] * n, "generate": h["time/generate"], "score": h["time/score"],
                    "train": h["time/train"], "weight_sync": h["time/weight_sync"],
                    "step_to_step": h["bench/step_to_step"]})
    return out


# ---------------------------------------------------------------------------------------------
# TRL


def run_trl(total_steps: int, warmup: int, workdir: str, seed: int = 0, policy: str = "tiny:policy",
            dtype: str = "float32", max_new_tokens: int = MAX_NEW_TOKENS,
            config: dict[str, Any] | None = None) -> tuple[list[dict[str, float]], dict]:
    """TRL's GRPOTrainer with dynalize's settings, on the GPU when there is one (parameters in `dtype`,
    no autocast, as dynalize's learner trains them); `config`: further GRPOConfig fields (gpu_check.py's
    generation settings)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from dynalize import tiny
    from dynalize.backends.hf import DTYPES

    path = tiny.resolve(policy)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])

    n_rows = max(len(TOPICS), PROMPTS_PER_STEP * (total_steps + 1))
    rows = [{"prompt": [{"role": "user", "content": prompt_text(TOPICS[i % len(TOPICS)])}]} for i in range(n_rows)]
    dataset = Dataset.from_list(rows)

    per_gen: list[tuple[int, int, int]] = []  # (completions, tokens, truncated) per generation = per step
    eos = {tokenizer.eos_token_id, *([model.generation_config.eos_token_id] if isinstance(
        model.generation_config.eos_token_id, int) else model.generation_config.eos_token_id or [])}

    def vowel_reward(prompts, completions, completion_ids=None, **kwargs):
        per_gen.append((len(completion_ids), sum(map(len, completion_ids)),
                        sum(1 for ids in completion_ids if not ids or ids[-1] not in eos)))
        return [vowel_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

    args = GRPOConfig(
        output_dir=workdir,
        per_device_train_batch_size=MICRO_BATCH,  # = dynalize trainer.micro_batch_size
        gradient_accumulation_steps=PROMPTS_PER_STEP * GROUP // MICRO_BATCH,  # → 64 completions / optimizer step
        num_generations=GROUP,  # generation_batch_size defaults to 16 × 4 = 64: one generation per step
        num_iterations=1,
        max_completion_length=max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, scale_rewards="none",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        max_steps=total_steps, logging_steps=1, report_to=[], save_strategy="no",
        bf16=False, fp16=False, use_cpu=not torch.cuda.is_available(), gradient_checkpointing=False,
        disable_tqdm=True, dataloader_num_workers=0, seed=seed, **(config or {}),
    )

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin = 0.0
            self.step_times: list[float] = []
            self.ends: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.step_times.append(now - self.begin)
            self.ends.append(now)

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=vowel_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)

    gen_times: list[float] = []
    orig_generate = trainer._generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return orig_generate(*a, **kw)
        finally:
            gen_times.append(time.perf_counter() - t0)

    trainer._generate = timed_generate
    trainer.train()
    steps = []
    for i in range(warmup, len(timer.step_times)):
        n, tokens, truncated = per_gen[i]
        steps.append({"time": timer.step_times[i], "rollouts": n, "tokens": tokens, "truncated": truncated,
                      "generate": gen_times[i], "rest": timer.step_times[i] - gen_times[i],
                      "step_to_step": timer.ends[i] - timer.ends[i - 1] if i > 0 else float("nan")})
    effective = {"generation_batch_size": args.generation_batch_size,
                 "steps_per_generation": args.steps_per_generation, "loss_type": args.loss_type,
                 "first_generate_s": gen_times[0] if gen_times else float("nan")}
    return steps, effective


# ---------------------------------------------------------------------------------------------


def summarize(steps: list[dict[str, float]]) -> dict[str, Any]:
    times = [st["time"] for st in steps]
    total, rollouts, tokens = sum(times), sum(st["rollouts"] for st in steps), sum(st["tokens"] for st in steps)
    phases = [k for k in steps[0] if k not in ("time", "rollouts", "tokens", "truncated")]
    walled = [st for st in steps if not math.isnan(st["step_to_step"])]  # a run's first step has no predecessor
    return {
        "steps": len(steps),
        "step_mean": statistics.fmean(times),
        "step_sd": statistics.stdev(times) if len(times) > 1 else 0.0,
        "rollouts_per_s": rollouts / total,
        "tokens_per_s": tokens / total,
        "mean_len": tokens / rollouts,
        "truncated_frac": sum(st["truncated"] for st in steps) / rollouts,
        "rollouts_per_s_wall": (sum(st["rollouts"] for st in walled) / sum(st["step_to_step"] for st in walled)
                                if walled else float("nan")),
        "phases": {k: statistics.fmean(v for st in steps if not math.isnan(v := st[k])) for k in phases
                   if any(not math.isnan(st[k]) for st in steps)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="measured optimizer steps per framework and round")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per run, run and discarded")
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs per framework, in ABBA order (dynalize, TRL, TRL, dynalize, ...); steps are pooled")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (and OMP_NUM_THREADS) for both")
    ap.add_argument("--async-level", type=int, default=None,
                    help="dynalize async_level (default: the config's, 1); 0 = on-policy, like TRL")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.warmup < 0 or args.rounds < 1 or args.threads < 1:
        ap.error("need --steps >= 2, --warmup >= 0, --rounds >= 1, --threads >= 1")

    # Before torch is imported: the thread count, and no network (nothing here downloads anything).
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import logging
    import warnings

    import torch
    from rich.console import Console
    from rich.table import Table

    from dynalize.run import setup_logging

    torch.set_num_threads(args.threads)
    setup_logging("WARNING")
    warnings.filterwarnings("ignore")
    for noisy in ("trl", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    console = Console()
    total = args.warmup + args.steps
    async_level = 1 if args.async_level is None else args.async_level

    steps: dict[str, list[dict[str, float]]] = {"dynalize": [], "TRL GRPOTrainer": []}
    effective: dict[str, Any] = {}
    loads = [os.getloadavg()[0]]
    threads_seen: dict[str, int] = {}
    cores: dict[str, list[float]] = {name: [] for name in steps}  # process CPU time / wall time, per run
    with tempfile.TemporaryDirectory(prefix="dynalize-bench-") as tmp:
        for r in range(args.rounds):
            order = ["dynalize", "TRL GRPOTrainer"] if r % 2 == 0 else ["TRL GRPOTrainer", "dynalize"]
            for name in order:
                console.print(f"[dim]round {r + 1}/{args.rounds}: {name}, {total} steps ({args.warmup} warm-up) …[/dim]")
                torch.manual_seed(0)
                torch.set_num_threads(args.threads)  # the same count for both (dynalize also sets it itself)
                work = str(Path(tmp) / f"{r}-{name.split()[0]}")
                wall0, cpu0 = time.perf_counter(), time.process_time()
                if name == "dynalize":
                    history = run_dynalize(total, work, args.async_level, args.threads)
                    steps[name] += dynalize_steps(history, args.warmup)
                else:
                    trl_steps, effective = run_trl(total, args.warmup, work)
                    steps[name] += trl_steps
                threads_seen[name] = torch.get_num_threads()
                cores[name].append((time.process_time() - cpu0) / (time.perf_counter() - wall0))
                loads.append(os.getloadavg()[0])

    rows = {name: summarize(st) for name, st in steps.items()}
    n_measured = args.steps * args.rounds
    table = Table(title=f"RM-only GRPO throughput: tiny:policy, {PROMPTS_PER_STEP}×{GROUP} rollouts/step, "
                        f"≤{MAX_NEW_TOKENS} new tokens, temperature 1, {n_measured} measured steps each "
                        f"({args.rounds} round(s) × {args.steps}, {args.warmup} warm-up discarded per run), "
                        f"{args.threads} torch thread(s)")
    for col in ("framework", "step time (s)", "rollouts/s", "tokens/s", "mean completion len"):
        table.add_column(col, justify="left" if col == "framework" else "right")
    for name, r in rows.items():
        table.add_row(name, f"{r['step_mean']:.3f} ± {r['step_sd']:.3f}", f"{r['rollouts_per_s']:.1f}",
                      f"{r['tokens_per_s']:.0f}", f"{r['mean_len']:.1f}")
    console.print(table)

    dyn, trl = rows["dynalize"], rows["TRL GRPOTrainer"]
    ratio = dyn["rollouts_per_s"] / trl["rollouts_per_s"]
    met = ratio >= TARGET
    console.print(f"dynalize / TRL rollouts/s = [bold]{ratio:.2f}×[/bold]  "
                  f"target ≥ {TARGET}×: {'[green]met[/green]' if met else '[red]not met[/red]'}")
    wall_ratio = dyn["rollouts_per_s_wall"] / trl["rollouts_per_s_wall"]
    console.print(f"by step-to-step wall time (incl. logging between steps): dynalize {dyn['rollouts_per_s_wall']:.1f}, "
                  f"TRL {trl['rollouts_per_s_wall']:.1f} rollouts/s → {wall_ratio:.2f}×")
    console.print("dynalize phases, mean s/step: " + ", ".join(f"{k} {v:.3f}" for k, v in dyn["phases"].items())
                  + ("  (generate of batch k+1 overlaps train k; weight_sync queues behind that generation)"
                     if async_level else ""))
    console.print("TRL phases, mean s/step: " + ", ".join(f"{k} {v:.3f}" for k, v in trl["phases"].items())
                  + "  (rest = reward + loss forward/backward + optimizer; step_to_step adds logging, data)")
    notes = [
        (f"TRL: per_device_train_batch_size={MICRO_BATCH} × gradient_accumulation_steps="
         f"{PROMPTS_PER_STEP * GROUP // MICRO_BATCH} → generation_batch_size={effective['generation_batch_size']}, "
         f"steps_per_generation={effective['steps_per_generation']}: one 64-completion generate per optimizer step, "
         "on-policy, no extra old-logprob pass; transformers generate (vLLM needs a GPU)."),
        (f"Losses differ by design: TRL loss_type={effective['loss_type']!r} (beta=0, scale_rewards='none'), "
         "dynalize 'prime'; both normalise by the batch's completion tokens; micro-batch 16 on both."),
        (f"dynalize async_level={async_level}: batch k+1 is generated while batch k trains (one step off-policy, "
         f"two busy threads, up to {2 * args.threads} cores); TRL generates then trains in sequence "
         f"({args.threads} core(s))." if async_level else
         "dynalize async_level=0: on-policy, generate then train in sequence, like TRL."),
        (f"Completion length: dynalize {dyn['mean_len']:.1f} (hit the cap {dyn['truncated_frac']:.0%}), "
         f"TRL {trl['mean_len']:.1f} (hit the cap {trl['truncated_frac']:.0%}); cap {MAX_NEW_TOKENS}, "
         "tokens/s counts completion tokens only."),
    ]
    if any(n != args.threads for n in threads_seen.values()):
        notes.append(f"torch threads after each run differ from --threads {args.threads}: {threads_seen}")
    used = {name: statistics.fmean(v) for name, v in cores.items()}
    notes.append(f"CPU cores this process used (CPU time / wall, whole runs incl. loading): dynalize "
                 f"{used['dynalize']:.2f}, TRL {used['TRL GRPOTrainer']:.2f}; 1-min load average "
                 f"{min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs, this process included.")
    if async_level and used["dynalize"] < 1.5 * args.threads:
        notes.append("dynalize got < 1.5 cores for its two compute threads: other jobs held the CPUs, so its "
                     "overlap of generation and training could not pay off; rerun on an idle machine.")
    for n in notes:
        console.print(f"[dim]note: {n}[/dim]")

    if args.json:
        out = {
            "settings": {"steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "threads": args.threads,
                         "dynalize_async_level": async_level, "prompts_per_step": PROMPTS_PER_STEP,
                         "group_size": GROUP, "max_new_tokens": MAX_NEW_TOKENS, "lr": LR,
                         "micro_batch_size": MICRO_BATCH, "trl_effective": effective},
            "results": rows, "ratio_rollouts_per_s": ratio, "ratio_rollouts_per_s_wall": wall_ratio, "target": TARGET, "target_met": met,
            "load_avg": loads, "cores_used": cores, "per_step": steps, "notes": notes,
        }
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
        console.print(f"[dim]wrote {args.json}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
