"""Helpers for the learner's tests: fixed batches and the gradients of one step."""

from __future__ import annotations

import random

import torch

from dynalize import tiny
from dynalize.backends.accelerate import AccelerateLearner
from dynalize.types import TrainSequence


def mixed_batch(seed: int = 0, lengths=(12, 30, 7, 22, 40, 9, 17, 25)) -> list[TrainSequence]:
    """Sequences of mixed lengths: a 3-token prompt, then policy tokens, alternating advantages."""
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(5, 200) for _ in range(n)]
        out.append(TrainSequence(ids, [0] * 3 + [1] * (n - 3), [rng.uniform(-4, -1) for _ in range(n)],
                                 0.5 if i % 2 == 0 else -0.75))
    return out


def multiturn_batch(seed: int = 1) -> list[TrainSequence]:
    """Multi-turn rollouts: policy replies between user turns (several policy spans per sequence)."""
    rng = random.Random(seed)
    out = []
    for i, spans in enumerate([(4, 6, 3, 5), (2, 9, 4, 2, 3, 7), (6, 3), (3, 4, 5, 6, 2, 2)]):
        ids, mask = [], []
        for j, n in enumerate(spans):
            ids += [rng.randrange(5, 200) for _ in range(n)]
            mask += [j % 2] * n  # even spans: system / user turns; odd: the policy's replies
        out.append(TrainSequence(ids, mask, [rng.uniform(-4, -1) if m else 0.0 for m in mask], 1.0 - i * 0.6))
    return out


def learner(cfg, path: str | None = None, **kw) -> AccelerateLearner:
    torch.manual_seed(0)
    return AccelerateLearner(path or tiny.resolve("tiny:policy"), cfg, **kw)


def step_with_grads(lrn: AccelerateLearner, batch) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One train_step's metrics and the gradients the optimizer stepped on."""
    grads: dict[str, torch.Tensor] = {}
    inner = lrn.optimizer.step

    def step(*a, **k):
        grads.update({n: p.grad.clone() for n, p in lrn.model.named_parameters() if p.grad is not None})
        return inner(*a, **k)

    lrn.optimizer.step = step
    try:
        return lrn.train_step(batch), grads
    finally:
        lrn.optimizer.step = inner
