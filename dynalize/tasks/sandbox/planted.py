"""Which planted feature a penalty catches: the sandbox's own answer key, judged by behaviour.

A penalty matches a feature when putting the feature into clean replies (corpus replies showing
no feature) raises the share its regex fires on by at least `REACT`. The test is the penalty's
behaviour, not its wording, so a penalty written in any form ("longer than 35 words", a word's
plural) is matched as the judge would apply it. The sandbox benchmarks and a sandbox run's
summary use the same rule.
"""

from __future__ import annotations

import random

import regex

from .features import Feature
from .grammar import corpus

REACT = 0.5
"""A penalty matches a feature when adding the feature raises its regex's match rate by this much."""


def clean_replies(features: list[Feature], n: int = 400) -> list[str]:
    """Corpus replies that show none of the features: the base for the regex/feature matching."""
    return [r for _, r in corpus(4 * n, seed=12345) if not any(f.present(r) for f in features)][:n]


def feature_reaction(pattern: str, feature: Feature, base: list[str]) -> float:
    """How much adding `feature` to clean replies raises the match rate of `pattern`."""
    rx = regex.compile(pattern)
    rng = random.Random(0)
    with_f = [feature.insert(r, rng) for r in base]
    return (sum(bool(rx.search(t)) for t in with_f) - sum(bool(rx.search(t)) for t in base)) / len(base)


def match_feature(pattern: str | None, features: list[Feature], base: list[str]) -> tuple[str | None, float]:
    """The label of the feature `pattern` reacts to most, if by `REACT` or more (else None), and
    that reaction."""
    if not pattern or not features:
        return None, 0.0
    scores = {f.label: feature_reaction(pattern, f, base) for f in features}
    label = max(scores, key=lambda k: scores[k])
    return (label, scores[label]) if scores[label] >= REACT else (None, scores[label])


def planted_matches(patterns: list[str | None], features: list[Feature]) -> list[str | None]:
    """For each penalty regex (None: a penalty without one), the planted feature it catches."""
    base = clean_replies(features)
    return [match_feature(p, features, base)[0] for p in patterns]
