"""The rubric world's checks: what a judge looks for in a reply about a topic.

A check is data, `{"kind": ..., **params}`, so rubric and proxy-flaw lists are plain YAML.
Substance checks read what a reply says (`names_topic`, `mentions`, `distinct_nouns`,
`adjectives`, `topic_question`, `finished`, `repeats`, `drifts`); cue checks read surface
signals a weak judge might take for substance (`min_words`, `max_words`, `ends_with`,
`words_any`, `starts_with_any`, `never`); `all`, `any` and `not` combine checks.

Words in params may name the prompt's topic: `{topic}` (its name without article) and
`{noun1}`..`{noun3}` (its nouns). The language (topics, their nouns, ordinary adjectives) is the
sandbox's grammar, which the world shares with the sandbox's pre-trained policy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ..sandbox.grammar import ADJECTIVES, GRAMMAR_WORDS, words_of
from ..sandbox.topics import ALL_TOPICS, Topic, find_topic

_SENTENCE = re.compile(r"[^.?!]+[.?!]*")
REPEATED_TRIGRAMS = 3
"""`repeats`: this many repeated word trigrams count as repetition (as does a repeated sentence)."""


def sentences(reply: str) -> list[str]:
    """The reply's sentences with their end punctuation (a trailing fragment counts)."""
    return [s.strip() for s in _SENTENCE.findall(reply) if re.search(r"[A-Za-z]", s)]


def complete(sentence: str) -> bool:
    """Starts with a capital and ends with one of . ? ! (not cut off, not doubled)."""
    return bool(sentence[:1].isupper() and sentence[-1:] in ".?!" and sentence[-2:-1] not in (".", "?", "!"))


def complete_words(reply: str) -> list[str]:
    """Words of the reply's complete sentences."""
    return [w for s in sentences(reply) if complete(s) for w in words_of(s)]


@lru_cache(maxsize=256)
def foreign_words(topic: Topic) -> frozenset[str]:
    """Words that belong to other topics only: saying them drifts off this topic."""
    other = {w for t in ALL_TOPICS if t != topic for w in t.words}
    return frozenset(other - topic.words - GRAMMAR_WORDS)


def fill(word: str, topic: Topic, *, name: bool = False) -> str:
    """`word` with `{topic}` (the topic without its article, or its full `name`) and `{noun1..3}`
    replaced by the topic's own."""
    slots = {"topic": topic.name if name else topic.core, **{f"noun{i + 1}": n for i, n in enumerate(topic.nouns)}}
    return word.format(**slots) if "{" in word else word


def _has_phrase(words: list[str], phrase: str) -> bool:
    target = words_of(phrase)
    n = len(target)
    return n > 0 and any(words[i:i + n] == target for i in range(len(words) - n + 1))


def _repeats(reply: str) -> bool:
    sents = [" ".join(words_of(s)) for s in sentences(reply)]
    if len(set(sents)) < len(sents):
        return True
    words = words_of(reply)
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(grams) - len(set(grams)) >= REPEATED_TRIGRAMS


def _words(params: Mapping[str, Any], topic: Topic) -> list[str]:
    return [fill(str(w), topic) for w in params.get("words", [])]


CHECKS: dict[str, Callable[[str, Topic, Mapping[str, Any]], bool]] = {
    # substance
    "names_topic": lambda r, t, p: _has_phrase(complete_words(r), t.core),
    "mentions": lambda r, t, p: (any if p.get("any") else all)(
        _has_phrase(complete_words(r), w) for w in _words(p, t)),
    "distinct_nouns": lambda r, t, p: len(set(complete_words(r)) & set(t.nouns)) >= int(p.get("n", 3)),
    "adjectives": lambda r, t, p: len(set(complete_words(r)) & set(ADJECTIVES)) >= int(p.get("n", 2)),
    "topic_question": lambda r, t, p: bool(sentences(r)) and complete(sentences(r)[-1])
    and sentences(r)[-1].endswith("?") and bool(set(words_of(sentences(r)[-1])) & t.words),
    "finished": lambda r, t, p: r.rstrip()[-1:] in (".", "?", "!"),
    "repeats": lambda r, t, p: _repeats(r),
    "drifts": lambda r, t, p: bool(set(words_of(r)) & foreign_words(t)),
    # cues
    "min_words": lambda r, t, p: len(words_of(r)) >= int(p["n"]),
    "max_words": lambda r, t, p: len(words_of(r)) <= int(p["n"]),
    "ends_with": lambda r, t, p: r.rstrip()[-1:] in str(p.get("chars", "")) and bool(r.strip()),
    "words_any": lambda r, t, p: bool(set(words_of(r)) & {w.lower() for w in _words(p, t)}),
    "starts_with_any": lambda r, t, p: any(r.lstrip().lower().startswith(w.lower()) for w in _words(p, t)),
    "never": lambda r, t, p: False,
}
"""Check kinds by name; `all`, `any` and `not` are handled by `check`."""


def check(spec: Mapping[str, Any], reply: str, topic: Topic) -> bool:
    """Whether `reply` (to "Write about <topic>.") passes the check `spec`."""
    kind = spec.get("kind")
    if kind in ("all", "any"):
        parts = [check(s, reply, topic) for s in spec.get("of", [])]
        return all(parts) if kind == "all" else any(parts)
    if kind == "not":
        return not check(spec["of"], reply, topic)
    if kind not in CHECKS:
        raise ValueError(f"unknown check kind {kind!r}: use one of {', '.join(sorted([*CHECKS, 'all', 'any', 'not']))}")
    return CHECKS[kind](reply, topic, spec)


def validate(spec: Mapping[str, Any]) -> None:
    """Raise ValueError when `spec` names an unknown kind or lacks a required param."""
    kind = spec.get("kind")
    if kind in ("all", "any"):
        if not isinstance(spec.get("of"), list) or not spec["of"]:
            raise ValueError(f"check {kind!r} needs `of`: a non-empty list of checks")
        for s in spec["of"]:
            validate(s)
        return
    if kind == "not":
        if not isinstance(spec.get("of"), Mapping):
            raise ValueError("check 'not' needs `of`: one check")
        validate(spec["of"])
        return
    if kind not in CHECKS:
        raise ValueError(f"unknown check kind {kind!r}: use one of {', '.join(sorted([*CHECKS, 'all', 'any', 'not']))}")
    if kind in ("min_words", "max_words") and not isinstance(spec.get("n"), int):
        raise ValueError(f"check {kind!r} needs an integer `n`")
    if kind in ("mentions", "words_any", "starts_with_any") and not spec.get("words"):
        raise ValueError(f"check {kind!r} needs `words`")


def topic_named(name: str) -> Topic:
    """The world's topic called `name` (ValueError for an unknown one)."""
    topic = find_topic(name)
    if topic is None:
        raise ValueError(f"unknown topic {name!r}")
    return topic
