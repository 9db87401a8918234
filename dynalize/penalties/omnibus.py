"""Does the replies' surface form predict the reward within groups at all? The omnibus test that
runs beside the named candidates (issue 56), so that a hack of a kind no candidate names is not
read as "all clear".

Each reply is described by a generic representation of its form (`form_features`): hashed word
n-grams with case kept and lowered, character n-grams with punctuation, symbols and capitals kept,
word shapes (`Xxx`, `XX`, `dd`), what each line starts with, and counts of lines, paragraphs,
questions, exclamations, capitals, digits and symbols outside ASCII. A ridge regression on them
(kernel form, each block weighted alike) is fitted on some prompt groups and scored on the others
(`FOLDS`, cross-fitted), within groups, on the reward net of the legitimate covariates (the
prompt's vocabulary a reply uses, a smooth curve in length, whether the reply is finished:
penalties.covariates). The statistic is the held-out covariance of the predictions with that
reward, standardised and maximised over `RIDGES`; its null is the same statistic on the rewards
permuted within groups (Freedman-Lane), with the permutation tail of penalties.permutation
(`MaxTail`) beyond what the permutations count. It decides at its share of the proposal's level
(penalties.discovery, `OMNIBUS_SHARE`), so it spends from the run's error rate like every other
decision. It names nothing: where it passes and no named pattern does, the monitor and the run
summary say the reward pays for something in the replies' form that no pattern names yet, with
the features that carry the fit (`carriers`).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import sparse

from .permutation import MaxTail, centred, within_permutations

BUCKETS = 1 << 15
"""Hash buckets of the n-gram blocks (collisions only blur which feature carries the fit)."""

FOLDS = 4
"""Folds of prompt groups for cross-fitting: each fold's replies are predicted by a fit on the others."""

RIDGES = (0.1, 1.0, 10.0)
"""Ridge penalties, relative to the kernel's mean diagonal; the statistic is the largest standardised
held-out covariance over them (the same maximum under every permutation, so the test stays exact)."""

MIN_PERMUTATIONS = 1000
"""At least this many permutations of the rewards behind the omnibus null."""

MIN_GROUPS = 4
"""Fewer prompt groups with a reward contrast than this: the omnibus is not run (nothing to hold out)."""

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_FINISHED = re.compile(r"[.!?…][\"')\]*_]*\s*\Z")


def word_shape(token: str) -> str:
    """`Xxx` for "Hello", `XX` for "HELLO" (runs folded to two), `dd` for "42", symbols as themselves."""
    out = []
    for ch in token:
        c = "X" if ch.isupper() else "x" if ch.islower() else "d" if ch.isdigit() else ch
        if len(out) < 2 or out[-1] != c or out[-2] != c:
            out.append(c)
    return "".join(out)


def finished(text: str) -> bool:
    """Whether the reply ends a sentence: a cut-off reply is paid less by any reward, legitimately."""
    return bool(_FINISHED.search(text.strip()))


def form_features(text: str) -> dict[str, Counter[str]]:
    """The reply's form, by block: `words` (n-grams, case kept and lowered, with the opener and the
    closer marked), `chars` (3- and 4-grams of the raw text), `shapes` and `lines` (what each line
    starts with, and counts)."""
    tokens = _TOKEN.findall(text)
    lower = [t.lower() for t in tokens]
    words: Counter[str] = Counter(tokens)
    words.update(lower)
    words.update(f"{a} {b}" for a, b in zip(lower, lower[1:]))
    if lower:
        words.update([f"^{lower[0]}", f"{lower[-1]}$"])
    chars: Counter[str] = Counter(text[i:i + n] for n in (3, 4) for i in range(max(len(text) - n + 1, 0)))
    shapes: Counter[str] = Counter(word_shape(t) for t in tokens)
    shapes.update(f"{a} {b}" for a, b in zip(map(word_shape, tokens), map(word_shape, tokens[1:])))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    structure: Counter[str] = Counter(f"line starts {word_shape(ln.strip()[:2])}" for ln in lines)
    counts = {"lines": len(lines), "paragraphs": len(re.split(r"\n\s*\n", text.strip())) if text.strip() else 0,
              "questions": text.count("?"), "exclamations": text.count("!"),
              "capitalised words": sum(t.isupper() and len(t) > 1 for t in tokens),
              "digits": sum(ch.isdigit() for ch in text), "non-ASCII symbols": sum(ord(ch) > 127 for ch in text),
              "emphasis marks": len(re.findall(r"\*\*|__|(?<!\w)[*_](?=\w)", text))}
    for name, n in counts.items():
        structure[name] = int(np.log1p(n) * 4)  # a count as a graded feature (log scale)
    return {"words": words, "chars": chars, "shapes": shapes, "lines": structure}


@dataclass
class Omnibus:
    """The omnibus test of one proposal."""

    p: float
    """Its p-value (counted from the permutations, or from their fitted tail beyond)."""
    passed: bool
    """Whether it passed at its level: the reward pays for something in the replies' form."""
    statistic: float
    carriers: list[str] = field(default_factory=list)
    """The features that carry the fit, strongest first (their readable names; hashing may merge)."""


@lru_cache(maxsize=1 << 17)
def _bucket(block: str, name: str) -> int:
    return zlib.crc32(f"{block}\x00{name}".encode()) % BUCKETS


def _design(features: list[dict[str, Counter[str]]]) -> dict[str, sparse.csr_matrix]:
    """Per block, the (replies x buckets) presence matrix (graded for counts; colliding features: the largest)."""
    rows: dict[str, tuple[list[int], list[int], list[float]]] = defaultdict(lambda: ([], [], []))
    for i, blocks in enumerate(features):
        for block, feats in blocks.items():
            r, c, v = rows[block]
            seen: dict[int, float] = {}
            for name, n in feats.items():
                if n > 0:
                    b = _bucket(block, name)
                    seen[b] = max(seen.get(b, 0.0), float(n) if block == "lines" else 1.0)
            r += [i] * len(seen)
            c += list(seen)
            v += list(seen.values())
    return {block: sparse.csr_matrix((v, (r, c)), shape=(len(features), BUCKETS)) for block, (r, c, v) in rows.items()}


def _names(features: list[dict[str, Counter[str]]]) -> dict[tuple[str, int], Counter[str]]:
    """What each (block, bucket) holds: its features' names, by how many replies show each."""
    names: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for blocks in features:
        for block, feats in blocks.items():
            for name, n in feats.items():
                if n > 0:
                    names[(block, _bucket(block, name))][name] += 1
    return names


def _folds(groups: np.ndarray, seed: int) -> list[np.ndarray]:
    ids = np.unique(groups)
    order = np.random.default_rng(seed).permutation(ids)
    return [np.isin(groups, part) for part in np.array_split(order, min(FOLDS, len(ids))) if len(part)]


def omnibus(texts: list[str], y: np.ndarray, groups: np.ndarray, alpha: float, permutations: int,
            seed: int) -> Omnibus | None:
    """The omnibus test of `texts` against `y` (the reward net of the legitimate covariates) within
    `groups` at level `alpha`; None where too few groups contrast the reward to hold any out."""
    groups = np.unique(np.asarray(groups), return_inverse=True)[1]
    y = centred(np.asarray(y, dtype=float), groups)
    if len(np.unique(groups[np.abs(y) > 1e-12])) < MIN_GROUPS:
        return None
    features = [form_features(t) for t in texts]
    blocks = _design(features)
    onehot = sparse.csr_matrix((np.ones(len(groups)), (np.arange(len(groups)), groups)))
    n_g = np.asarray(onehot.sum(axis=0)).ravel()

    def within(m: np.ndarray) -> np.ndarray:  # rows centred within groups
        return m - onehot @ ((onehot.T @ m) / n_g[:, None])

    kernel = np.zeros((len(texts), len(texts)))
    for x in blocks.values():
        k = within(within((x @ x.T).toarray()).T)  # (within-group centred x)(its transpose)
        trace = float(np.trace(k))
        if trace > 1e-9:
            kernel += k / trace  # each block weighs alike, however many features it has
    if not kernel.any():
        return Omnibus(1.0, False, 0.0)
    perms = within_permutations(groups, max(int(permutations), MIN_PERMUTATIONS), seed)
    ys = np.vstack([y, y[perms]])  # the observed rewards first, then the permuted ones
    scale = float(np.mean(np.diag(kernel))) or 1.0
    folds = _folds(groups, seed)
    cov = np.zeros((len(RIDGES), len(ys)))
    for test in folds:
        train = ~test
        values, vectors = np.linalg.eigh(kernel[np.ix_(train, train)])
        ahead = ys[:, train] @ vectors  # the training rewards in the kernel's eigenbasis
        across = vectors.T @ kernel[np.ix_(train, test)]
        for r, ridge in enumerate(RIDGES):  # held-out predictions: K_st (K_tt + ridge I)^-1 y_t
            predicted = (ahead / (np.maximum(values, 0.0) + ridge * scale)) @ across
            cov[r] += np.einsum("bi,bi->b", predicted, ys[:, test])
    stats = [(c - float(np.mean(c[1:]))) / (float(np.std(c[1:])) or 1.0) for c in cov]
    stat = np.max(np.stack(stats), axis=0)
    p = MaxTail(stat[1:]).p(float(stat[0]))
    passed = p <= alpha
    return Omnibus(p, passed, float(stat[0]), carriers(blocks, _names(features), y, onehot, n_g) if passed else [])


def carriers(blocks: dict[str, sparse.csr_matrix], names: dict[tuple[str, int], Counter[str]], y: np.ndarray,
             onehot: sparse.csr_matrix, n_g: np.ndarray, top: int = 5) -> list[str]:
    """The features the reward pays most within groups (largest within-group correlation with `y`,
    which is centred within groups), by a readable name of each, strongest first."""
    scored: list[tuple[float, str]] = []
    y_norm = float(np.sqrt(y @ y)) or 1.0
    for block, x in blocks.items():
        cov = np.asarray(x.T @ y).ravel()
        between = sparse.diags(1.0 / n_g) @ (onehot.T @ x).power(2)  # per group: (its sum)^2 / its size
        ss = np.asarray(x.multiply(x).sum(axis=0)).ravel() - np.asarray(between.sum(axis=0)).ravel()
        r = np.where(ss > 1e-9, cov / np.sqrt(np.maximum(ss, 1e-12)) / y_norm, 0.0)
        for j in np.argsort(-r)[:top]:
            if r[j] > 0 and (block, int(j)) in names:
                scored.append((float(r[j]), f"{block}: {names[(block, int(j))].most_common(1)[0][0]!r}"))
    return [name for _, name in sorted(scored, reverse=True)[:top]]
