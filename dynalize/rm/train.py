"""Bradley–Terry reward-model training: loss −log σ(r_chosen − r_rejected), with TRL's RewardTrainer.

The RM reads each reply exactly as it will in a run: the task's `rm_input` builds the item
(raw text or a chat) and `dynalize.backends.hf.encode_rm_input` (the `hf` engine's own encoder)
turns it into tokens, handed to RewardTrainer already tokenized. Held-out pairs of each file
are scored before and after training through the `hf` engine itself (`HFRewardModel`), so the
accuracy printed is the accuracy of the RM a run loads. Devices, mixed precision, DDP / FSDP /
DeepSpeed and the progress bar are the Trainer's (Accelerate underneath:
`accelerate launch -m dynalize.rm train ...`).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from ..errors import ConfigError
from ..extras import require
from ..hooks import optional, owner_name, user_code
from ..tasks.base import Task, build_task
from ..types import Message, Prompt
from .config import RMTrainConfig
from .pairfile import Pair, read_pairs

SUMMARY = "rm_training.json"
"""The file in the output directory that keeps what training measured."""


@dataclass
class PairSet:
    """One pair file, split into training and held-out pairs."""

    name: str
    path: str
    train: list[Pair]
    held_out: list[Pair]


def split_pairs(name: str, path: str, pairs: list[Pair], fraction: float, cap: int | None, seed: int) -> PairSet:
    """Hold out `fraction` of the pairs (at most `cap`, at least one when `fraction` > 0 and there
    are two or more), chosen by a seeded shuffle: the same file and seed give the same split."""
    n = min(cap or len(pairs), round(len(pairs) * fraction))
    if fraction > 0 and len(pairs) > 1:
        n = max(1, min(n, len(pairs) - 1))
    order = list(range(len(pairs)))
    random.Random(f"{seed}:{name}").shuffle(order)
    held = set(order[:n])
    return PairSet(name, path, [p for i, p in enumerate(pairs) if i not in held],
                   [p for i, p in enumerate(pairs) if i in held])


class PairReader:
    """What the RM reads of a pair's reply: the task's `rm_input` (with the task prompt of the
    pair's `prompt_id` when the hook names `prompt`), or, without a task, the conversation plus
    the reply as a chat."""

    def __init__(self, task: Task | None):
        self.task = task
        self.prompts: dict[str, Prompt] = {}
        if task is not None:
            for split in ("train", "eval"):
                with user_code(owner_name("task", task), "prompts"):
                    self.prompts.update({p.id: p for p in task.prompts(split)})

    def item(self, pair: Pair, reply: str) -> Any:
        if self.task is None:
            return [*pair.prompt, Message("assistant", reply)]
        prompt = self.prompts.get(pair.prompt_id or "") or Prompt(pair.prompt_id or "", list(pair.prompt))
        with user_code(owner_name("task", self.task), "rm_input"):
            return self.task.rm_input(list(pair.prompt), reply, **optional(self.task.rm_input, prompt=prompt))

    def items(self, pairs: list[Pair]) -> tuple[list[Any], list[Any]]:
        return [self.item(p, p.chosen) for p in pairs], [self.item(p, p.rejected) for p in pairs]


def task_from(cfg: RMTrainConfig) -> Task | None:
    return build_task(cfg.task.name, cfg.task.args, seed=cfg.seed) if cfg.task else None


def has_reward_head(model_dir: str) -> bool:
    """Whether a model directory is a sequence classifier with one output (an RM), not a bare LM."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    return getattr(c, "num_labels", None) == 1 and any("ForSequenceClassification" in a
                                                       for a in (c.architectures or []))


def previous_rm(cfg: RMTrainConfig, base_dir: str) -> str | None:
    """The directory of the RM the trained one replaces: `previous`, else the base if it is an RM."""
    from ..build import model_dir

    if cfg.previous is None:
        return base_dir if has_reward_head(base_dir) else None
    try:
        found = model_dir(cfg.previous)
    except FileNotFoundError as e:
        raise ConfigError(f"previous: {e}") from None
    if not has_reward_head(found):
        raise ConfigError(f"previous: {cfg.previous} is not a reward model (no one-output sequence-classification "
                          f"head)")
    return found


# --- scoring through the hf engine -------------------------------------------------------------

def score_items(model_dir: str, items: list[Any], cfg: RMTrainConfig, console: Console | None = None,
                label: str = "scoring") -> list[float]:
    """Scores of `items` by the `hf` engine loading `model_dir`, as a run would, with a progress bar."""
    import torch
    from rich.progress import Progress

    from ..backends.hf import HFRewardModel

    torch.manual_seed(cfg.seed)
    rm = HFRewardModel(model_dir, batch_size=cfg.eval_batch_size, max_length=cfg.max_length, dtype=cfg.dtype)
    out: list[float] = []
    chunk = cfg.eval_batch_size * 8
    with Progress(console=console, transient=True, disable=console is None) as bar:
        job = bar.add_task(label, total=len(items))
        for i in range(0, len(items), chunk):
            out.extend(anyio.run(rm.score, items[i:i + chunk]))
            bar.advance(job, len(items[i:i + chunk]))
    del rm
    return out


def pair_accuracy(chosen: list[float], rejected: list[float]) -> dict[str, float]:
    """Share of pairs whose chosen reply scores strictly higher, the mean margin, and the BT loss."""
    if not chosen:
        return {}
    margins = [c - r for c, r in zip(chosen, rejected)]
    return {"accuracy": statistics.fmean(m > 0 for m in margins), "margin": statistics.fmean(margins),
            "loss": statistics.fmean(bt_loss(m) for m in margins), "pairs": len(margins)}


def bt_loss(margin: float) -> float:
    """−log σ(margin), computed stably."""
    return math.log1p(math.exp(-margin)) if margin > -30 else -margin


def evaluate(model_dir: str, sets: list[PairSet], reader: PairReader, cfg: RMTrainConfig,
             console: Console | None) -> dict[str, dict[str, float]]:
    """Held-out accuracy per pair file, by the `hf` engine."""
    out = {}
    for s in sets:
        if not s.held_out:
            continue
        chosen, rejected = reader.items(s.held_out)
        scores = score_items(model_dir, chosen + rejected, cfg, console, f"held-out {s.name}")
        out[s.name] = pair_accuracy(scores[:len(chosen)], scores[len(chosen):])
    return out


# --- the reward head's scale -------------------------------------------------------------------

def reward_head(model: Any) -> Any:
    """The last linear layer with one output: the reward head of a sequence classifier."""
    import torch

    heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not heads:
        raise ConfigError("keep_scale: the trained model has no linear layer with one output to rescale")
    return heads[-1]


def rescale_head(model_dir: str, factor: float) -> None:
    """Multiply the RM's scores by `factor` (its reward head's weight and bias), saved in place."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    head = reward_head(model)
    with torch.no_grad():
        head.weight.mul_(factor)
        if head.bias is not None:
            head.bias.mul_(factor)
    model.save_pretrained(model_dir)


# --- training ----------------------------------------------------------------------------------

def check_out(cfg: RMTrainConfig) -> Path:
    out = Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not cfg.overwrite:
        raise ConfigError(f"{out} exists and is not empty: choose another --out or pass --overwrite")
    return out


def tokenized(tokenizer: Any, reader: PairReader, pairs: list[Pair], max_length: int) -> dict[str, list[list[int]]]:
    """`chosen_ids` / `rejected_ids` columns, encoded as the `hf` engine encodes."""
    from ..backends.hf import encode_rm_input

    chosen, rejected = reader.items(pairs)
    return {"chosen_ids": [encode_rm_input(tokenizer, x, max_length) for x in chosen],
            "rejected_ids": [encode_rm_input(tokenizer, x, max_length) for x in rejected]}


def train_reward_model(cfg: RMTrainConfig, console: Console | None = None) -> dict[str, Any]:
    """Train, save to `cfg.out`, and return (and write to `out/rm_training.json`) what was measured.

    Every input is checked before anything is written: bad pair files, a missing base model, a
    task that fails to start or a non-empty output directory stop with one line."""
    import torch
    from accelerate import PartialState

    for module in ("trl", "datasets"):
        require(module, "config error: training a reward model", extra="rm")
    from datasets import Dataset

    from ..backends.hf import load_tokenizer
    from ..build import build_reward_trainer, model_dir

    t0 = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    files = [("original", cfg.pairs)] + [("new" if len(cfg.extra) == 1 else f"new{i + 1}", p)
                                         for i, p in enumerate(cfg.extra)]
    sets = [split_pairs(name, path, read_pairs(path), cfg.eval_fraction, cfg.max_eval_pairs, cfg.seed)
            for name, path in files]
    try:
        base = model_dir(cfg.base)
    except FileNotFoundError as e:
        raise ConfigError(f"--base: {e}") from None
    out = check_out(cfg)
    reader = PairReader(task_from(cfg))
    state = PartialState()
    main = state.is_main_process
    show = console if main else None
    previous = previous_rm(cfg, base)
    if cfg.keep_scale and previous is None:
        raise ConfigError(f"keep_scale needs a previous RM: {cfg.base} has no reward head; set previous=DIR")
    before = evaluate(previous, sets, reader, cfg, show) if previous and main else {}

    tokenizer = load_tokenizer(base)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train = [p for s in sets for p in s.train]
    if not train:
        raise ConfigError("no training pairs left after holding out the evaluation pairs")
    columns = tokenized(tokenizer, reader, train, cfg.max_length)
    trainer = build_reward_trainer(cfg, base, tokenizer, Dataset.from_dict(columns))
    result = trainer.train()
    state.wait_for_everyone()
    if out.exists() and cfg.overwrite and main:
        shutil.rmtree(out)
    trainer.save_model(str(out))
    state.wait_for_everyone()
    if main:
        (out / "training_args.bin").unlink(missing_ok=True)  # a pickle: the settings are in rm_training.json
    train_loss = float(result.training_loss)
    del trainer
    summary: dict[str, Any] = {}
    if main:
        scale = None
        if cfg.keep_scale:
            sample = random.Random(cfg.seed).sample(train, min(len(train), 512))  # from every file
            items = [x for pair in zip(*reader.items(sample)) for x in pair]
            old, new = score_items(previous, items, cfg), score_items(str(out), items, cfg)
            scale = statistics.pstdev(old) / max(statistics.pstdev(new), 1e-12)
            rescale_head(str(out), scale)
        after = evaluate(str(out), sets, reader, cfg, show)
        summary = {
            "base": cfg.base, "previous": cfg.previous or (cfg.base if previous else None), "out": str(out),
            "seconds": time.perf_counter() - t0, "train_loss": train_loss,
            "train_pairs": {s.name: len(s.train) for s in sets},
            "held_out_pairs": {s.name: len(s.held_out) for s in sets},
            "files": {s.name: s.path for s in sets}, "before": before, "after": after, "scale": scale,
            "config": cfg.model_dump(mode="json"),
        }
        (out / SUMMARY).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary
