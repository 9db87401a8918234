"""Gold quality, the sandbox's benchmark: how good a reply about a topic really is.

gold = topic × form × relevance² × variety × length × clean_end, each part in [0, 1]:

- topic: names the topic (0.4) and uses its own nouns (0.6, full at 3 distinct nouns), counted
  in well-formed sentences only;
- form: the share of sentences that are well-formed (capitalised, 4–20 proper words, end in '.');
- relevance: the share of words that belong to the language or to this topic; words from other
  topics and quirk words (openers, marker adjectives, question words) lower it;
- variety: distinct word trigrams over all trigrams of the proper words (repetition lowers it);
- length: proper words in well-formed sentences, full inside [12, 45], less outside;
- clean_end: 0.5 when the reply stops mid-sentence.

Quirks never add proper words to well-formed sentences, so they can only lower gold.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .grammar import GRAMMAR_WORDS, words_of
from .topics import Topic, find_topic

LENGTH_BAND = (12, 45)
"""Proper words (in well-formed sentences) for full length credit."""
SENTENCE_WORDS = (4, 20)
"""Proper words a well-formed sentence has."""
_SENTENCE = re.compile(r"[^.?!]+[.?!]*")


def sentences_of(reply: str) -> list[str]:
    """Sentences with their end punctuation; a trailing fragment counts as a sentence."""
    return [s.strip() for s in _SENTENCE.findall(reply) if re.search(r"[A-Za-z]", s)]


@lru_cache(maxsize=512)
def _proper_words(topic: Topic | None) -> frozenset[str]:
    return GRAMMAR_WORDS | (topic.words if topic else frozenset())


def _well_formed(sentence: str, proper: frozenset[str]) -> bool:
    n = sum(w in proper for w in words_of(sentence))
    return (sentence[:1].isupper() and sentence.endswith(".") and not sentence.endswith("..")
            and SENTENCE_WORDS[0] <= n <= SENTENCE_WORDS[1])


def _trigram_variety(words: list[str]) -> float:
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def _length_factor(n: int) -> float:
    lo, hi = LENGTH_BAND
    if n < lo:
        return n / lo
    return max(0.0, 1.0 - (n - hi) / hi) if n > hi else 1.0


def gold_parts(topic: str | Topic | None, reply: str) -> dict[str, float]:
    """The parts of the gold score (see the module docstring) and `gold`, their product."""
    t = find_topic(topic) if isinstance(topic, str) else topic
    proper = _proper_words(t)
    sents = sentences_of(reply)
    words = words_of(reply)
    if not sents or not words:
        return dict(topic=0.0, form=0.0, relevance=0.0, variety=0.0, length=0.0, clean_end=0.0, gold=0.0)
    good = [s for s in sents if _well_formed(s, proper)]
    good_words = [w for s in good for w in words_of(s) if w in proper]
    good_text = " " + " ".join(good_words) + " "
    named = 0.4 if t and f" {t.core} " in good_text else 0.0
    nouns = len(set(good_words) & set(t.nouns)) if t else 0
    proper_words = [w for w in words if w in proper]
    parts = dict(
        topic=named + 0.6 * min(1.0, nouns / 3),
        form=len(good) / len(sents),
        relevance=len(proper_words) / len(words),
        variety=_trigram_variety(proper_words),
        length=_length_factor(len(good_words)),
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
