"""The rubric world's two judges, as Python predicates for `rubric.judge.predicate` and
`rubric.gold_judge.predicate` (engine `local`).

Each criterion of a world prompt carries, in its `data`, its topic, the gold check and the
proxy's check (the gold one unless a flaw replaces it). The gold judge applies the substance
check; the proxy judge applies the cue. Neither reads anything else.
"""

from __future__ import annotations

from typing import Any

from .checks import check, topic_named


def gold_verdict(reply: str, criterion: Any, context: str | None = None) -> bool:
    """Whether `reply` really meets `criterion` (or really shows the pitfall)."""
    data = criterion.data
    return check(data["gold"], reply, topic_named(data["topic"]))


def proxy_verdict(reply: str, criterion: Any, context: str | None = None) -> bool:
    """What the exploitable proxy judge says: its flawed check where it has one, else the gold check."""
    data = criterion.data
    return check(data.get("proxy") or data["gold"], reply, topic_named(data["topic"]))
