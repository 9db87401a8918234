"""A RewardModel on a plain Python function over the replies' text: `f(replies) -> scores`, or
`f(replies, prompts) -> scores` for a function that reads each reply's `Prompt` (e.g. its answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..types import Prompt
from .base import RewardModel, RMInput


class FunctionRewardModel(RewardModel):
    """Scores each item with `fn`: a raw text as it is, a conversation by its last message (the
    reply). With `pass_prompts`, `fn` also gets `prompts=`, one Prompt per reply."""

    def __init__(self, fn: Callable[..., Any], pass_prompts: bool = False):
        self.fn = fn
        self.pass_prompts = pass_prompts

    async def score(self, items: list[RMInput], prompts: list[Prompt] | None = None) -> list[float]:
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        scores = self.fn(texts, prompts=prompts) if self.pass_prompts else self.fn(texts)
        return [float(s) for s in scores]
