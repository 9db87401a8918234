"""Haiku: a new domain for dynalize, written outside the package (see docs/add_a_domain.md)."""

import re
import statistics
from itertools import zip_longest

from pydantic import Field

from dynalize.tasks.base import Split, Task, TaskArgs
from dynalize.types import Message, Prompt

TOPICS = ["the sea", "a winter morning", "an old bridge", "rain on a roof", "the moon", "a garden",
          "city lights", "a cat asleep", "autumn leaves", "the first snow", "a train at night", "bread"]


class HaikuArgs(TaskArgs):
    """Settings of the haiku task: the `task.args` block of the YAML."""

    topics: list[str] = Field(default_factory=lambda: list(TOPICS))
    """Subjects to write about; the last `n_eval` of them are held out."""
    n_eval: int = Field(2, ge=1)
    """How many topics to hold out for evaluation."""


class HaikuTask(Task):
    """Write a haiku about a topic."""

    Args = HaikuArgs
    description = "Poetry: the user names a subject and the assistant writes a haiku about it."

    def prompts(self, split: Split) -> list[Prompt]:
        cut = len(self.args.topics) - self.args.n_eval
        topics = self.args.topics[:cut] if split == "train" else self.args.topics[cut:]
        return [Prompt(f"haiku-{i}", [Message("user", f"Write a haiku about {t}.")]) for i, t in enumerate(topics)]

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        return {"form": statistics.fmean(haiku_form(r) for r in replies)}


def syllables(word: str) -> int:
    """A rough English syllable count: runs of vowels, less a silent final e."""
    word = word.lower()
    n = len(re.findall(r"[aeiouy]+", word))
    if n > 1 and word.endswith("e") and not word.endswith(("le", "ee")):
        n -= 1
    return max(n, 1)


def haiku_form(text: str) -> float:
    """1 for three lines of 5, 7 and 5 syllables; less the further the text is from that."""
    lines = [line for line in text.splitlines() if line.strip()]
    counts = [sum(syllables(w) for w in re.findall(r"[A-Za-z']+", line)) for line in lines]
    miss = sum(abs(c - t) for c, t in zip_longest(counts, [5, 7, 5], fillvalue=0))
    return max(0.0, 1.0 - miss / 17)


def haiku_reward(replies: list[str]) -> list[float]:
    """The reward function the YAML names: one score per reply."""
    return [haiku_form(r) for r in replies]
