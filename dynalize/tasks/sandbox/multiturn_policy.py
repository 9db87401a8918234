"""The multi-turn sandbox policy: the sandbox policy fine-tuned on conversations.

The single-turn policy (`tiny:sandbox-policy`) has only seen "Write about X." followed by one
reply; after a second user turn it writes nonsense (held-out gold ~0.02 instead of ~0.4). This
builder fine-tunes it on conversations of 1 to `MAX_TURNS` corpus replies (the same grammar,
quirks at the same low rates) with the multi-turn task's own simulated user between them, loss on
the replies only, tokenised exactly as rollouts are (the prompt's template tokens, each reply
followed by <|im_end|>, then the template text between turns: `dynalize.rollouts`). Registered
as `tiny:sandbox-policy-multiturn`, built once into the cache on first use.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from ... import tiny
from ...rollouts import between_turns_ids, encode, prompt_token_ids
from .grammar import sample_reply
from .multiturn import MAX_TURNS, play_user, topic_plan
from .pretrain import POLICY_NAME, POLICY_VERSION
from .topics import ALL_TOPICS, Topic

MULTITURN_POLICY_NAME = "sandbox-policy-multiturn"
MULTITURN_POLICY_VERSION = f"1+{POLICY_VERSION}"
"""Bump the first part when this builder's output changes; the second follows the base policy."""


def conversation_example(tokenizer: PreTrainedTokenizerBase, replies: list[str],
                         plan: list[Topic]) -> tuple[list[int], list[int]]:
    """(token ids, labels) of the conversation `replies` make along the topic `plan` with the
    simulated user: labels are the ids on the replies' tokens (each with its <|im_end|>), -100 elsewhere."""
    messages = play_user(plan, replies)
    eos = tokenizer.eos_token
    ids = prompt_token_ids(tokenizer, messages[:1])
    labels = [-100] * len(ids)
    for k in range(1, len(messages), 2):
        reply = encode(tokenizer, messages[k].content + eos)
        ids += reply
        labels += reply
        if k + 1 < len(messages):
            between = between_turns_ids(tokenizer, messages[:k], messages[k + 1].content, eos)
            ids += between
            labels += [-100] * len(between)
    return ids, labels


def _batch(examples: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    out = dict(input_ids=torch.full((len(examples), width), pad), labels=torch.full((len(examples), width), -100),
               attention_mask=torch.zeros((len(examples), width), dtype=torch.long))
    for i, (ids, labels) in enumerate(examples):
        out["input_ids"][i, :len(ids)] = torch.tensor(ids)
        out["labels"][i, :len(ids)] = torch.tensor(labels)
        out["attention_mask"][i, :len(ids)] = 1
    return out


def build_multiturn_policy(out: Path, seed: int = 0, steps: int = 400, batch_size: int = 8, lr: float = 2e-3,
                           threads: int = 1, base: str | Path | None = None, topics: list[Topic] | None = None,
                           log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Fine-tune the sandbox policy (or the model directory `base`) on conversations of
    1..MAX_TURNS replies into `out`; returns build stats (seconds, final loss). `topics` restricts
    the conversations to some topics (a faster variant for tests). Deterministic given the seed
    and the machine."""
    start = time.perf_counter()
    base = base or tiny.resolve(f"{tiny.TINY_PREFIX}{POLICY_NAME}")
    pool = topics or ALL_TOPICS
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base)
        rng = random.Random(seed)
        examples = []
        for _ in range(steps * batch_size):
            plan = topic_plan(rng.choice(pool), pool, MAX_TURNS, seed=rng.random())
            turns = rng.randint(1, MAX_TURNS)
            examples.append(conversation_example(tokenizer, [sample_reply(t, rng) for t in plan[:turns]], plan))
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
        model.train()
        loss = torch.tensor(float("nan"))
        for step in range(steps):
            loss = model(**_batch(examples[step * batch_size:(step + 1) * batch_size], tokenizer.pad_token_id)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if log and (step + 1) % 100 == 0:
                log(f"step {step + 1}/{steps} loss {loss.item():.3f} {time.perf_counter() - start:.0f}s")
        model.eval()
        model.config.max_position_embeddings = 512  # conversations run past the base's 256 (RoPE: no weights change)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        torch.set_num_threads(old_threads)
    return {"seconds": time.perf_counter() - start, "final_loss": loss.item()}


tiny.register(MULTITURN_POLICY_NAME, build_multiturn_policy, MULTITURN_POLICY_VERSION)
