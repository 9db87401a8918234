"""Does the replies' surface form predict the reward within groups at all? The omnibus test that
runs beside the named candidates (issue 56), so that a hack of a kind no candidate names is not
read as "all clear".

Each reply is described by a generic representation of its form (`form_features`): hashed word
n-grams with case kept and lowered, character n-grams with punctuation, symbols and capitals kept,
word shapes (`Xxx`, `XX`, `dd`), what each line starts with, and counts of lines, paragraphs,
questions, exclamations, capitals, digits and symbols outside ASCII. A ridge regression on them
(each block weighted alike; on the eigenfeatures of their kernel, one decomposition per proposal,
the top `RANK` past `WHOLE_UP_TO` replies) is fitted on some prompt groups and scored on the others
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

import itertools
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import sparse

from .permutation import MaxTail, centred, whole_groups, within_permutations

BUCKETS = 1 << 15
"""Hash buckets of the n-gram blocks (collisions only blur which feature carries the fit)."""

FOLDS = 4
"""Folds of prompt groups for cross-fitting: each fold's replies are predicted by a fit on the others."""

RIDGES = (0.1, 1.0, 10.0)
"""Ridge penalties, relative to the kernel's mean diagonal; the statistic is the largest standardised
held-out covariance over them (the same maximum under every permutation, so the test stays exact)."""

WHOLE_UP_TO = 1024
"""Up to this many replies the fit uses the kernel whole (one eigendecomposition per proposal)."""

RANK = 512
"""Past `WHOLE_UP_TO` replies the kernel is replaced by its top-`RANK` eigendirections (a seeded
randomised eigendecomposition, `POWER` power iterations), so the fit costs O(replies^2 x RANK)
instead of O(replies^3). The approximation is made from the texts and the groups alone, never the
rewards, so the permutation test stays exact; what it gives up is power for pay carried only by
the kernel's smallest directions."""

MOST_REPLIES = 2048
"""Replies the test reads at most: past it, a seeded draw of whole prompt groups, as many as keep
it within this (permutation.whole_groups). Its cost grows with the square of the replies (the
kernel); the draw reads the groups alone, never the rewards, so the test stays exact on the
replies drawn. What it gives up is power for pay too rare to show in 2,048 replies. A proposal
reads at most `LexicalConfig.most_rollouts` (1,024 by default), so this draw acts only where a
user raised that or a rollout holds several replies."""

DENSE_SHARE = 0.1
"""A feature shown in more than this share of the replies enters the kernel by a dense product."""

POWER = 2
"""Power iterations of the randomised eigendecomposition (each one more product with the kernel)."""

MIN_PERMUTATIONS = 1000
"""At least this many permutations of the rewards behind the omnibus null."""

MIN_GROUPS = 4
"""Fewer prompt groups with a reward contrast than this: the omnibus is not run (nothing to hold out)."""

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_FINISHED = re.compile(r"[.!?…][\"')\]*_]*\s*\Z")


@lru_cache(maxsize=1 << 16)
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


def form_features(text: str) -> dict[str, set[str] | Counter[str]]:
    """The reply's form, by block: the features it shows in `words` (n-grams, case kept and
    lowered, with the opener and the closer marked), `chars` (3- and 4-grams of the raw text) and
    `shapes`, and in `lines` what each line starts with and graded counts (a Counter)."""
    tokens = _TOKEN.findall(text)
    lower = [t.lower() for t in tokens]
    words = {*tokens, *lower, *(f"{a} {b}" for a, b in zip(lower, lower[1:]))}
    if lower:
        words.update([f"^{lower[0]}", f"{lower[-1]}$"])
    chars = {text[i:i + n] for n in (3, 4) for i in range(max(len(text) - n + 1, 0))}
    shape = [word_shape(t) for t in tokens]
    shapes = {*shape, *(f"{a} {b}" for a, b in zip(shape, shape[1:]))}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    structure: Counter[str] = Counter(f"line starts {word_shape(ln.strip()[:2])}" for ln in lines)
    counts = {"lines": len(lines), "paragraphs": len(re.split(r"\n\s*\n", text.strip())) if text.strip() else 0,
              "questions": text.count("?"), "exclamations": text.count("!"),
              "capitalised words": sum(t.isupper() and len(t) > 1 for t in tokens),
              "digits": sum(map(str.isdigit, text)), "non-ASCII symbols": len(text) - len(text.encode("ascii", "ignore")),
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
    replies: int = 0
    """The replies it read (`MOST_REPLIES` at most: a draw of whole groups past it)."""


def _bucket(block: str, name: str) -> int:
    return zlib.crc32(f"{block}\x00{name}".encode()) % BUCKETS


def _shown(feats: set[str] | Counter[str]) -> dict[str, float]:
    """A block's features with their values: 1 for a set's, the count for a Counter's (lines)."""
    return {name: float(n) for name, n in feats.items() if n > 0} if isinstance(feats, Counter) else dict.fromkeys(feats, 1.0)


def _design(features: list[dict[str, set[str] | Counter[str]]], buckets: dict[str, dict[str, int]]
            ) -> dict[str, sparse.csr_matrix]:
    """Per block, the (replies x buckets) matrix of the features shown (graded for counts; colliding
    features: the largest). `buckets` is filled with each block's features' buckets."""
    out = {}
    for block in features[0] if features else ():
        shown = [_shown(blocks[block]) for blocks in features]
        names = list(itertools.chain.from_iterable(shown))
        table = buckets.setdefault(block, {})
        table.update((name, _bucket(block, name)) for name in dict.fromkeys(names) if name not in table)
        r = np.repeat(np.arange(len(features)), [len(d) for d in shown])
        c = np.fromiter(map(table.__getitem__, names), dtype=np.int64, count=len(names))
        v = np.fromiter(itertools.chain.from_iterable(d.values() for d in shown), dtype=float, count=len(names))
        order = np.lexsort((v, c, r))  # within a (reply, bucket): the largest value last, and kept
        r, c, v = r[order], c[order], v[order]
        last = np.ones(len(r), dtype=bool)
        last[:-1] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
        out[block] = sparse.csr_matrix((v[last], (r[last], c[last])), shape=(len(features), BUCKETS))
    return out


def gram(x: sparse.csr_matrix) -> np.ndarray:
    """`x x^T` as a dense array: the columns most rows share multiplied densely (their sparse product
    costs the square of their counts), the rest sparsely."""
    x = x.tocsc()
    shared = np.diff(x.indptr) > DENSE_SHARE * x.shape[0]
    common = x[:, shared].toarray().astype(np.float32)  # whole numbers: exact in single precision
    return (common @ common.T).astype(float) + (x[:, ~shared] @ x[:, ~shared].T).toarray()


def _names(features: list[dict[str, set[str] | Counter[str]]], buckets: dict[str, dict[str, int]],
           wanted: set[tuple[str, int]]) -> dict[tuple[str, int], Counter[str]]:
    """What each `wanted` (block, bucket) holds: its features' names, by how many replies show each."""
    held = [(block, name, b) for block, table in buckets.items() for name, b in table.items() if (block, b) in wanted]
    names: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for blocks in features:
        for block, name, b in held:
            shown = blocks[block]
            if shown[name] > 0 if isinstance(shown, Counter) else name in shown:
                names[(block, b)][name] += 1
    return names


def _folds(groups: np.ndarray, seed: int) -> list[np.ndarray]:
    ids = np.unique(groups)
    order = np.random.default_rng(seed).permutation(ids)
    return [np.isin(groups, part) for part in np.array_split(order, min(FOLDS, len(ids))) if len(part)]


def omnibus(texts: list[str], y: np.ndarray, groups: np.ndarray, alpha: float, permutations: int,
            seed: int, whole_up_to: int = WHOLE_UP_TO, rank: int = RANK, most: int = MOST_REPLIES) -> Omnibus | None:
    """The omnibus test of `texts` against `y` (the reward net of the legitimate covariates) within
    `groups` at level `alpha` (on a draw of whole groups past `most` replies; past `whole_up_to`,
    on `rank` of the kernel's directions); None where too few groups contrast the reward to hold
    any out."""
    groups = np.unique(np.asarray(groups), return_inverse=True)[1]
    y = np.asarray(y, dtype=float)
    if len(texts) > most:
        kept = whole_groups(groups, most, f"omnibus-draw:{seed}")
        texts, y, groups = [texts[i] for i in kept], y[kept], np.unique(groups[kept], return_inverse=True)[1]
    y = centred(y, groups)
    if len(np.unique(groups[np.abs(y) > 1e-12])) < MIN_GROUPS:
        return None
    features = [form_features(t) for t in texts]
    buckets: dict[str, dict[str, int]] = {}
    blocks = _design(features, buckets)
    onehot = sparse.csr_matrix((np.ones(len(groups)), (np.arange(len(groups)), groups)))
    n_g = np.asarray(onehot.sum(axis=0)).ravel()

    def within(m: np.ndarray) -> np.ndarray:  # rows centred within groups
        return m - onehot @ ((onehot.T @ m) / n_g[:, None])

    kernel = np.zeros((len(texts), len(texts)))
    for x in blocks.values():
        trace = float(within_squares(x, onehot, n_g).sum())  # that of the within-group centred x's gram
        if trace > 1e-9:
            kernel += gram(x) / trace  # each block weighs alike, however many features it has
    kernel = within(within(kernel).T)  # (within-group centred x)(its transpose), all blocks at once
    if not kernel.any():
        return Omnibus(1.0, False, 0.0, replies=len(texts))
    perms = within_permutations(groups, max(int(permutations), MIN_PERMUTATIONS), seed)
    ys = np.vstack([y, y[perms]])  # the observed rewards first, then the permuted ones
    scale = float(np.mean(np.diag(kernel))) or 1.0
    ridges = [ridge * scale for ridge in RIDGES]
    cov = np.zeros((len(RIDGES), len(ys)))
    if len(texts) <= whole_up_to:  # the kernel whole: each fit on it directly, the smaller problem
        for test in _folds(groups, seed):
            cov += kernel_held_out_covariance(kernel, ys, ~test, test, ridges)
    else:
        phi = spectral_features(kernel, rank, seed)
        for test in _folds(groups, seed):
            cov += held_out_covariance(phi, ys, ~test, test, ridges)
    stats = [(c - float(np.mean(c[1:]))) / (float(np.std(c[1:])) or 1.0) for c in cov]
    stat = np.max(np.stack(stats), axis=0)
    p = MaxTail(stat[1:]).p(float(stat[0]))
    passed = p <= alpha
    return Omnibus(p, passed, float(stat[0]), carriers(blocks, features, buckets, y, onehot, n_g) if passed else [],
                   len(texts))


def held_out_covariance(phi: np.ndarray, ys: np.ndarray, train: np.ndarray, test: np.ndarray,
                        ridges: list[float]) -> np.ndarray:
    """Per ridge and per reward vector (the rows of `ys`), the covariance of a ridge fit's held-out
    predictions with the held-out rewards: y_s . phi_s (phi_t^T phi_t + ridge I)^-1 phi_t^T y_t, on
    features `phi` with `phi phi^T` the kernel. One eigendecomposition of the training Gram serves
    every ridge and every permutation: with phi_t^T phi_t = V diag(s) V^T the covariance is
    sum_j (V^T phi_s^T y_s)_j (V^T phi_t^T y_t)_j / (s_j + ridge), where a solve per ridge costs
    (directions)^2 per permutation."""
    values, v = np.linalg.eigh(phi[train].T @ phi[train])
    ahead = (phi[train] @ v).T @ ys[:, train].T  # the training rewards on the eigendirections
    held = (phi[test] @ v).T @ ys[:, test].T  # the held-out rewards on the same directions
    both = ahead * held
    values = np.maximum(values, 0.0)  # a Gram's eigenvalues: negative only by rounding
    return np.stack([(1.0 / (values + ridge)) @ both for ridge in ridges])


def kernel_held_out_covariance(kernel: np.ndarray, ys: np.ndarray, train: np.ndarray, test: np.ndarray,
                               ridges: list[float]) -> np.ndarray:
    """`held_out_covariance` with the kernel itself for `phi phi^T` (the same fit: a ridge's
    held-out predictions are K_st (K_tt + ridge I)^-1 y_t), from one eigendecomposition of the
    training replies' kernel, K_tt = U diag(s) U^T: sum_j (U^T K_ts y_s)_j (U^T y_t)_j / (s_j + ridge).
    With the kernel whole it needs no features, and its decomposition is of the training replies,
    fewer than the kernel's directions."""
    values, u = np.linalg.eigh(kernel[np.ix_(train, train)])
    ahead = u.T @ ys[:, train].T
    held = u.T @ (kernel[np.ix_(train, test)] @ ys[:, test].T)
    both = ahead * held
    values = np.maximum(values, 0.0)  # a kernel's eigenvalues: negative only by rounding
    return np.stack([(1.0 / (values + ridge)) @ both for ridge in ridges])


def orthonormal(y: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the span of `y`'s columns (directions of negligible weight dropped),
    from the eigenvectors of `y^T y`: products and one small eigendecomposition, where a QR
    factorisation of the tall `y` is many times slower on a loaded machine's threaded BLAS."""
    values, u = np.linalg.eigh(y.T @ y)
    keep = values > 1e-10 * max(float(values[-1]), 1e-300)
    return (y @ u[:, keep]) / np.sqrt(values[keep])


def spectral_features(kernel: np.ndarray, rank: int | None, seed: int) -> np.ndarray:
    """Features `phi` (replies x directions) with `phi phi^T` the kernel (`rank` None), or its best
    rank-`rank` approximation found by a seeded randomised eigendecomposition."""
    n = len(kernel)
    if rank is None or n <= rank:
        values, vectors = np.linalg.eigh(kernel)
    else:
        sketch = np.random.default_rng([seed, n]).standard_normal((n, rank + 16))  # 16: oversampling
        basis = orthonormal(kernel @ sketch)
        for _ in range(POWER):
            basis = orthonormal(kernel @ basis)
        values, small = np.linalg.eigh(basis.T @ kernel @ basis)
        values, vectors = values[-rank:], basis @ small[:, -rank:]
    kept = values > 1e-12 * max(float(values[-1]), 1e-300)
    return vectors[:, kept] * np.sqrt(values[kept])


def within_squares(x: sparse.csr_matrix, onehot: sparse.csr_matrix, n_g: np.ndarray) -> np.ndarray:
    """Per column of `x`, its sum of squares about its group means (groups: `onehot`, sizes `n_g`)."""
    between = sparse.diags(1.0 / n_g) @ (onehot.T @ x).power(2)  # per group: (its sum)^2 / its size
    return np.asarray(x.multiply(x).sum(axis=0)).ravel() - np.asarray(between.sum(axis=0)).ravel()


def carriers(blocks: dict[str, sparse.csr_matrix], features: list[dict[str, set[str] | Counter[str]]],
             buckets: dict[str, dict[str, int]], y: np.ndarray, onehot: sparse.csr_matrix, n_g: np.ndarray,
             top: int = 5) -> list[str]:
    """The features the reward pays most within groups (largest within-group correlation with `y`,
    which is centred within groups), by a readable name of each, strongest first."""
    scored: list[tuple[float, str, int]] = []
    y_norm = float(np.sqrt(y @ y)) or 1.0
    for block, x in blocks.items():
        cov = np.asarray(x.T @ y).ravel()
        ss = within_squares(x, onehot, n_g)
        r = np.where(ss > 1e-9, cov / np.sqrt(np.maximum(ss, 1e-12)) / y_norm, 0.0)
        scored += [(float(r[j]), block, int(j)) for j in np.argsort(-r)[:top] if r[j] > 0]
    names = _names(features, buckets, {(block, j) for _, block, j in scored})
    named = [(r, f"{block}: {names[(block, j)].most_common(1)[0][0]!r}") for r, block, j in scored if names[(block, j)]]
    return [name for _, name in sorted(named, reverse=True)[:top]]
