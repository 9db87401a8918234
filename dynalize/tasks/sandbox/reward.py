"""The sandbox's flawed reward model: gold quality plus pay for spurious features.

score = gold_weight · gold + Σ_f weight_f · log2(1 + count_f) + noise

The feature pay is worth more than small gold gains (0.2–0.35 per feature against a gold range of
[0, 1]), and keeps growing a little as a feature is repeated, which gold punishes: under RM-only
optimisation the RM score keeps rising while gold peaks and then falls. `noise` is a fixed
pseudo-random offset per reply text (a stand-in for a learned RM's errors; nothing to exploit).
"""

from __future__ import annotations

import hashlib
import math
import re

from ...backends.base import RewardModel, RMInput
from ...types import Message, as_messages
from .features import Feature, default_features
from .gold import gold_parts, gold_score
from .topics import ALL_TOPICS, Topic, find_topic

_ASK = re.compile(r"write about (.+?)\.?\s*$", re.IGNORECASE)


def topic_of(messages: list[Message]) -> Topic | None:
    """The topic a conversation asks about: from its last "Write about <topic>." user message."""
    for m in reversed(messages):
        if m.role == "user":
            found = _ASK.search(m.content.strip())
            return find_topic(found.group(1)) if found else None
    return None


def guess_topic(reply: str) -> Topic | None:
    """For a bare reply: the topic it serves best (highest topic part of gold), None if none fits."""
    best, best_score = None, 0.0
    for t in ALL_TOPICS:
        s = gold_parts(t, reply)["topic"]
        if s > best_score:
            best, best_score = t, s
    return best


def feature_bonus(reply: str, features: list[Feature]) -> float:
    """What the flawed RM pays for the features `reply` shows."""
    return sum(f.weight * math.log2(1.0 + f.count(reply)) for f in features)


def _noise(text: str, scale: float) -> float:
    if not scale:
        return 0.0
    u = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    return scale * (2.0 * u - 1.0)


class SandboxRewardModel(RewardModel):
    """A deterministic Python RM: tracks gold, but also pays for `features`."""

    def __init__(self, features: list[Feature] | None = None, gold_weight: float = 1.0, noise: float = 0.05):
        self.features = default_features() if features is None else list(features)
        self.gold_weight = gold_weight
        self.noise = noise

    def score_one(self, topic: Topic | str | None, reply: str) -> float:
        """The RM score of `reply` to "Write about <topic>."."""
        return (self.gold_weight * gold_score(topic, reply) + feature_bonus(reply, self.features)
                + _noise(reply, self.noise))

    def score_item(self, item: RMInput) -> float:
        """Score one RM input: a conversation ending in the reply, or a bare reply."""
        if isinstance(item, str):
            return self.score_one(guess_topic(item), item)
        messages = as_messages(item)
        if not messages or messages[-1].role != "assistant":
            raise ValueError("an RM conversation must end with the assistant's reply")
        return self.score_one(topic_of(messages[:-1]), messages[-1].content)

    async def score(self, items: list[RMInput]) -> list[float]:
        return [self.score_item(item) for item in items]
