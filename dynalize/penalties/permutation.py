"""Decisions with a stated error rate: the lexical proposer's permutation tests.

Every candidate pattern of a proposal (words, phrases, openers, closers, detectors, "longer than
L words") is a row of a candidates x samples indicator matrix. Its statistic is its within-group
contrast: the sum, over the samples that show it, of their reward minus their group's mean
(optionally net of what reply length explains within groups), standardised by its exact
permutation standard deviation. The null comes from the data: the rewards permuted within
groups, the same permutations for every candidate, so one sparse matrix product gives every
candidate's null at once, and the step-down max-statistic (Westfall-Young) adjusted p-values
bound the chance of any false discovery among all candidates of the proposal by `alpha` (which
bounds the false-discovery rate too). Sample size, group count, candidate frequency and the
number of candidates tried are all accounted for by the permutations themselves.

A run spends its error rate over its proposals (`proposal_level`), so a late proposal decides at
a level far below what its permutations can resolve by counting (1 / (permutations + 1)): where
fewer than `TAIL_COUNT` permutation maxima reach a statistic, its p-value comes from a generalized
Pareto tail fitted to the largest maxima (`MaxTail`), as in Knijnenburg et al. (2009, "Fewer
permutations, more accurate P-values"), with the tail never taken lighter than exponential.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from scipy import sparse, stats

TAIL_COUNT = 10
"""A p-value counts permutation maxima at or above its statistic when at least this many are;
below, it comes from the fitted tail (`MaxTail`)."""

TAIL_SHARE = 0.1
"""The tail fitted: the largest this share of the permutation maxima (50 of 500)."""


def group_index(groups: list[int]) -> np.ndarray:
    """Group labels as 0..G-1, in order of first appearance."""
    seen: dict[int, int] = {}
    return np.array([seen.setdefault(g, len(seen)) for g in groups], dtype=np.int64)


def indicator(rows: list[list[int]], n: int) -> sparse.csr_matrix:
    """A candidates x samples 0/1 matrix from each candidate's sample indices."""
    indptr = np.cumsum([0] + [len(r) for r in rows])
    cols = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(indptr[-1]))
    return sparse.csr_matrix((np.ones(len(cols), dtype=np.float64), cols, indptr), shape=(len(rows), n))


def whole_groups(groups: np.ndarray, most: int, key: str) -> np.ndarray:
    """The indices (in order) of a seeded draw of whole groups (`groups`: 0..k-1), as many groups as
    keep their samples within `most` (at least one group). The draw reads the groups and `key`
    alone, never the rewards, so a permutation test within groups stays exact on what was drawn."""
    order = np.random.default_rng(zlib.crc32(key.encode())).permutation(int(groups.max()) + 1)
    totals = np.bincount(groups, minlength=len(order))[order]
    chosen = order[:max(1, int(np.searchsorted(np.cumsum(totals), most, side="right")))]
    return np.flatnonzero(np.isin(groups, chosen))


def within_permutations(groups: np.ndarray, b: int, seed: int) -> np.ndarray:
    """`b` permutations of the sample indices, each shuffling only within groups: (b, n) sources."""
    rng = np.random.default_rng(seed)
    n = len(groups)
    base = np.argsort(groups, kind="stable")
    keys = groups[base][None, :] + rng.random((b, n))
    src = np.empty((b, n), dtype=np.int64)
    src[:, base] = base[np.argsort(keys, axis=1)]
    return src


def group_onehot(groups: np.ndarray) -> sparse.csr_matrix:
    """A samples x groups 0/1 matrix: `x @ group_onehot(groups)` counts each row's samples per group."""
    return sparse.csr_matrix((np.ones(len(groups)), (np.arange(len(groups)), groups)),
                             shape=(len(groups), int(groups.max()) + 1 if len(groups) else 0))


def centred(y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """`y` minus its group's mean."""
    means = np.bincount(groups, y) / np.bincount(groups)
    return y - means[groups]


def residuals(y: np.ndarray, x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """`y` net of a least-squares fit on `x` (one covariate, or one per column) within groups (all
    centred within groups): what a reward pays beyond what, say, reply length explains."""
    yc = centred(y, groups)
    xc = np.column_stack([centred(c.astype(float), groups) for c in np.asarray(x).reshape(len(y), -1).T])
    xc = xc[:, (xc * xc).sum(axis=0) > 1e-12]
    if xc.shape[1] == 0:
        return yc
    coef = np.linalg.lstsq(xc, yc, rcond=None)[0]
    return yc - xc @ coef


@dataclass
class Family:
    """The candidates of one proposal under one null: their statistic, adjusted p-values, and the
    critical value of the max statistic at the level it was asked for."""

    z: np.ndarray
    """Each candidate's standardised contrast (nan: untestable, no sample pair to contrast)."""
    adjusted: np.ndarray
    """Step-down max-statistic adjusted p-values (1 for untestable candidates)."""
    critical: float
    """The (1 - alpha) quantile of the permutations' max statistic: what a candidate must beat."""

    def passes(self, alpha: float) -> np.ndarray:
        return self.adjusted <= alpha


def standardised(x: sparse.csr_matrix, y: np.ndarray, groups: np.ndarray,
                 perms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of `x`'s (candidates x samples; 0/1, or any weights) contrast of `y` within `groups`,
    standardised by its exact within-group permutation std, and its values under `perms` (rows of sample sources,
    within groups, or over the pool with one group): (k,) and (k, b). nan for a candidate no group
    contrasts (every sample of each of its groups shows it, or none does)."""
    yc = centred(y, groups)
    n_g = np.bincount(groups).astype(float)
    var_g = np.bincount(groups, yc * yc) / n_g  # invariant under within-group permutation
    onehot = group_onehot(groups)
    m = (x @ onehot).toarray()
    m2 = m if _binary(x) else (x.multiply(x) @ onehot).toarray()  # weighted rows: sum of squares per group
    var = ((m2 - m * m / n_g) * n_g / np.maximum(n_g - 1, 1)) @ var_g
    sd = np.sqrt(np.where(var > 1e-12, var, np.nan))
    z = np.asarray(x @ yc).ravel() / sd
    null = np.asarray(x @ yc[perms].T).reshape(x.shape[0], len(perms))
    null /= sd[:, None]  # in place: the (candidates x permutations) null is the proposal's largest array
    return z, null


def _binary(x: sparse.csr_matrix) -> bool:
    return bool(np.all(x.data == 1.0))


def plain_z(x: sparse.csr_matrix, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row of `x`'s standardised within-group contrast of `y` (`standardised`), with no null."""
    return standardised(x, y, groups, np.zeros((0, len(groups)), dtype=np.int64))[0]


def contrast_effect(x: sparse.csr_matrix, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row of `x`'s effect on `y` where groups contrast it, as `evidence.Effect` (plain)
    measures it: per group with samples that show it and samples that do not, the difference of
    their mean `y`, averaged weighted by those that show it, over the mean within-group std of `y`
    (groups of two or more). inf where no group contrasts it (or `y` is tied within every group)."""
    n_g = np.bincount(groups).astype(float)
    sum_g = np.bincount(groups, y)
    yc = centred(y, groups)
    sd_g = np.sqrt(np.bincount(groups, yc * yc) / n_g)
    spread = float(sd_g[n_g >= 2].mean()) if (n_g >= 2).any() else 0.0
    onehot = group_onehot(groups)
    m = (x @ onehot).toarray()
    have = (x @ sparse.diags(y) @ onehot).toarray()
    both = (m > 0) & (m < n_g)
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.where(both, have / np.maximum(m, 1) - (sum_g - have) / np.maximum(n_g - m, 1), 0.0)
        weight = (both * m).sum(axis=1)
        out = (diff * m).sum(axis=1) / weight / spread
    return np.where((weight > 0) & (spread > 1e-12), out, np.inf)


def proposal_level(fwer: float, proposal: int) -> float:
    """The error rate the `proposal`-th proposal of a run (1-based) may spend: fwer / (k (k + 1)),
    which sums to less than `fwer` over any number of proposals, so the chance that a run raises
    any false discovery at all is held at `fwer` however long it trains (half for the first
    proposal, a sixth for the second, a twelfth for the third, ...)."""
    k = max(int(proposal), 1)
    return fwer / (k * (k + 1))


class MaxTail:
    """The upper tail of a permutation null's max statistic: p-values and quantiles counted from
    the permutations where they can be, and beyond from a generalized Pareto fit to the largest
    `TAIL_SHARE` of them (its shape clamped at 0, an exponential tail, when the fit is lighter:
    the max of near-normal statistics has an exponential tail at most), used only where it passes
    a goodness-of-fit check (`_fits`) and never below the counted share of maxima reaching a
    statistic."""

    def __init__(self, maxima: np.ndarray):
        self.maxima = np.sort(maxima[np.isfinite(maxima)])
        self.b = len(maxima)
        self._fit: tuple[float, float, float, float] | None = None

    def _tail(self) -> tuple[float, float, float, float]:
        """(threshold u, share above it, shape, scale) of the fitted tail."""
        if self._fit is None:
            m = self.maxima
            n_tail = max(int(round(TAIL_SHARE * self.b)), TAIL_COUNT)
            u = float(m[-n_tail - 1]) if len(m) > n_tail else float(m[0]) if len(m) else 0.0
            excess = m[m > u] - u
            shape, scale = 0.0, float(excess.mean()) if len(excess) else 0.0
            if len(excess) >= TAIL_COUNT and scale > 0:
                c, _, sc = stats.genpareto.fit(excess, floc=0)
                if c > 0 and np.isfinite(c) and sc > 0:
                    shape, scale = float(c), float(sc)
            if not _fits(excess, shape, scale):
                scale = 0.0  # no tail to extrapolate: p-values are counted
            self._fit = (u, len(excess) / max(self.b, 1), shape, scale)
        return self._fit

    @property
    def fitted(self) -> bool:
        """Whether the tail passed its goodness-of-fit check (`_fits`), so p-values below what the
        permutations count come from it; else they are counted (conservative)."""
        return self._tail()[3] > 0

    def p(self, z: float) -> float:
        """P(max >= z) under the null (at most 1)."""
        count = int(len(self.maxima) - np.searchsorted(self.maxima, z - 1e-12, side="left"))
        if count >= TAIL_COUNT or not len(self.maxima):
            return (1 + count) / (self.b + 1)
        u, share, shape, scale = self._tail()
        if z <= u or scale <= 0:
            return (1 + count) / (self.b + 1)
        x = (z - u) / scale
        survival = math.exp(-x) if shape == 0 else (1 + shape * x) ** (-1 / shape)
        # never below what the permutations counted (an atom of a discrete null the fit smooths over)
        return min(1.0, max(share * survival, count / (self.b + 1)))

    def quantile(self, alpha: float) -> float:
        """The statistic whose p-value is `alpha`: what a candidate must beat at level `alpha`."""
        if not len(self.maxima):
            return math.inf
        if alpha * (self.b + 1) >= 1 + TAIL_COUNT:
            return float(np.quantile(self.maxima, 1 - alpha))
        u, share, shape, scale = self._tail()
        if scale <= 0 and alpha * (self.b + 1) < 1:
            return math.inf  # below what counting resolves, and no tail that fits: nothing passes
        if scale <= 0 or alpha >= share:
            return float(np.quantile(self.maxima, 1 - alpha))
        r = alpha / share
        return u + scale * (-math.log(r) if shape == 0 else (r ** -shape - 1) / shape)


FIT_P = 0.01
"""The fitted tail is used only where a Kolmogorov-Smirnov test of its excesses against it is not
rejected at this level and its excesses are not mostly ties (a discrete null: atoms no smooth
tail describes)."""


def _fits(excess: np.ndarray, shape: float, scale: float) -> bool:
    """Whether the generalized Pareto (shape, scale) describes `excess` (the goodness-of-fit check)."""
    if len(excess) < TAIL_COUNT or scale <= 0:
        return False
    if len(np.unique(np.round(excess, 9))) < len(excess) / 2:
        return False
    return bool(stats.kstest(excess, stats.genpareto(shape, 0, scale).cdf).pvalue >= FIT_P)


def step_down(z: np.ndarray, null: np.ndarray, alpha: float) -> Family:
    """Step-down max-statistic (Westfall-Young) adjusted p-values of observed `z` against its
    permutation `null` (k x b): the chance, under the null, that any candidate ranked at or below
    this one reaches its statistic (`MaxTail`: counted, or from the fitted tail where few
    permutations reach it). Rejecting where it is <= alpha makes any false discovery among the k
    candidates at most that likely."""
    k, b = null.shape
    adjusted = np.ones(k)
    filled = np.nan_to_num(null, nan=-np.inf)
    maxima = filled.max(axis=0) if k else np.full(b, -np.inf)
    top = MaxTail(maxima)
    critical = top.quantile(alpha) if b else math.inf
    testable = np.flatnonzero(~np.isnan(z))
    if len(testable) and b:
        order = testable[np.argsort(-z[testable], kind="stable")]
        rest = filled[order[::-1]]
        np.maximum.accumulate(rest, axis=0, out=rest)  # in place: no second (candidates x permutations) array
        rest = rest[::-1]  # max over the ranks from r down
        counts = (rest >= z[order][:, None] - 1e-12).sum(axis=1)
        p = (1 + counts) / (b + 1)
        tail, row = top, maxima  # ranks sharing their maxima (the family's own, often) share a fit
        for r in np.flatnonzero(counts < TAIL_COUNT):
            if not np.array_equal(rest[r], row):
                row = rest[r]
                tail = MaxTail(row)
            p[r] = tail.p(float(z[order[r]]))
        adjusted[order] = np.maximum.accumulate(p)
    return Family(z, adjusted, critical)


def detectable_effect(y: np.ndarray, groups: np.ndarray, critical: float, power_z: float = 0.84) -> float:
    """The smallest effect (in mean within-group reward stds, as `Effect` measures it) that a pattern
    shown by half the replies of every group would need to be found with about 80 % power
    (`power_z`) against `critical`; inf when no group has a reward contrast. What "no pattern
    found" is worth: a proposal with a large one could not have seen a hack of ordinary size."""
    yc = centred(y, groups)
    n_g = np.bincount(groups).astype(float)
    sd_g = np.sqrt(np.bincount(groups, yc * yc) / n_g)
    live = (n_g >= 2) & (sd_g > 1e-12)
    if not live.any() or not math.isfinite(critical):
        return math.inf
    n, s = n_g[live], sd_g[live]
    spread = float(np.mean(sd_g[n_g >= 2]))  # Effect's unit: the mean within-group std
    m = n / 2
    signal = float(np.sum(m * (n - m) / n)) * spread  # E[T] for an effect of one spread
    noise = math.sqrt(float(np.sum(m * (n - m) / (n - 1) * s * s)))
    return (max(critical, 0.0) + power_z) * noise / signal
