"""Surface patterns of replies, as the lexical proposer counts them and the regex judge matches them.

A pattern (`Feature`) is a word n-gram, an opener, a closer, or "longer than L words", with a
readable title and a regex (or a named detector, kind `detector`, which has no regex). Words, tokens and the patterns' regexes use the judge's engine
(`regex`), so the evidence counted here and the judge's verdicts agree on every character
(`regex`'s word characters include combining marks; its white space leaves out U+001C..U+001F,
which `re` and `str.split` count). A multi-turn rollout shows a pattern when any of its replies
does, as the judge reads it (each reply on its own; a penalty counts once per rollout).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import regex

if TYPE_CHECKING:
    from .views import ViewSample

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
             "ngram1": 6, "family": 7, "form": 7, "detector": 7, "length": 8}


@dataclass(frozen=True)
class Feature:
    """A surface pattern: what it is (`kind`, `key`), how to show it, and how to match it."""

    kind: str
    key: str
    shown: str
    regex: str

    @property
    def title(self) -> str:
        if self.kind in ("detector", "form", "family"):  # a named detector, form or family: `shown` is its title
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


NGRAM_CACHE = 1 << 16
"""N-gram patterns kept between proposals: about two proposals' testable n-grams at 64 x 16 x 5
replies (some 30,000 each), about 50 MB. A cache as large as 2^18 held 200 MB once full, which a
long run's monitor filled: its peak memory grew with the run's length (benchmarks/monitor_scale.py)."""


@lru_cache(maxsize=NGRAM_CACHE)
def ngram_feature(gram: tuple[str, ...]) -> Feature:
    """The pattern of a lower-cased word n-gram (built once per n-gram: a batch repeats them)."""
    body = r"\W+".join(regex.escape(w) for w in gram)
    return Feature(f"ngram{len(gram)}", " ".join(gram), " ".join(gram), rf"(?i){WORD_START}{body}{WORD_END}")


Spec = tuple
"""How to build one feature of a reply (`feature_of`): its kind and what its regex is made from
(`NGRAM` for a word n-gram: its words are its key's). Kept per reply instead of the Feature itself,
which is built once per view, for the keys tested only."""

NGRAM: Spec = ("ngram",)


def reply_specs(text: str) -> dict[str, Spec]:
    """The features present in `text`, by kind:key, as specs (`feature_of` builds each): word
    n-grams (1 to 3 words, not all stop words), the openers (first one and two tokens), a closing
    question mark or other closing punctuation, and the last word."""
    specs: dict[str, Spec] = {}
    words = [w.lower() for w in WORD.findall(text)]
    content = [w not in STOP_WORDS for w in words]
    for i, w in enumerate(words):
        if content[i]:
            specs["ngram1:" + w] = NGRAM
    pairs = [a + " " + b for a, b in zip(words, words[1:])]
    for i, pair in enumerate(pairs):
        if content[i] or content[i + 1]:
            specs["ngram2:" + pair] = NGRAM
    for i in range(len(words) - 2):
        if content[i] or content[i + 1] or content[i + 2]:
            specs["ngram3:" + pairs[i] + " " + words[i + 2]] = NGRAM
    tokens = TOKEN.findall(text)
    for n in (1, 2):
        if len(tokens) >= n:
            head = tuple(tokens[:n])
            specs[f"open{n}:{' '.join(head).lower()}"] = (f"open{n}", head)
    end = _TRAILING.sub("", text)
    if end.endswith("?"):
        specs["close?:?"] = ("close?",)
    else:  # other closing punctuation ("!", "...", "?!"); a lone "." is the ordinary end of a reply
        punct = regex.search(r"[^\w\s\"')\]*_]+\Z", end)
        if punct and punct.group() != ".":
            specs[f"closep:{punct.group()}"] = ("closep", punct.group())
    if words:
        specs[f"closeword:{words[-1]}"] = ("closeword", words[-1])
    return specs


def feature_of(key: str, spec: Spec) -> Feature:
    """The feature of `key` that a spec of `reply_specs` describes."""
    kind = spec[0]
    if spec is NGRAM:
        return ngram_feature(tuple(key.partition(":")[2].split(" ")))
    if kind.startswith("open"):
        head = spec[1]
        body = r"\s+".join(regex.escape(t) for t in head) + (WORD_END if regex.search(r"\w$", head[-1]) else "")
        return Feature(kind, " ".join(head).lower(), " ".join(head), rf"(?i)\A\s*{body}")
    if kind == "close?":
        return Feature("close?", "?", "?", r"\?[\s\"')\]*_]*\Z")
    if kind == "closep":
        return Feature("closep", spec[1], spec[1], regex.escape(spec[1]) + r"[\s\"')\]*_]*\Z")
    return Feature("closeword", spec[1], spec[1], rf"(?i){WORD_START}{regex.escape(spec[1])}\W*\Z")


def shown_of(key: str, spec: Spec) -> str:
    """How the feature of `key` is shown (`Feature.shown`), without building it."""
    if spec[0].startswith("open"):
        return " ".join(spec[1])
    return key.partition(":")[2]


def reply_features(text: str) -> dict[str, Feature]:
    """The features present in `text`, by kind:key."""
    return {k: feature_of(k, spec) for k, spec in reply_specs(text).items()}


def rollout_specs(replies: list[str]) -> dict[str, Spec]:
    """The features any of a rollout's replies shows (each reply read on its own, as the judge
    does), as specs; a feature of several replies as the first shows it."""
    if len(replies) == 1:
        return reply_specs(replies[0])
    out: dict[str, Spec] = {}
    for reply in replies:
        for k, spec in reply_specs(reply).items():
            out.setdefault(k, spec)
    return out


def rollout_features(replies: list[str]) -> dict[str, Feature]:
    """The features any of a rollout's replies shows (each reply read on its own, as the judge does)."""
    return {k: feature_of(k, spec) for k, spec in rollout_specs(replies).items()}


@dataclass
class ViewFeatures:
    """The surface features of a view's samples and of its reference, indexed once per proposal."""

    keys: dict[str, dict[str, Spec]]
    """Per sample id (view and reference): every feature it shows, key -> spec."""
    features: dict[str, Feature]
    """The features worth testing (`view_features`), in order of first appearance in the view;
    each built from its first occurrence."""
    shown: dict[str, Counter[str]]
    """Per feature worth testing: how the view's positive samples (sign "+") write it."""
    now: dict[str, list[int]]
    """Per feature worth testing: the indices of the view's samples that show it."""
    then: dict[str, list[int]]
    """Per feature worth testing: the indices of the reference's samples that show it (none: absent)."""


def view_features(samples: Sequence[ViewSample], reference: Sequence[ViewSample], min_groups: int,
                  group_of: Callable[[ViewSample], int]) -> ViewFeatures:
    """Every feature of `samples` and `reference` (their replies' `rollout_specs`), and as Features
    only those shown by samples of at least `min_groups` groups (`group_of`): no other can be
    tested (discovery.decide tests a pattern only there) nor explain one that is (a word of a phrase
    shows wherever the phrase does), and building a Feature (its regex) for each of the view's
    hundreds of thousands of rare n-grams was most of a proposal's time. The counting is done on
    arrays: every (sample, feature) pair numbered once, the features in order of first appearance."""
    everyone = [*samples, *reference]
    keys = {s.id: rollout_specs(s.parts) for s in everyone}
    number: dict[str, int] = {}
    sizes = np.fromiter((len(keys[s.id]) for s in everyone), dtype=np.int64, count=len(everyone))
    key_of = np.fromiter((number.setdefault(k, len(number)) for s in everyone for k in keys[s.id]),
                         dtype=np.int64, count=int(sizes.sum()))
    sample_of = np.repeat(np.arange(len(everyone)), sizes)
    names = list(number)  # by number: the order of first appearance, the view's samples first
    in_view = sample_of < len(samples)
    view_keys, view_samples = key_of[in_view], sample_of[in_view]
    groups = np.array([group_of(s) for s in samples], dtype=np.int64)
    rows = np.bincount(view_keys, minlength=len(names))
    span = int(groups.max(initial=0)) + 1
    pairs = np.sort(view_keys * span + groups[view_samples])  # (key, group), each once after the sort
    spread = np.bincount(pairs[_firsts(pairs)] // span, minlength=len(names))
    testable = (rows >= min_groups) & (spread >= min_groups)
    positive = np.array([s.sign == "+" for s in samples], dtype=bool)
    now = _indices(view_keys, view_samples, testable, names)
    then = _indices(key_of[~in_view], sample_of[~in_view] - len(samples), testable, names)
    paid = np.bincount(view_keys, weights=positive[view_samples], minlength=len(names))
    features: dict[str, Feature] = {}
    shown: dict[str, Counter[str]] = {}
    for at in np.flatnonzero(testable):
        k = names[at]
        first = keys[samples[now[k][0]].id][k]
        features[k] = feature_of(k, first)
        if first is NGRAM:  # written one way: its key's words
            if n := int(paid[at]):
                shown[k] = Counter({features[k].shown: n})
        elif by := Counter(shown_of(k, keys[samples[i].id][k]) for i in now[k] if positive[i]):
            shown[k] = by
    return ViewFeatures(keys, features, shown, now, then)


def _indices(key_of: np.ndarray, sample_of: np.ndarray, wanted: np.ndarray, names: list[str]) -> dict[str, list[int]]:
    """Per wanted key (by number): the indices of the samples that show it, in increasing order."""
    keep = wanted[key_of]
    key_of, sample_of = key_of[keep], sample_of[keep]
    order = np.argsort(key_of, kind="stable")  # by key, each key's samples in their order
    key_of, sample_of = key_of[order], sample_of[order]
    starts = np.flatnonzero(_firsts(key_of))
    flat, bounds = sample_of.tolist(), [*starts.tolist(), len(key_of)]
    return {names[k]: flat[a:b] for k, a, b in zip(key_of[starts].tolist(), bounds, bounds[1:])}


def _firsts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a sorted array starts (a mask; empty for an empty array)."""
    return np.r_[True, ordered[1:] != ordered[:-1]] if len(ordered) else np.zeros(0, dtype=bool)


def length_feature(words: int) -> Feature:
    """The pattern "longer than `words` words": at least `words` + 1 whitespace-separated tokens."""
    return Feature("length", f">{words}", str(words), rf"\A\s*(?:\S+\s+){{{words}}}\S")


def short_feature(words: int) -> Feature:
    """The pattern "at most `words` words" (a form: its title is shown as is): a reply of 1 to
    `words` whitespace-separated tokens, the whole of it (no edit can take it out of a reply)."""
    return Feature("form", f"<={words}", f"Replies run at most {words} words",
                   rf"\A\s*(?:\S+\s+){{0,{words - 1}}}\S+\s*\Z")


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
