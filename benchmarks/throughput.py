"""Throughput: RM-only GRPO step time and rollouts/s, dynalize vs TRL's GRPOTrainer (issue 2, "Speed").

    python benchmarks/throughput.py [--steps 10] [--warmup 2] [--threads N] [--json out.json]

Both frameworks train the tiny policy (`tiny:policy`) in this one process, one after the other,
on the same prompts (8 prompts × 8 samples = 64 rollouts per optimizer step), up to 64 new
tokens at temperature 1, the same Python reward (share of vowels in the reply), AdamW at the
same lr, the same micro-batch (16) and the same torch thread count. Warm-up steps are discarded.
The table prints step time (mean ± sd), rollouts/s, completion tokens/s and mean completion
length per framework, then the dynalize/TRL rollouts/s ratio against the target (≥ 1.5×).

Nothing is downloaded: the tiny policy is built locally (dynalize.tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so the task resolves as `benchmarks.throughput:BenchTask`
    sys.path.insert(0, str(ROOT))

from dynalize.backends.base import RewardModel  # noqa: E402
from dynalize.tasks.base import Task  # noqa: E402
from dynalize.types import Message, Prompt  # noqa: E402

TARGET = 1.5
PROMPTS_PER_STEP, GROUP, MAX_NEW_TOKENS, LR, MICRO_BATCH = 8, 8, 64, 1e-6, 16
TOPICS = ["sea", "forest", "city", "river", "moon", "rain", "music", "garden", "desert", "winter", "stars", "bread"]


def prompt_text(topic: str) -> str:
    return f"Write about the {topic}."


def vowel_share(text: str) -> float:
    """The shared reward (as in tests/toytask.py): share of vowels among the reply's letters."""
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class VowelRM(RewardModel):
    async def score(self, items):
        return [vowel_share(x if isinstance(x, str) else x[-1].content) for x in items]


class BenchTask(Task):
    """The benchmark's task for dynalize: the topic prompts and the vowel reward."""

    description = "Short texts about a topic."

    def prompts(self, split):
        return [Prompt(f"{split}-{t}", [Message("user", prompt_text(t))]) for t in TOPICS]

    def reward_model(self):
        return VowelRM()


# ---------------------------------------------------------------------------------------------
# dynalize


def run_dynalize(total_steps: int, workdir: str, async_level: int | None = None) -> list[dict[str, Any]]:
    import anyio

    from dynalize.config import load_config
    from dynalize.run import train

    overrides = [
        "name=dynalize", f"output_dir={workdir}", "seed=0", f"steps={total_steps}",
        f"batch_size={PROMPTS_PER_STEP * GROUP}", f"group_size={GROUP}",
        "progress=false", "checkpoint_every=0", "eval_every=0",
        "policy.path=tiny:policy", "policy.dtype=float32",
        "generator.engine=hf", f"generator.max_new_tokens={MAX_NEW_TOKENS}", "generator.temperature=1.0",
        f"generator.batch_size={PROMPTS_PER_STEP * GROUP}",
        "reward_model.engine=task", f"trainer.lr={LR}", f"trainer.micro_batch_size={MICRO_BATCH}",
        "task.name=benchmarks.throughput:BenchTask", "penalties.enabled=false",
    ]
    if async_level is not None:
        overrides.append(f"async_level={async_level}")
    cfg = load_config(None, overrides)
    # The final checkpoint is written after the last step's metrics: `time/step` excludes it.
    return anyio.run(train, cfg, False)


def dynalize_result(history: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    measured = history[warmup:]
    times = [h["time/step"] for h in measured]
    rollouts = sum(PROMPTS_PER_STEP * GROUP - h["dropped"] for h in measured)
    tokens = sum(h["tokens_per_s"] * h["time/step"] for h in measured)
    lengths = [h["gen_len/mean"] for h in measured]
    return {
        "step_times": times,
        "rollouts": rollouts,
        "tokens": tokens,
        "mean_len": statistics.fmean(lengths),
        "truncated_frac": statistics.fmean(h["truncated_frac"] for h in measured),
        "reward_mean": statistics.fmean(h["reward/mean"] for h in measured),
        "breakdown": {k: statistics.fmean(h[k] for h in measured)
                      for k in ("time/generate", "time/score", "time/train", "time/weight_sync")},
    }


# ---------------------------------------------------------------------------------------------
# TRL


def run_trl(total_steps: int, workdir: str, seed: int = 0) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from dynalize import tiny

    path = tiny.resolve("tiny:policy")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    n_rows = max(len(TOPICS), PROMPTS_PER_STEP * (total_steps + 1))
    rows = [{"prompt": [{"role": "user", "content": prompt_text(TOPICS[i % len(TOPICS)])}]} for i in range(n_rows)]
    dataset = Dataset.from_list(rows)

    lengths_per_gen: list[list[int]] = []

    def vowel_reward(prompts, completions, completion_ids=None, **kwargs):
        lengths_per_gen.append([len(ids) for ids in completion_ids])
        return [vowel_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

    args = GRPOConfig(
        output_dir=workdir,
        per_device_train_batch_size=MICRO_BATCH,  # = dynalize trainer.micro_batch_size
        gradient_accumulation_steps=PROMPTS_PER_STEP * GROUP // MICRO_BATCH,  # → 64 completions / optimizer step
        num_generations=GROUP,  # generation_batch_size defaults to 16 × 4 = 64: one generation per step
        num_iterations=1,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, scale_rewards="none",
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        max_steps=total_steps, logging_steps=1, report_to=[], save_strategy="no",
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        disable_tqdm=True, dataloader_num_workers=0, seed=seed,
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
    return {"step_times": timer.step_times, "ends": timer.ends, "lengths": lengths_per_gen, "gen_times": gen_times,
            "effective": {"generation_batch_size": args.generation_batch_size,
                                         "steps_per_generation": args.steps_per_generation,
                                         "loss_type": args.loss_type}}


def trl_result(raw: dict[str, Any], warmup: int) -> dict[str, Any]:
    times = raw["step_times"][warmup:]
    lengths = [n for step in raw["lengths"][warmup:len(raw["step_times"])] for n in step]
    ends = raw["ends"]
    wall = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]  # end-to-end incl. logging, data loading
    gen = raw["gen_times"][warmup:]
    return {
        "step_times": times,
        "rollouts": len(lengths),
        "tokens": sum(lengths),
        "mean_len": statistics.fmean(lengths),
        "truncated_frac": statistics.fmean(n >= MAX_NEW_TOKENS for n in lengths),
        "step_to_step_mean": statistics.fmean(wall) if wall else None,
        "breakdown": {"time/generate": statistics.fmean(gen) if gen else float("nan"),
                      "time/rest(score+train)": statistics.fmean(times) - (statistics.fmean(gen) if gen else 0.0)},
        "effective": raw["effective"],
    }


# ---------------------------------------------------------------------------------------------


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    times = res["step_times"]
    total = sum(times)
    return {
        "step_mean": statistics.fmean(times),
        "step_sd": statistics.stdev(times) if len(times) > 1 else 0.0,
        "rollouts_per_s": res["rollouts"] / total,
        "tokens_per_s": res["tokens"] / total,
        "mean_len": res["mean_len"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="measured optimizer steps per framework")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps, run and discarded")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for both")
    ap.add_argument("--async-level", type=int, default=None,
                    help="dynalize async_level (default: the config's, 1); 0 = on-policy like TRL")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.warmup < 0:
        ap.error("--steps must be ≥ 2 and --warmup ≥ 0")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import logging
    import warnings

    import torch
    from rich.console import Console
    from rich.table import Table

    from dynalize.run import setup_logging

    torch.set_num_threads(args.threads)
    setup_logging("WARNING")
    warnings.filterwarnings("ignore")
    logging.getLogger("trl").setLevel(logging.ERROR)
    console = Console()
    total = args.warmup + args.steps

    with tempfile.TemporaryDirectory(prefix="dynalize-bench-") as tmp:
        console.print(f"[dim]dynalize: {total} steps ({args.warmup} warm-up) …[/dim]")
        torch.manual_seed(0)
        load_before = os.getloadavg()[0]
        dyn = dynalize_result(run_dynalize(total, str(Path(tmp) / "dynalize"), args.async_level), args.warmup)
        console.print(f"[dim]TRL GRPOTrainer: {total} steps ({args.warmup} warm-up) …[/dim]")
        torch.manual_seed(0)
        trl = trl_result(run_trl(total, str(Path(tmp) / "trl")), args.warmup)
        load_after = os.getloadavg()[0]

    rows = {"dynalize": summarize(dyn), "TRL GRPOTrainer": summarize(trl)}
    table = Table(title=f"RM-only GRPO throughput: tiny:policy, {PROMPTS_PER_STEP}×{GROUP} rollouts/step, "
                        f"≤{MAX_NEW_TOKENS} new tokens, {args.steps} steps after {args.warmup} warm-up, "
                        f"{args.threads} torch threads")
    for col in ("framework", "step time (s)", "rollouts/s", "tokens/s", "mean completion len"):
        table.add_column(col, justify="left" if col == "framework" else "right")
    for name, r in rows.items():
        table.add_row(name, f"{r['step_mean']:.3f} ± {r['step_sd']:.3f}", f"{r['rollouts_per_s']:.1f}",
                      f"{r['tokens_per_s']:.0f}", f"{r['mean_len']:.1f}")
    console.print(table)

    async_level = 1 if args.async_level is None else args.async_level
    ratio = rows["dynalize"]["rollouts_per_s"] / rows["TRL GRPOTrainer"]["rollouts_per_s"]
    met = ratio >= TARGET
    console.print(f"dynalize / TRL rollouts/s = [bold]{ratio:.2f}×[/bold]  "
                  f"target ≥ {TARGET}×: {'[green]met[/green]' if met else '[red]not met[/red]'}")
    b = dyn["breakdown"]
    console.print("dynalize per step (s): " + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in b.items())
                  + ("  (async: generate of batch k+1 runs during train k; weight_sync queues behind it)"
                     if async_level else ""))
    tb = trl["breakdown"]
    console.print("TRL per step (s): " + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in tb.items())
                  + (f"; step-to-step incl. logging {trl['step_to_step_mean']:.3f}" if trl["step_to_step_mean"] else ""))
    eff = trl["effective"]
    notes = [
        f"TRL: per_device_train_batch_size={MICRO_BATCH} × gradient_accumulation_steps="
        f"{PROMPTS_PER_STEP * GROUP // MICRO_BATCH} → generation_batch_size={eff['generation_batch_size']}, "
        f"steps_per_generation={eff['steps_per_generation']}: one 64-completion generation per optimizer step, "
        "on-policy (no extra old-logprob pass); transformers generate, no vLLM on CPU.",
        f"Loss differs by design: TRL loss_type={eff['loss_type']!r} (beta=0, scale_rewards='none'), dynalize 'prime' "
        "(masked token-level IS); both normalise by the batch's completion tokens.",
        (f"dynalize async_level={async_level}: generates batch k+1 while training on batch k (one step "
         "off-policy); TRL generates then trains, strictly in sequence." if async_level else
         "dynalize async_level=0: on-policy, generate then train, like TRL."),
        f"Completion length: dynalize {dyn['mean_len']:.1f} (truncated {dyn['truncated_frac']:.0%}), "
        f"TRL {trl['mean_len']:.1f} (truncated {trl['truncated_frac']:.0%}); max {MAX_NEW_TOKENS}.",
    ]
    if max(load_before, load_after) > 0.5 * args.threads + 0.5:
        notes.append(f"machine busy: 1-min load average {load_before:.1f} before, {load_after:.1f} after, on "
                     f"{os.cpu_count()} CPUs; timings are noisy, rerun on an idle machine.")
    for n in notes:
        console.print(f"[dim]note: {n}[/dim]")

    if args.json:
        out = {
            "settings": {"steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                         "dynalize_async_level": async_level, "load_avg": [load_before, load_after],
                         "prompts_per_step": PROMPTS_PER_STEP, "group_size": GROUP,
                         "max_new_tokens": MAX_NEW_TOKENS, "lr": LR, "micro_batch_size": MICRO_BATCH},
            "results": rows, "ratio_rollouts_per_s": ratio, "target": TARGET, "target_met": met,
            "dynalize": {k: v for k, v in dyn.items()}, "trl": {k: v for k, v in trl.items()}, "notes": notes,
        }
        Path(args.json).write_text(json.dumps(out, indent=2, default=float), encoding="utf-8")
        console.print(f"[dim]wrote {args.json}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
