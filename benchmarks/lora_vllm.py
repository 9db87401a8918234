"""LoRA on in-process vLLM: what to hand the generator after each step, the adapter or merged weights.

    .venv-vllm/bin/python benchmarks/lora_vllm.py [--rounds 3] [--prompts 32] [--tokens 64]

One LoRA learner step on the tiny policy, then, per round and per arm, in turn (ABAB):
- merged: the merged weights pushed in memory (`VLLMEngine.load_weights`, what dynalize does),
  then a batch generated;
- adapter: the adapter written to disk (peft's save_pretrained) and a batch generated under a
  new `LoRARequest` (vLLM loads each new adapter id once; `enable_lora`, `max_lora_rank` = r).
Printed: update s, generation s and generated tokens/s per arm, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from dynalize import tiny
    from dynalize.backends.accelerate import AccelerateLearner
    from dynalize.backends.vllm import VLLMEngine
    from dynalize.config import LoraConfig, TrainerConfig
    from dynalize.types import TrainSequence

    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    path = tiny.resolve("tiny:policy")
    learner = AccelerateLearner(path, TrainerConfig(lr=1e-3), lora=LoraConfig(r=args.rank))
    learner.train_step([TrainSequence(list(range(5, 40)), [0] * 5 + [1] * 30, [-3.0] * 35, a) for a in (1.0, -1.0)])
    merged = learner.policy_state()
    prompts = [{"prompt_token_ids": [5 + i % 50, 9, 17, 23]} for i in range(args.prompts)]
    params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, temperature=1.0, seed=0, logprobs=0)

    engines = {"merged": VLLMEngine(path, max_model_len=256),
               "adapter": VLLMEngine(path, max_model_len=256, enable_lora=True, max_lora_rank=args.rank, max_loras=1)}
    times = {name: {"update": [], "generate": []} for name in engines}
    work = Path(tempfile.mkdtemp(prefix="lora_vllm_"))
    for k in range(args.rounds + 1):  # round 0 warms up
        for name, engine in engines.items():
            start = time.perf_counter()
            request = None
            if name == "merged":
                engine.load_weights(merged)
            else:
                learner.unwrapped.save_pretrained(work / f"v{k}")
                request = LoRARequest(f"v{k}", k + 1, str(work / f"v{k}"))
            updated = time.perf_counter()
            out = engine.llm.generate(prompts, params, lora_request=request, use_tqdm=False)
            done = time.perf_counter()
            assert sum(len(o.outputs[0].token_ids) for o in out) == args.prompts * args.tokens
            if k:
                times[name]["update"].append(updated - start)
                times[name]["generate"].append(done - updated)
    table = Table(title=f"in-process vLLM (CPU build), tiny policy, LoRA r {args.rank}, {args.prompts} prompts × "
                        f"{args.tokens} tokens, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for col in ("arm", "update s", "generate s", "tokens/s"):
        table.add_column(col)
    speed = {}
    for name, t in times.items():
        gen = statistics.mean(t["generate"])
        total = statistics.mean(t["update"]) + gen
        speed[name] = args.prompts * args.tokens / total
        table.add_row(name, f"{statistics.mean(t['update']):.3f}", f"{gen:.3f}", f"{speed[name]:,.0f}")
    console = Console()
    console.print(table)
    console.print(f"merged / adapter tokens/s (update included): {speed['merged'] / speed['adapter']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
