"""The learner: padded vs packed micro-batches, and the optimizer state LoRA saves (issue 27).

    python benchmarks/learner.py [--sequences 64] [--rounds 3] [--threads 1] [--budget 2048]

Packing: one batch of RL-shaped sequences (a 32-token prompt, replies of long-tailed lengths,
20 to 1,000 tokens, as a group sampled at temperature 1 mixes them) trained by the tiny policy,
padded (`micro_batch_size` 16, each micro-batch padded to its longest) and packed
(`micro_batch_tokens`), in turn (ABAB over `--rounds`, so machine load hits both alike). Printed:
the share of the model's input that is padding, and learner tokens/s (real tokens / step time).

LoRA: the optimizer (AdamW) state after one step, full fine-tuning vs `policy.lora` (r 16,
all-linear), on the tiny policy, in bytes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rl_batch(n: int, seed: int = 0):
    from dynalize.types import TrainSequence

    rng = random.Random(seed)
    out = []
    for i in range(n):
        reply = int(min(1000, max(20, rng.lognormvariate(4.6, 0.9))))  # median ~100, a long tail
        ids = [rng.randrange(5, 200) for _ in range(32 + reply)]
        out.append(TrainSequence(ids, [0] * 32 + [1] * reply, [-2.0] * len(ids), rng.choice([-1.0, 1.0])))
    return out


def step_time(learner, batch) -> float:
    start = time.perf_counter()
    learner.train_step(batch)
    return time.perf_counter() - start


def optimizer_bytes(learner) -> int:
    return sum(t.numel() * t.element_size() for s in learner.optimizer.state_dict()["state"].values()
               for t in s.values() if hasattr(t, "numel"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=int, default=2048, help="micro_batch_tokens of the packed arm")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from rich.console import Console
    from rich.table import Table

    from dynalize import tiny
    from dynalize.backends import packing
    from dynalize.backends.accelerate import AccelerateLearner
    from dynalize.config import LoraConfig, TrainerConfig

    torch.set_num_threads(args.threads)
    path = tiny.resolve("tiny:policy")
    batch = rl_batch(args.sequences)
    lengths = [len(s.input_ids) for s in batch]
    arms = {"padded": TrainerConfig(micro_batch_size=16), "packed": TrainerConfig(micro_batch_tokens=args.budget)}
    learners = {name: AccelerateLearner(path, cfg) for name, cfg in arms.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for name, lrn in learners.items():
        step_time(lrn, batch)  # warm-up
    for _ in range(args.rounds):
        for name, lrn in learners.items():
            times[name].append(step_time(lrn, batch))
    real = sum(lengths)
    table = Table(title=f"learner step, {len(batch)} sequences, {real} tokens "
                        f"(lengths {min(lengths)}-{max(lengths)}), tiny policy, {args.threads} thread(s), "
                        f"load average {os.getloadavg()[0]:.1f}")
    for col in ("arm", "micro-batches", "padding share", "step s (mean ± sd)", "tokens/s"):
        table.add_column(col)
    speed = {}
    for name, lrn in learners.items():
        groups = packing.pack(lengths, args.budget) if name == "packed" else \
            [list(range(i, min(i + 16, len(batch)))) for i in range(0, len(batch), 16)]
        share = packing.padding_share(lengths, groups, packed=name == "packed")
        mean, sd = statistics.mean(times[name]), statistics.stdev(times[name]) if len(times[name]) > 1 else 0.0
        speed[name] = real / mean
        table.add_row(name, str(len(groups)), f"{share:.1%}", f"{mean:.2f} ± {sd:.2f}", f"{speed[name]:,.0f}")
    console = Console()
    console.print(table)
    console.print(f"packed / padded tokens/s: {speed['packed'] / speed['padded']:.2f}×")

    states = {}
    for name, lora in (("full", None), ("lora r=16", LoraConfig(r=16))):
        lrn = AccelerateLearner(path, TrainerConfig(), lora=lora)
        lrn.train_step(batch[:4])
        trainable = sum(p.numel() for p in lrn.model.parameters() if p.requires_grad)
        states[name] = (trainable, optimizer_bytes(lrn))
    table = Table(title="AdamW state after one step, tiny policy")
    for col in ("training", "trainable parameters", "optimizer state"):
        table.add_column(col)
    for name, (n, b) in states.items():
        table.add_row(name, f"{n:,}", f"{b / 2**20:.2f} MiB")
    console.print(table)
    full, lora = states["full"][1], states["lora r=16"][1]
    console.print(f"LoRA's optimizer state is {lora / full:.1%} of full fine-tuning's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
