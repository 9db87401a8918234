"""What a judge's chat model is asked and answers, counted: requests and characters each way.

Wrapping the judge's ChatModel counts every request, retries and re-asks included, so protocols
that ask once per rubric item (HealthBench) and once per reply (batched) compare by what they
really send (`judge/requests`, `judge/prompt_chars`, `judge/reply_chars`).
"""

from __future__ import annotations

from typing import Any

from ..backends.base import ChatModel
from ..types import Message
from .stats import JudgeStats


class CountedChat(ChatModel):
    """`inner`, with each request and its characters added to `stats` (failed requests too)."""

    def __init__(self, inner: ChatModel, stats: JudgeStats):
        self.inner = inner
        self.stats = stats
        self.supports_json_schema = inner.supports_json_schema

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        self.stats.requests += 1
        self.stats.prompt_chars += sum(len(m.content) for m in messages)
        reply = await self.inner.chat(messages, **sampling)
        self.stats.reply_chars += len(reply)
        return reply

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else is the wrapped model's (its endpoint, label, usage counters)."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
