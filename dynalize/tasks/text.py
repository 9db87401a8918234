"""Text helpers shared by tasks: prompt templates, reasoning blocks and reply-length metrics."""

from __future__ import annotations

import statistics
from typing import ClassVar

from pydantic import field_validator

from ..types import Message
from .data import DataArgs


class TemplatedArgs(DataArgs):
    """Settings of a task whose rows hold a prompt's text: the column, and how it becomes the
    user message (as written by default: no hidden instruction is added to a user's rows)."""

    frozen_defaults: ClassVar[tuple[str, ...]] = ("template",)
    """Written into a run's config.yaml at its first start (dynalize.resume.freeze_derived), so a
    later change of the default never changes a saved run."""

    prompt_field: str = "prompt"
    """The column holding the prompt."""
    template: str = "{prompt}"
    """The user message; `{prompt}` is replaced by the row's prompt (default: as written)."""
    system_prompt: str | None = None
    """A system message before the user message (None = none)."""

    @field_validator("template")
    @classmethod
    def _has_slot(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError("template must contain {prompt}")
        return v

    def messages(self, text: str) -> list[Message]:
        """The conversation of a prompt's text: the optional system message, then `template` filled in."""
        system = [Message("system", self.system_prompt)] if self.system_prompt else []
        return [*system, Message("user", self.template.replace("{prompt}", text))]


def split_reasoning_tags(text: str, tags: tuple[str, str] | None) -> tuple[str, str]:
    """(reasoning, final reply) of a model's text, for a reasoning block between `tags`.

    `a<think>r</think>b` → ("r", "ab"); an unclosed `<think>r` → ("r", text before it); a lone
    closing tag (`r</think>b`, the chat template opened the block) → ("r", "b"); no tags → ("", text).
    """
    if not tags:
        return "", text
    open_, close = tags
    i, j = text.find(open_), text.find(close)
    if j >= 0 and (i < 0 or j < i):  # closing tag only: everything before it is reasoning
        return text[:j].strip(), text[j + len(close):].strip()
    if i < 0:
        return "", text
    j = text.find(close, i + len(open_))
    if j < 0:  # never closed: all of it is reasoning
        return text[i + len(open_):].strip(), text[:i].strip()
    return text[i + len(open_):j].strip(), (text[:i] + text[j + len(close):]).strip()


def length_metrics(replies: list[str]) -> dict[str, float]:
    """Mean reply length in words and the share of empty replies (e.g. all reasoning)."""
    if not replies:
        return {}
    return {"words": statistics.fmean(len(r.split()) for r in replies),
            "empty_frac": statistics.fmean(not r.strip() for r in replies)}
