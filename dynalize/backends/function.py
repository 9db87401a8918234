"""A RewardModel on a plain Python function: `f(list[str]) -> list[float]` over the replies' text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import RewardModel, RMInput


class FunctionRewardModel(RewardModel):
    """Scores each item with `fn`: a raw text as it is, a conversation by its last message (the reply)."""

    def __init__(self, fn: Callable[[list[str]], Any]):
        self.fn = fn

    async def score(self, items: list[RMInput]) -> list[float]:
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        return [float(s) for s in self.fn(texts)]
