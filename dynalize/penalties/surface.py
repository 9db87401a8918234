"""Surface patterns of replies, as the lexical proposer counts them and the regex judge matches them.

A pattern (`Feature`) is a word n-gram, an opener, a closer, or "longer than L words", with a
readable title and a regex (or a named detector, kind `detector`, which has no regex). Words, tokens and the patterns' regexes use the judge's engine
(`regex`), so the evidence counted here and the judge's verdicts agree on every character
(`regex`'s word characters include combining marks; its white space leaves out U+001C..U+001F,
which `re` and `str.split` count). A multi-turn rollout shows a pattern when any of its replies
does, as the judge reads it (each reply on its own; a penalty counts once per rollout).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import regex

WORD = regex.compile(r"\w+(?:'\w+)*")
TOKEN = regex.compile(r"\S+")
"""Whitespace-separated tokens, as the length pattern `(?:\\S+\\s+){L}` counts them."""
# Word edges as WORD sees them: "s" is no word of "it's", so a penalty on "s" must not match there.
WORD_START = r"(?<!\w)(?<!\w')"
WORD_END = r"(?!\w)(?!'\w)"
STOP_WORDS = frozenset("""
a an the and or but if then so of to in on at by for with from as is are was were be been being am
it its this that these those there here i you he she we they me him her us them my your his our their
do does did not no yes can could will would should may might must have has had just very also than
""".split())

# Tie-break rank: openers and closers first (the shorter opener: a tic is usually its first word),
# then longer n-grams (the same evidence, said more precisely).
# Length comes last: on equal evidence a specific wording is the better (less blunt) penalty.
KIND_RANK = {"open1": 0, "open2": 1, "close?": 2, "closep": 2, "closeword": 3, "ngram3": 4, "ngram2": 5,
             "ngram1": 6, "detector": 7, "length": 8}


@dataclass(frozen=True)
class Feature:
    """A surface pattern: what it is (`kind`, `key`), how to show it, and how to match it."""

    kind: str
    key: str
    shown: str
    regex: str

    @property
    def title(self) -> str:
        if self.kind == "detector":  # a named detector (penalties.detectors): `shown` is its title
            return self.shown
        if self.kind.startswith("open"):
            return f'Replies open with "{self.shown}"'
        if self.kind == "close?":
            return "Replies end with a question"
        if self.kind == "closep":
            return f'Replies end with "{self.shown}"'
        if self.kind == "closeword":
            return f'Replies end with the word "{self.shown}"'
        if self.kind == "length":
            return f"Replies run longer than {self.shown} words"
        noun = "word" if self.kind == "ngram1" else "phrase"
        return f'Replies use the {noun} "{self.shown}"'


_TRAILING = regex.compile(r"[\s\"')\]*_]+\Z")
"""What may follow a reply's last mark: space, closing quotes and brackets, markdown emphasis."""


@lru_cache(maxsize=1 << 18)
def ngram_feature(gram: tuple[str, ...]) -> Feature:
    """The pattern of a lower-cased word n-gram (built once per n-gram: a batch repeats them)."""
    body = r"\W+".join(regex.escape(w) for w in gram)
    return Feature(f"ngram{len(gram)}", " ".join(gram), " ".join(gram), rf"(?i){WORD_START}{body}{WORD_END}")


def reply_features(text: str) -> dict[str, Feature]:
    """The features present in `text`, by kind:key."""
    feats: list[Feature] = []
    words = [w.lower() for w in WORD.findall(text)]
    for n in (1, 2, 3):
        for i in range(len(words) - n + 1):
            gram = tuple(words[i:i + n])
            if not all(w in STOP_WORDS for w in gram):
                feats.append(ngram_feature(gram))
    tokens = TOKEN.findall(text)
    for n in (1, 2):
        if len(tokens) >= n:
            head = tokens[:n]
            body = r"\s+".join(regex.escape(t) for t in head) + (WORD_END if regex.search(r"\w$", head[-1]) else "")
            feats.append(Feature(f"open{n}", " ".join(head).lower(), " ".join(head), rf"(?i)\A\s*{body}"))
    end = _TRAILING.sub("", text)
    if end.endswith("?"):
        feats.append(Feature("close?", "?", "?", r"\?[\s\"')\]*_]*\Z"))
    else:  # other closing punctuation ("!", "...", "?!"); a lone "." is the ordinary end of a reply
        punct = regex.search(r"[^\w\s\"')\]*_]+\Z", end)
        if punct and punct.group() != ".":
            mark = punct.group()
            feats.append(Feature("closep", mark, mark, regex.escape(mark) + r"[\s\"')\]*_]*\Z"))
    if words:
        last = words[-1]
        feats.append(Feature("closeword", last, last, rf"(?i){WORD_START}{regex.escape(last)}\W*\Z"))
    return {f"{f.kind}:{f.key}": f for f in feats}


def rollout_features(replies: list[str]) -> dict[str, Feature]:
    """The features any of a rollout's replies shows (each reply read on its own, as the judge does)."""
    out: dict[str, Feature] = {}
    for reply in replies:
        for k, f in reply_features(reply).items():
            out.setdefault(k, f)
    return out


def length_feature(words: int) -> Feature:
    """The pattern "longer than `words` words": at least `words` + 1 whitespace-separated tokens."""
    return Feature("length", f">{words}", str(words), rf"\A\s*(?:\S+\s+){{{words}}}\S")


_LENGTH_REGEX = regex.compile(r"\\A\\s\*\(\?:\\S\+\\s\+\)\{(\d+)\}\\S")


def length_limit(pattern: str | None) -> int | None:
    """L if `pattern` is a length pattern made by `length_feature(L)`, else None."""
    m = _LENGTH_REGEX.fullmatch(pattern or "")
    return int(m.group(1)) if m else None


def word_count(text: str) -> int:
    """Whitespace-separated tokens, as the length regex counts them."""
    return len(TOKEN.findall(text))


def longest_reply(replies: list[str]) -> int:
    """The word count of a rollout's longest reply: it is longer than L words when any reply is."""
    return max((word_count(r) for r in replies), default=0)
