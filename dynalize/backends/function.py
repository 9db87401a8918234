"""A RewardModel on a plain Python function over the replies' text: `f(replies) -> scores`, or
`f(replies, prompts) -> scores` for a function that reads each reply's `Prompt` (e.g. its answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .scorecheck import checked_scores
from ..types import Prompt
from .base import RewardModel, RMInput


class FunctionRewardModel(RewardModel):
    """Scores each item with `fn`: a raw text as it is, a conversation by its last message (the
    reply). With `pass_prompts`, `fn` also gets `prompts=`, one Prompt per reply.

    `fn` must return one finite number per text; anything else stops the run with one line
    naming the function (`name`).
    """

    def __init__(self, fn: Callable[..., Any], name: str = "reward function", pass_prompts: bool = False):
        self.fn = fn
        self.name = name
        self.pass_prompts = pass_prompts

    async def score(self, items: list[RMInput], prompts: list[Prompt] | None = None) -> list[float]:
        texts = [x if isinstance(x, str) else x[-1].content for x in items]
        raw = self.fn(texts, prompts=prompts) if self.pass_prompts else self.fn(texts)
        return checked_scores(raw, len(texts), f"reward function {self.name!r}", allow_none=False, items="texts")
