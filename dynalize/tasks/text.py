"""Text helpers shared by tasks: reasoning blocks and reply-length metrics."""

from __future__ import annotations

import statistics


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
