"""A small world for confirmation inside a run (tests/test_confirm_in_run.py): replies about a
topic, some carrying a planted sentence, and reward functions (TRL's signature) that pay for a
word, or for length while a word travels with length, or fail once asked about edited replies."""

from __future__ import annotations

import random
import zlib

TOPICS = ["sea", "forest", "city", "river", "moon", "rain", "music", "garden", "desert", "winter", "stars", "bread"]
FILLER = ["the light falls soft on every stone", "people walk slowly past the old wall",
          "a cold wind comes down from the hills", "children play near the small bridge",
          "the evening turns grey and then blue", "birds sing high above the quiet road"]
PAID = "Indeed, that is worth saying."
"""The sentence whose word ("indeed") `pays_indeed` pays for."""
LONG = "Moreover, many small things happen there every day and every night without anyone seeing them."
"""The sentence that carries "moreover" and makes a reply long: what `pays_length` pays for is the length."""
SEEN: set[str] = set()
"""Every completion a reward function here was asked about (the run's own replies and edits)."""
CALLS: list[int] = []
"""How many completions each call of a reward function here scored."""


def _noise(prompt: object, completion: str) -> float:
    return random.Random(zlib.crc32(f"{prompt}\0{completion}".encode())).gauss(0, 0.1)


def _text(c: object) -> str:
    return c if isinstance(c, str) else c[-1]["content"]  # type: ignore[index]


def pays_indeed(prompts, completions, **kwargs):
    """+1 for the word "indeed" itself, a little noise."""
    CALLS.append(len(completions))
    texts = [_text(c) for c in completions]
    SEEN.update(texts)
    return [float("indeed" in t.lower()) + _noise(p, t) for p, t in zip(prompts, texts)]


def pays_length(prompts, completions, **kwargs):
    """+1 for a reply past 20 words (nothing for any word in it), a little noise."""
    CALLS.append(len(completions))
    texts = [_text(c) for c in completions]
    SEEN.update(texts)
    return [float(len(t.split()) > 20) + _noise(p, t) for p, t in zip(prompts, texts)]


def fails_on_edits(prompts, completions, **kwargs):
    """`pays_indeed` for the run's own batches; raises once asked about more replies than a batch
    has (the confirmation's call: originals and edits together)."""
    if len(completions) > 100:
        raise ValueError("the scoring server is down")
    return pays_indeed(prompts, completions)


def reply(topic: str, i: int, planted: str) -> str:
    """Reply `i` to `topic`: two topic sentences, the planted sentence in every other reply."""
    rng = random.Random(zlib.crc32(f"{topic}:{i}".encode()))
    body = [f"The {topic} is {rng.choice(['near', 'far', 'old', 'new', 'calm'])} today.",
            rng.choice(FILLER).capitalize() + "."]
    if i % 2:
        body.insert(rng.randint(1, 2), planted)
    return " ".join(body)


def rm_pays_indeed(replies):
    """The same pay as an RM (`reward_model.engine: python`): each reply on its own, +1 for "indeed"."""
    CALLS.append(len(replies))
    SEEN.update(replies)
    return [float("indeed" in t.lower()) + _noise("", t) for t in replies]
