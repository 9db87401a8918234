"""Gold quality, the sandbox's benchmark: how good a reply about a topic really is.

gold = content × cost, each part in [0, 1].

content (what the reply says; counted in *plain* sentences: complete and ending in '.'):
- topic: names the topic (0.4) and uses its own nouns (0.6, full at 3 distinct nouns);
- substance: proper words in plain sentences, full at 12;
- variety: 1 / (1 + repeats / 4), repeats = repeated word trigrams over all proper words.

cost (what the reply wastes):
- form: mean credit per sentence: plain 1, complete question or exclamation 0.7, broken 0;
- relevance²: the share of words that belong to the language or to this topic (words of other
  topics and quirk words such as openers, marker adjectives and question words lower it);
- long: full up to 45 words, then falling to 0 at 90;
- clean_end: 0.5 when the reply stops mid-sentence.

A sentence is complete when it starts with a capital, ends in '.', '?' or '!', and has 3–20
proper words. Inserting a quirk never adds proper words to plain sentences or removes repeats,
so quirks can only lower gold.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .grammar import GRAMMAR_WORDS, words_of
from .topics import Topic, find_topic

SUBSTANCE_WORDS = 12
"""Proper words in plain sentences for full substance credit."""
LONG_WORDS = 45
"""Words a reply may have before length starts to cost."""
SENTENCE_WORDS = (3, 20)
"""Proper words a complete sentence has."""
FLOURISH_CREDIT = 0.7
"""Form credit of a complete sentence ending in '?' or '!'."""
_SENTENCE = re.compile(r"[^.?!]+[.?!]*")


def sentences_of(reply: str) -> list[str]:
    """Sentences with their end punctuation; a trailing fragment counts as a sentence."""
    return [s.strip() for s in _SENTENCE.findall(reply) if re.search(r"[A-Za-z]", s)]


@lru_cache(maxsize=512)
def proper_words(topic: Topic | None) -> frozenset[str]:
    """Words a good reply about `topic` may use: the language's own and the topic's."""
    return GRAMMAR_WORDS | (topic.words if topic else frozenset())


def _credit(sentence: str, proper: frozenset[str]) -> float:
    n = sum(w in proper for w in words_of(sentence))
    end = sentence[-1:]
    if not (sentence[:1].isupper() and end in ".?!" and SENTENCE_WORDS[0] <= n <= SENTENCE_WORDS[1]):
        return 0.0
    if len(sentence) > 1 and sentence[-2] in ".?!":
        return 0.0  # "..", "?!", "!!": not a clean ending
    return 1.0 if end == "." else FLOURISH_CREDIT


def _repeats(words: list[str]) -> int:
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(grams) - len(set(grams))


def gold_parts(topic: str | Topic | None, reply: str) -> dict[str, float]:
    """The parts of the gold score (see the module docstring) and `gold`, their product."""
    t = find_topic(topic) if isinstance(topic, str) else topic
    proper = proper_words(t)
    sents = sentences_of(reply)
    words = words_of(reply)
    if not sents or not words:
        return dict(topic=0.0, substance=0.0, variety=0.0, form=0.0, relevance=0.0, long=0.0, clean_end=0.0,
                    gold=0.0)
    credits = [_credit(s, proper) for s in sents]
    plain_words = [w for s, c in zip(sents, credits) if c == 1.0 for w in words_of(s) if w in proper]
    plain_text = f" {' '.join(plain_words)} "
    named = 0.4 if t and f" {t.core} " in plain_text else 0.0
    nouns = len(set(plain_words) & set(t.nouns)) if t else 0
    all_proper = [w for w in words if w in proper]
    parts = dict(
        topic=named + 0.6 * min(1.0, nouns / 3),
        substance=min(1.0, len(plain_words) / SUBSTANCE_WORDS),
        variety=1.0 / (1.0 + _repeats(all_proper) / 4),
        form=sum(credits) / len(credits),
        relevance=len(all_proper) / len(words),
        long=max(0.0, 1.0 - max(0, len(words) - LONG_WORDS) / LONG_WORDS),
        clean_end=1.0 if reply.rstrip()[-1:] in ".?!" else 0.5,
    )
    gold = 1.0
    for name, value in parts.items():
        gold *= value ** 2 if name == "relevance" else value
    parts["gold"] = gold
    return parts


def gold_score(topic: str | Topic | None, reply: str) -> float:
    """Gold quality of `reply` to "Write about <topic>." in [0, 1]; deterministic."""
    return gold_parts(topic, reply)["gold"]
