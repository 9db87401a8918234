"""The sandbox policy: a tiny Qwen2-style model briefly pre-trained on the sandbox corpus.

`build_sandbox_policy` trains a byte-level BPE tokenizer on the corpus, then trains the model with
next-token loss on ChatML chats (`user: Write about X.` → `assistant: <corpus reply><|im_end|>`,
loss on the assistant part only). Deterministic given the seed and the machine. Registered as
`tiny:sandbox-policy`, so `dynalize.tiny.resolve` builds it once, showing a progress bar (about
100 s on a CPU), and caches it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from ... import tiny
from .grammar import corpus, prompt_text
from .topics import ALL_TOPICS, Topic

POLICY_NAME = "sandbox-policy"
POLICY_VERSION = "1"
"""Bump when the builder's output changes (the cache key includes it)."""

DEFAULT_ARCH = dict(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=256, max_positions=256)
"""The policy shape: head_dim 32, about 0.25M parameters (half in the tied embedding)."""


def _prompt_ids(tokenizer: PreTrainedTokenizerFast, topic: Topic) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt_text(topic)}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _examples(tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[Topic, str]]) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per chat: the prompt as the generator sees it, then reply + <|im_end|>."""
    prompts = {t.name: _prompt_ids(tokenizer, t) for t in ALL_TOPICS}
    replies = tokenizer([r + "<|im_end|>" for _, r in pairs], add_special_tokens=False)["input_ids"]
    return [(prompts[t.name] + ids, len(prompts[t.name])) for (t, _), ids in zip(pairs, replies)]


def _batch(examples: list[tuple[list[int], int]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad)
    labels = torch.full((len(examples), width), -100)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, n_prompt:len(ids)] = torch.tensor(ids[n_prompt:])
        mask[i, :len(ids)] = 1
    return dict(input_ids=input_ids, attention_mask=mask, labels=labels)


def build_sandbox_policy(out: Path, seed: int = 0, steps: int = 1800, batch_size: int = 16, lr: float = 5e-3,
                         vocab_size: int = 2048, threads: int = 1, arch: dict[str, Any] | None = None,
                         topics: list[Topic] | None = None, show_progress: bool = False) -> dict[str, float]:
    """Build and pre-train the sandbox policy into `out`; returns build stats (seconds, final loss).

    One thread by default: a model this small gains little from more, and loses much when other
    processes share the cores. `topics` restricts the corpus to some topics (a faster variant for
    tests); `show_progress` shows a progress bar on stderr (`tiny.resolve` builds it so, once).
    """
    start = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with _progress(show_progress, steps, out.parent) as advance:
            model, tokenizer, loss = _pretrain(seed, steps, batch_size, lr, vocab_size, arch, topics, advance)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        torch.set_num_threads(old_threads)
    return {"seconds": time.perf_counter() - start, "final_loss": loss}


@contextmanager
def _progress(enabled: bool, steps: int, cache: Path) -> Iterator[Callable[[str], None]]:
    """Say what the wait is for, then a progress bar over the build's phases and steps (where stderr
    is a terminal); yields `advance(what is being done now)`."""
    if not enabled:
        yield lambda phase: None
        return
    console = Console(stderr=True)
    start = time.perf_counter()
    console.print(f"Pre-training the sandbox policy, once (about 100 s on a CPU); later runs load it from {cache}")
    columns = (TextColumn("[bold]sandbox policy"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[phase]}"))
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("pre-training", total=steps + 1, phase="writing the corpus, training the tokenizer")
        yield lambda phase: bar.update(task, advance=1, phase=phase)
    console.print(f"Sandbox policy pre-trained in {time.perf_counter() - start:.0f} s")


def _pretrain(seed: int, steps: int, batch_size: int, lr: float, vocab_size: int, arch: dict[str, Any] | None,
              topics: list[Topic] | None, advance: Callable[[str], None]) -> tuple[Any, Any, float]:
    """Tokenizer and model trained on the corpus; (model, tokenizer, final loss)."""
    pairs = corpus(max(1, steps) * batch_size, seed=seed, topics=topics)
    tokenizer = tiny.build_tokenizer([prompt_text(t) for t in ALL_TOPICS] + [r for _, r in pairs[:20000]],
                                     vocab_size=vocab_size)
    advance("pre-training the model")
    cfg = tiny.qwen2_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, **(arch or DEFAULT_ARCH))
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    examples = _examples(tokenizer, pairs)
    random.Random(seed).shuffle(examples)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / max(1, steps)))))
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = _batch(examples[step * batch_size:(step + 1) * batch_size], tokenizer.pad_token_id)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        advance(f"pre-training the model, loss {loss.item():.3f}")
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, loss.item()


@torch.no_grad()
def sample_replies(model_dir: str | Path, topics: list[Topic], n_per_topic: int = 1, max_new_tokens: int = 64,
                   temperature: float = 1.0, seed: int = 0) -> list[tuple[Topic, str, bool]]:
    """(topic, reply, ended) samples from a saved policy; `ended` says it stopped at <|im_end|>."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    wanted = [t for t in topics for _ in range(n_per_topic)]
    prompts = [_prompt_ids(tokenizer, t) for t in wanted]
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    out = model.generate(
        input_ids=torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
        attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
        do_sample=True, temperature=temperature, top_k=0, max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
    )
    results = []
    for topic, row in zip(wanted, out[:, width:].tolist()):
        ended = tokenizer.eos_token_id in row
        ids = row[:row.index(tokenizer.eos_token_id)] if ended else row
        results.append((topic, tokenizer.decode(ids, skip_special_tokens=True).strip(), ended))
    return results


tiny.register(POLICY_NAME, partial(build_sandbox_policy, show_progress=True), POLICY_VERSION)
