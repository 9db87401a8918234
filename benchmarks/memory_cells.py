"""benchmarks/memory.py's cells: one part (generation, learner step, RM scoring) of one framework,
measured in this process (`python benchmarks/memory.py --cell JSON` runs `cell`).

The peak is reset once the models are loaded and the part's inputs prepared (Linux
`/proc/self/clear_refs` for the resident set, torch's CUDA peak statistics), then the part runs once.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = [{"role": "user", "content": "Write about the sea."}]




def reset_peak() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def parameter_bytes(*models) -> int:
    seen: set[int] = set()
    total = 0
    for m in models:
        for p in m.parameters():
            if p.data_ptr() not in seen:  # tied weights once
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
    return total


def measure(fn, *models) -> dict[str, Any]:
    """Run `fn` once; its peak memory (the process's resident set, and torch's on a GPU)."""
    import torch

    reset_peak()
    before = status_kib("VmRSS")
    start = time.perf_counter()
    extra = fn() or {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    out = {"seconds": round(time.perf_counter() - start, 2), "rss_before_mib": before / 1024,
           "peak_rss_mib": status_kib("VmHWM") / 1024, "weights_mib": parameter_bytes(*models) / 2**20, **extra}
    out["peak_minus_weights_mib"] = out["peak_rss_mib"] - out["weights_mib"]
    if torch.cuda.is_available():
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return out


def cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement: `spec` names framework, part, policy, rm, batch, new_tokens, micro_batch, dtype, fast."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(offline, "1")
    import logging
    import warnings

    import torch

    from dynalize.run import setup_logging

    setup_logging("WARNING")
    warnings.filterwarnings("ignore")
    for noisy in ("trl", "accelerate", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    torch.manual_seed(0)
    run = DYNALIZE if spec["framework"] == "dynalize" else TRL
    return {**spec, **run[spec["part"]](spec)}


def reply_texts(tokenizer, n: int, tokens: int) -> list[str]:
    """`n` texts of about `tokens` tokens (random ids of the trained part of the vocabulary)."""
    g = __import__("torch").Generator().manual_seed(0)
    ids = __import__("torch").randint(3, 4096, (n, tokens), generator=g)
    return tokenizer.batch_decode(ids.tolist())


# dynalize


def dyn_generation(spec):
    import anyio

    from dynalize.backends.base import SamplingParams
    from dynalize.backends.hf import HFGenerator
    from dynalize.rollouts import prompt_token_ids
    from dynalize.types import Message

    gen = HFGenerator(spec["policy"], dtype=spec["dtype"], batch_size=spec["batch"], fast=spec["fast"])
    prompt = prompt_token_ids(gen.tokenizer, [Message(**m) for m in PROMPT])
    anyio.run(gen.generate, [prompt], SamplingParams(max_new_tokens=2, seed=1))  # lazy initialisation aside

    def part():
        out = anyio.run(gen.generate, [prompt] * spec["batch"], SamplingParams(max_new_tokens=spec["new_tokens"], seed=0))
        return {"mean_len": sum(len(c.token_ids) for c in out) / len(out)}

    return measure(part, gen.model)


def dyn_learner(spec):
    import torch

    from dynalize.backends.accelerate import AccelerateLearner
    from dynalize.config import TrainerConfig
    from dynalize.types import TrainSequence

    learner = AccelerateLearner(spec["policy"], TrainerConfig(micro_batch_size=spec["micro_batch"]), dtype=spec["dtype"])
    vocab = learner.unwrapped.config.vocab_size
    g = torch.Generator().manual_seed(0)
    n_prompt, n_new = 16, spec["new_tokens"]
    batch = [TrainSequence(torch.randint(3, vocab, (n_prompt + n_new,), generator=g).tolist(),
                           [0] * n_prompt + [1] * n_new, [0.0] * n_prompt + [-float(torch.log(torch.tensor(vocab)))] * n_new,
                           1.0 if i % 2 else -1.0) for i in range(spec["batch"])]
    return measure(lambda: {"loss": learner.train_step(batch)["loss"]}, learner.unwrapped)


def dyn_rm(spec):
    import anyio

    from dynalize.backends.hf import HFRewardModel

    rm = HFRewardModel(spec["rm"], batch_size=spec["batch"], max_length=spec["new_tokens"] + 64, dtype=spec["dtype"])
    texts = reply_texts(rm.tokenizer, spec["batch"], spec["new_tokens"])
    return measure(lambda: {"scores": len(anyio.run(rm.score, texts))}, rm.model)


DYNALIZE = {"generation": dyn_generation, "learner": dyn_learner, "rm": dyn_rm}


# TRL


def trl_trainer(spec, reward_funcs=None, **config):
    """GRPOTrainer on the policy, one generation of `batch` completions per optimizer step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from dynalize.backends.hf import DTYPES

    tokenizer = AutoTokenizer.from_pretrained(spec["policy"])
    model = AutoModelForCausalLM.from_pretrained(spec["policy"], dtype=DTYPES[spec["dtype"]])
    group = min(spec["batch"], 4)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-memory-"), per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=spec["batch"] // spec["micro_batch"], num_generations=group,
        max_completion_length=spec["new_tokens"], temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        scale_rewards="none", learning_rate=1e-6, max_steps=1, report_to=[], save_strategy="no",
        bf16=False, fp16=False, use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=0, **config)
    data = Dataset.from_list([{"prompt": PROMPT}] * spec["batch"])
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs or (lambda completions, **kw: [0.0] * len(completions)),
                          args=args, train_dataset=data, processing_class=tokenizer)
    return trainer, [{"prompt": PROMPT} for _ in range(spec["batch"])]


def trl_generation(spec):
    trainer, rows = trl_trainer(spec)
    trainer.model.eval()
    prompts = [r["prompt"] for r in rows]

    def part():
        out = trainer._generate(prompts)
        completion_ids = out[1]
        return {"mean_len": sum(map(len, completion_ids)) / len(completion_ids)}

    return measure(part, trainer.model)


def trl_learner(spec):
    from trl.trainer.utils import split_tensor_dict

    trainer, rows = trl_trainer(spec)
    trainer.model.train()
    inputs = trainer._generate_and_score_completions(rows)
    micro = split_tensor_dict(inputs, spec["batch"] // spec["micro_batch"])
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = len(micro)  # set by Trainer's training loop
    n_items = int(inputs["completion_mask"].sum())

    def part():  # what Trainer.training_step does per micro-batch, without its _prepare_inputs (generation)
        loss = 0.0
        for m in micro:
            step_loss = trainer.compute_loss(trainer.model, m, num_items_in_batch=n_items)
            trainer.accelerator.backward(step_loss)
            loss += float(step_loss)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        return {"loss": loss}

    return measure(part, trainer.model)


def trl_rm(spec):
    from transformers import AutoModelForSequenceClassification

    from dynalize.backends.hf import DTYPES

    rm = AutoModelForSequenceClassification.from_pretrained(spec["rm"], dtype=DTYPES[spec["dtype"]])
    trainer, rows = trl_trainer(spec, reward_funcs=[rm])
    completions = reply_texts(trainer.processing_class, spec["batch"], spec["new_tokens"])
    prompts = ["Write about the sea."] * spec["batch"]
    rows = [{"prompt": p} for p in prompts]
    return measure(lambda: {"scores": len(trainer._calculate_rewards(rows, prompts, completions, [[0]] * len(rows)))},
                   trainer.model, rm)


TRL = {"generation": trl_generation, "learner": trl_learner, "rm": trl_rm}
