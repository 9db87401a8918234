"""A learned reward model for the sandbox: a tiny Bradley–Terry RM trained on pairs the flawed RM labels.

The formula RM (`reward.SandboxRewardModel`) is gold plus pay for planted features. A learned RM
is the realistic version: a sequence classifier trained, like a real preference RM, on pairs of
replies to the same prompt, the reply the formula RM scores higher marked chosen. It is never
told the features; it inherits the formula's spurious preferences from the labels alone, at
whatever strength the data teaches, and adds errors of its own.

The data: for every sandbox topic, replies from the corpus (`grammar.corpus`, which shows the
quirks at their low natural rates) and samples of the pre-trained policy (what RL starts from);
pairs are two distinct replies to one topic. The model: the pre-trained sandbox policy with a
one-output head (`AutoModelForSequenceClassification`), trained with `dynalize.rm.train` (TRL's
RewardTrainer) on what the sandbox task's `rm_input` gives (the chat through its template).
Its scores are then scaled (one factor on the head) so that they spread as the formula RM's do
on the held-out pairs' replies: a reward mix set against the formula RM (Dynalize's λ = 0.5)
weighs the same against the learned one.

Registered as `tiny:sandbox-rm` (the default feature list) and `tiny:sandbox-rm-<list>` for the
other named lists, so `reward_model: {engine: hf, path: "tiny:sandbox-rm"}` builds it once (about
a minute on one core) and caches it. The directory also holds `original_pairs.jsonl`, the pairs
it was trained on (the "original" preference data when it is retrained: docs/rm_retraining.md),
and `rm_training.json`.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ... import tiny
from ...config import TaskConfig
from ...rm.config import RMTrainConfig
from ...rm.pairfile import Pair, write_pairs
from ...types import Message
from .features import FEATURE_SETS, Feature, default_features
from .grammar import corpus, prompt_text
from .pretrain import POLICY_NAME, POLICY_VERSION, sample_replies
from .reward import SandboxRewardModel
from .topics import ALL_TOPICS, Topic

LEARNED_RM_NAME = "sandbox-rm"
LEARNED_RM_VERSION = f"1+policy{POLICY_VERSION}"
"""Bump when the builder's output changes (the cache key includes it, and the policy's version:
the RM starts from the policy and is trained partly on its samples)."""
ORIGINAL_PAIRS = "original_pairs.jsonl"
"""The pairs the learned RM was trained on, kept in its directory."""

TRAINING = dict(lr=1e-3, epochs=3.0, batch_size=32, eval_fraction=0.1, max_eval_pairs=500, max_length=256,
                warmup_ratio=0.05, lr_scheduler="cosine", threads=1, eval_batch_size=128,
                trainer_args={"logging_steps": 50})
"""`dynalize.rm.train` settings of the learned RM (about a minute on one core). Chosen on held-out
pair accuracy alone, before any RL run: lr 5e-4 for 2 epochs reached 0.70, these 0.74."""


def reply_pool(seed: int = 0, corpus_per_topic: int = 16, policy_per_topic: int = 8,
               topics: list[Topic] | None = None) -> dict[str, list[str]]:
    """Distinct replies per topic name: corpus replies, then samples of the pre-trained policy."""
    topics = topics or ALL_TOPICS
    pool: dict[str, list[str]] = {t.name: [] for t in topics}
    rng = random.Random(seed)
    for t in topics:
        pool[t.name] += [r for _, r in corpus(corpus_per_topic, seed=rng.randrange(2**31), topics=[t])]
    if policy_per_topic:
        policy = tiny.resolve(f"tiny:{POLICY_NAME}")
        for t, reply, _ in sample_replies(policy, topics, n_per_topic=policy_per_topic, seed=seed):
            if reply.strip():
                pool[t.name].append(reply)
    return {name: list(dict.fromkeys(replies)) for name, replies in pool.items()}


def labelled_pairs(pool: dict[str, list[str]], judge: SandboxRewardModel, n_pairs: int, seed: int = 0) -> list[Pair]:
    """`n_pairs` pairs of two distinct replies to one topic (topics in turn), the one `judge`
    scores higher chosen; pairs the judge scores equal are skipped."""
    rng = random.Random(seed)
    topics = [t for t in ALL_TOPICS if len(pool.get(t.name, [])) >= 2]
    pairs: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    attempts = 0
    while len(pairs) < n_pairs and attempts < 20 * n_pairs:
        attempts += 1
        topic = topics[len(pairs) % len(topics)] if attempts <= n_pairs else rng.choice(topics)
        a, b = rng.sample(pool[topic.name], 2)
        sa, sb = judge.score_one(topic, a), judge.score_one(topic, b)
        if sa == sb or (a, b) in seen or (b, a) in seen:
            continue
        seen.add((a, b))
        chosen, rejected = (a, b) if sa > sb else (b, a)
        pairs.append(Pair([Message("user", prompt_text(topic))], chosen, rejected, prompt_id=topic.id,
                          source={"labeller": "sandbox formula RM", "margin": round(abs(sa - sb), 4)}))
    return pairs


def build_learned_rm(out: Path, features: list[Feature] | None = None, seed: int = 0, n_pairs: int = 4000,
                     **training: Any) -> dict[str, Any]:
    """Label pairs with the formula RM of `features`, train the learned RM into `out`, match its
    scale to the formula's; returns the training summary (also in `out/rm_training.json`)."""
    from ...rm.train import (SUMMARY, PairReader, evaluate, rescale_head, score_items, split_pairs, task_from,
                             train_reward_model)

    t0 = time.perf_counter()
    features = default_features() if features is None else list(features)
    judge = SandboxRewardModel(features)
    pairs = labelled_pairs(reply_pool(seed), judge, n_pairs, seed)
    task = TaskConfig(name="sandbox", args={"features": [f.model_dump() for f in features]})
    with tempfile.TemporaryDirectory() as tmp:
        pair_file = Path(tmp) / ORIGINAL_PAIRS
        write_pairs(pair_file, pairs)
        cfg = RMTrainConfig(base=f"tiny:{POLICY_NAME}", pairs=str(pair_file), out=str(out), overwrite=True,
                            task=task, seed=seed, **(TRAINING | training))
        summary = train_reward_model(cfg)
        shutil.copy(pair_file, Path(out) / ORIGINAL_PAIRS)
    summary["files"] = {"original": ORIGINAL_PAIRS}
    # scale: the learned scores spread as the formula's over the held-out replies
    held_set = split_pairs("original", ORIGINAL_PAIRS, pairs, cfg.eval_fraction, cfg.max_eval_pairs, cfg.seed)
    reader = PairReader(task_from(cfg))
    items = [x for pair in zip(*reader.items(held_set.held_out)) for x in pair]
    learned = score_items(str(out), items, cfg)
    formula = [judge.score_item(x) for x in items]
    factor = statistics.pstdev(formula) / max(statistics.pstdev(learned), 1e-12)
    rescale_head(str(out), factor)
    summary["scale"] = factor
    summary["after"] = evaluate(str(out), [held_set], reader, cfg, None)  # margins on the scale kept
    summary["seconds"] = time.perf_counter() - t0
    summary["labeller"] = {"features": [f.label for f in features], "pairs": len(pairs)}
    (Path(out) / SUMMARY).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary


def _register() -> None:
    for name, make in FEATURE_SETS.items():
        suffix = "" if name == "default" else f"-{name}"
        tiny.register(f"{LEARNED_RM_NAME}{suffix}", lambda out, make=make: build_learned_rm(out, make()),
                      LEARNED_RM_VERSION)


_register()
