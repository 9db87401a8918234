"""A learner-only script for tests/test_fsdp.py, run in one process or under `accelerate launch`:
three steps on fixed batches, then what the test compares, as files in OUT:

- `rank<R>.json`: the distributed type, the parameters this rank holds against the whole model,
  and (rank 0) each step's metrics, the policy version and loss scale after the steps;
- `policy_state.safetensors` (rank 0): what the learner hands the generator (`policy_state`);
- `gathered.safetensors` (rank 0): every parameter all-gathered from its DTensor shards (DTensor's
  own `full_tensor`, not the state-dict path `policy_state` takes).

`--uneven padded|packed`: a reference KL (beta 0.1) and two steps on a batch of 9 sequences whose
shards (5 and 4 sequences) split into different micro-batch counts: 3 and 2 micro-batches of 2
sequences, or 2 and 1 packing bins of 64 tokens; `rank<R>.json` also holds the rank's count.
`--lora`: with LoRA adapters (lr 1e-2), the reference being the base with its adapters off.

`--fp16-overflow`: a float16 policy, and at the second step rank 1 (only) finds an inf in its own
gradient shard; a shared skip decision makes every rank skip that step. `--save-after-2 DIR`:
checkpoint into DIR after step 2 (and go on); `--resume DIR`: load DIR's checkpoint and train
only step 3.

    python tests/fsdp_learner.py OUT [--fp16-overflow] [--save-after-2 DIR | --resume DIR] [--uneven MODE [--lora]]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from dynalize import tiny
from dynalize.backends.accelerate import AccelerateLearner
from dynalize.backends.sharding import local_parameter_share
from dynalize.config import LoraConfig, TrainerConfig
from dynalize.run import exit_process
from dynalize.types import TrainSequence

STEPS = 3
LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def batches() -> list[list[TrainSequence]]:
    """Three batches of 8 sequences of different lengths (padding and micro-batches matter)."""
    rng = random.Random(0)
    out = []
    for _ in range(STEPS):
        seqs = []
        for _ in range(8):
            prompt, reply = rng.randint(3, 8), rng.randint(4, 14)
            ids = [rng.randint(5, 500) for _ in range(prompt + reply)]
            seqs.append(TrainSequence(ids, [0] * prompt + [1] * reply, [0.0] * prompt +
                                      [rng.uniform(-6.0, -2.0) for _ in range(reply)], rng.uniform(-1.5, 1.5)))
        out.append(seqs)
    return out


def uneven_batches() -> list[list[TrainSequence]]:
    """Two batches of 9 sequences: rank 0's shard (every other one from the first) holds 5 of
    30, 30, 20, 10 and 10 tokens, rank 1's 4 of 10 tokens."""
    rng = random.Random(1)
    out = []
    for _ in range(2):
        seqs = []
        for n in (30, 10, 30, 10, 20, 10, 10, 10, 10):
            ids = [rng.randint(5, 500) for _ in range(n)]
            seqs.append(TrainSequence(ids, [0] * 3 + [1] * (n - 3), [0.0] * 3 +
                                      [rng.uniform(-6.0, -2.0) for _ in range(n - 3)], rng.uniform(-1.5, 1.5)))
        out.append(seqs)
    return out


def full(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in tensors.items()}


def poison_rank1_once(learner: AccelerateLearner) -> None:
    """Before the scaler reads the gradients of step 2, rank 1 writes an inf into its own shard."""
    unscale, calls = learner.scaler.unscale_, []

    def unscale_(optimizer):
        calls.append(1)
        if len(calls) == 2 and learner.accelerator.process_index == 1:
            grad = next(p.grad for p in learner.model.parameters() if p.grad is not None)
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[0] = float("inf")
        unscale(optimizer)

    learner.scaler.unscale_ = unscale_


def main(out: Path, fp16_overflow: bool, save: str | None, resume: str | None, uneven: str | None,
         lora: bool) -> None:
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=2)
    if uneven:
        cfg = TrainerConfig(lr=1e-2 if lora else 1e-3, micro_batch_size=2, kl={"beta": 0.1},
                            micro_batch_tokens=64 if uneven == "packed" else None)
    learner = AccelerateLearner(tiny.resolve("tiny:policy"), cfg, dtype="float16" if fp16_overflow else "float32",
                                lora=LORA if lora else None)
    if fp16_overflow:
        poison_rank1_once(learner)
    rank = learner.accelerator.process_index
    local, total = local_parameter_share(learner.model)
    report = {"distributed_type": str(learner.accelerator.distributed_type), "local_params": local,
              "total_params": total}
    steps = uneven_batches() if uneven else batches()
    if uneven:
        shard = steps[0][rank :: learner.accelerator.num_processes]
        report["micro_batches"] = len(learner._micro_batches(shard))
    close_group, learner._close_group = learner._close_group, lambda: None  # the gathering below is a collective
    if rank == 0:
        if resume:
            learner.load(resume)
        report["metrics"] = []
        for step, batch in enumerate(steps):
            if resume and step < 2:
                continue
            report["metrics"].append(learner.train_step(batch))
            if save and step == 1:
                learner.save(save)
        save_file(full(learner.policy_state()), str(out / "policy_state.safetensors"))
        learner.stop_followers()
    else:
        learner.serve()
    report["version"] = learner.version
    report["grad_scale"] = learner.scaler.get_scale() if learner.scaler else None
    gathered = {name: p.full_tensor() if hasattr(p, "full_tensor") else p
                for name, p in learner.model.named_parameters()}  # a collective: every rank, same order
    if rank == 0:
        save_file(full(gathered), str(out / "gathered.safetensors"))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    close_group()  # what stop_followers / serve do at a run's end (a barrier, then the group closed)


if __name__ == "__main__":
    args = sys.argv[2:]

    def value(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    main(Path(sys.argv[1]), "--fp16-overflow" in args, value("--save-after-2"), value("--resume"), value("--uneven"),
         "--lora" in args)
    exit_process(0)  # as a run's rank leaves (dynalize.run): no interpreter teardown, seen to SIGABRT
