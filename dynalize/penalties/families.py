"""Families: interchangeable words, openers or closers the reward pays alike, proposed as one
penalty (issue 56).

A hack that comes in several wordings ("Happy to help further!", "Let me know if you want
more.", ...) spreads over its members: each member is in a fifth of the replies, too few for its
own test, and a penalty on one member leaves the others paid. A family is the disjunction of the
members of one class (`CLASSES`: content words, openers, closers) that the reward pays most.

Choosing the members with the rewards and then testing their union on the same rewards would
not hold the error rate. Members are therefore chosen in one of two ways, each keeping the test
exact (penalties.discovery tests every family in a family of tests of its own, at `FAMILY_SHARE`
of the level; a family's penalty matches every reply that shows a member):

- **by pay, on half the groups** (`members`): the view's prompt groups are split in two by a
  seeded draw (`split`), the members chosen on one half (`SCREEN_Z`, `MAX_MEMBERS`), and the family
  tested on the other half alone (its indicator is zero on the first). Given the first half, the
  second half's rewards are still exchangeable within its groups under the null.
- **by rise, on every group** (`risen`): the members of a class that grew most since the run's
  reference batches, read from the texts alone, never the rewards; the unions of the 2, 3, ...
  `MAX_MEMBERS` steepest risers are each tested on the whole view. A hack in several wordings
  rises with its pay, so this keeps the half of the groups the split gives up (on a view of 10
  groups, 5), where the pay of each member alone is too weak to screen.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
from scipy import sparse

from .permutation import centred, group_index, plain_z
from .surface import Feature

CLASSES = {"words": ("ngram1",), "openers": ("open1", "open2"), "closers": ("closeword", "closep")}
"""The kinds of candidate a family's members are drawn from, by class: a family is all of one class."""

SCREEN_Z = 2.0
"""The union's within-group statistic against the rest on the screening half, at least."""

MEMBER_T = 2.0
"""A member's pay against the replies showing none of its class, in standard errors, at least."""

POOL = 200
"""Candidates of a class fitted together on the screening half, at most: the commonest."""

MAX_MEMBERS = 8
"""Members of a family, at most (the strongest on the screening half)."""

MIN_MEMBERS = 2
"""A family needs this many members: one member is its own candidate already."""


def split(groups: np.ndarray, step: int) -> np.ndarray:
    """Per sample, whether its group is in the screening half: a seeded draw of half the groups
    (by the proposal's step), so the two halves hold about as many prompts each."""
    rng = np.random.default_rng(zlib.crc32(f"families:{step}".encode()))
    ids = np.unique(groups)
    screen = rng.permutation(ids)[: len(ids) // 2]
    return np.isin(groups, screen)


def members(kinds: list[str], x: sparse.csr_matrix, scores: np.ndarray, groups: np.ndarray,
            screen: np.ndarray) -> dict[str, list[int]]:
    """Per class, the rows of `x` (candidates of `kinds`) chosen as a family's members on the
    screening half of the groups. Members of a hack in several wordings are each paid about as
    much as the rest of the replies, which are mostly other members, so each is measured against
    the replies that show none of its class: a ridge fit within groups of the reward on the
    class's `POOL` commonest candidates together. The members: those whose pay there reaches
    `MEMBER_T` standard errors, the strongest `MAX_MEMBERS`; a class whose union, against the
    rest, does not reach `SCREEN_Z` with `MIN_MEMBERS` or more is left out."""
    if not screen.any() or screen.all():
        return {}
    at = np.flatnonzero(screen)
    g = group_index(groups[at].tolist())
    r = centred(np.asarray(scores, dtype=float)[at], g)
    out = {}
    for name, allowed in CLASSES.items():
        rows = np.array([i for i, k in enumerate(kinds) if k in allowed], dtype=np.int64)
        if len(rows) < MIN_MEMBERS:
            continue
        xs = x[rows][:, at]
        common = _commonest(np.asarray(xs.sum(axis=1)).ravel())  # before any dense copy: a view
        rows, xa = rows[common], xs[common].toarray()  # may hold tens of thousands of words
        t = _ridge_t(np.column_stack([centred(c, g) for c in xa]) if len(xa) else np.zeros((len(at), 0)), r)
        picked = [i for i in np.argsort(-t) if t[i] >= MEMBER_T][:MAX_MEMBERS]
        if len(picked) < MIN_MEMBERS:
            continue
        union = sparse.csr_matrix(xa[picked].max(axis=0, keepdims=True))
        if plain_z(union, r, g)[0] >= SCREEN_Z:  # nan where no group contrasts it: left out
            out[name] = [int(rows[i]) for i in picked]
    return out


RISE_Z = 1.0
"""A member chosen by rise grew by at least this many standard errors (two proportions: the view's
replies against the reference's) since the run's reference batches."""


def risen(kinds: list[str], now: list[set[int]], then: list[int], n_now: int, n_then: int) -> dict[str, list[list[int]]]:
    """Per class, the nested member lists of the families chosen by rise (the module docstring):
    of the rows (candidates of `kinds`, shown by the view samples in `now`, of `n_now`, and by
    `then` of `n_then` reference samples) that rose by `RISE_Z` standard errors or more, steepest
    first, each that shows in a sample the ones before it do not (an opener's first word and its
    first two words are one member), the first 2, 3, ... `MAX_MEMBERS`. Texts only: the rewards
    play no part, so each union's permutation test on the whole view is exact. Nothing without a
    reference."""
    if not n_now or not n_then:
        return {}
    counts, then = np.array([len(s) for s in now], dtype=float), np.asarray(then, dtype=float)
    pooled = (counts + then) / (n_now + n_then)
    se = np.sqrt(np.maximum(pooled * (1 - pooled) * (1 / n_now + 1 / n_then), 1e-24))
    z = (counts / n_now - then / n_then) / se
    out = {}
    for name, allowed in CLASSES.items():
        rows = np.array([i for i, k in enumerate(kinds) if k in allowed and z[i] >= RISE_Z], dtype=np.int64)
        steepest: list[int] = []
        covered: set[int] = set()
        for r in rows[np.argsort(-z[rows], kind="stable")]:
            if len(steepest) == MAX_MEMBERS:
                break
            if not now[r] <= covered:
                steepest.append(int(r))
                covered |= now[r]
        if len(steepest) >= MIN_MEMBERS:
            out[name] = [steepest[:k] for k in range(MIN_MEMBERS, len(steepest) + 1)]
    return out


def _commonest(counts: np.ndarray) -> np.ndarray:
    """The `POOL` rows shown by the most samples (`counts`; all of them when fewer), in their order."""
    keep = np.flatnonzero(counts > 0)
    return np.sort(keep[np.argsort(-counts[keep], kind="stable")[:POOL]])


def _ridge_t(xc: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Each column's coefficient over its standard error in a ridge fit of `r` on the columns
    (all centred within groups), the penalty one sample's worth per column."""
    if not xc.shape[1]:
        return np.zeros(0)
    gram = xc.T @ xc + np.eye(xc.shape[1])
    inv = np.linalg.inv(gram)
    coef = inv @ (xc.T @ r)
    resid = r - xc @ coef
    sigma2 = float(resid @ resid) / max(len(r) - xc.shape[1], 1)
    se = np.sqrt(np.maximum(np.einsum("ij,jk,ki->i", inv, gram - np.eye(len(gram)), inv) * sigma2, 1e-24))
    return coef / se


def family_feature(name: str, parts: list[Feature]) -> Feature:
    """The family's pattern: a reply shows it when it shows any member (their regexes joined)."""
    shown = ", ".join(f'"{p.shown}"' for p in parts)
    title = {"words": f"Replies use any of the words {shown}",
             "openers": f"Replies open with any of {shown}",
             "closers": f"Replies end with any of {shown}"}[name]
    body = "|".join(f"(?:{_scoped(p.regex)})" for p in parts)
    return Feature("family", f"family:{name}:" + "|".join(p.key for p in parts), title, body)


def _scoped(rx: str) -> str:
    """A member's regex with its leading global flag made local, so members can be joined."""
    return f"(?i:{rx[4:]})" if rx.startswith("(?i)") else rx


def shows_any(shows: list[Callable]) -> Callable:
    """Whether a sample shows any member (each member's own test)."""
    return lambda s: any(f(s) for f in shows)

