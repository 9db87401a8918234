"""What a reward may legitimately pay for, held fixed before a candidate is tested: the null each
candidate's permutation test is run under (penalties.discovery).

A reward model pays for length on a smooth curve (more for not being short, saturating, maybe less
for rambling) and for taking the prompt up (the prompt's vocabulary a reply uses,
penalties.relevance). Neither is a hack, and a pattern that merely comes with longer or more topical
replies must not look paid in itself. So every candidate is tested on the reward net of these
covariates, fitted within groups (Freedman-Lane: the residuals of the null model are what the
permutations shuffle within groups):

- wording and detectors: net of a piecewise-linear spline in reply length (`KNOTS` hinges at
  quantiles of the lengths; any smooth curve, rising or falling) and of relevance;
- "longer than L words": net of a *concave* function of length (the same hinges, their slopes
  only allowed to fall: what pays for not being short and saturates, or turns down past some
  length) and of relevance. A step past L or a ramp that starts past L bends the pay upwards,
  which no concave curve absorbs; a saturating pay for length does not.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import nnls

from .permutation import centred, residuals

KNOTS = 8
"""Hinges of the length curve at most, at evenly spaced quantiles of the view's reply lengths."""

PER_KNOT = 40
"""Samples per hinge: a small view (4 x 8) fits a straight line, so the covariates do not eat the
few contrasts its groups hold."""

WINDOW = 10
"""Words on each side of a limit L that its local jump compares: (L - W, L] against (L, L + W]."""


def hinges(length: np.ndarray, knots: int | None = None) -> np.ndarray:
    """(samples, k) columns max(length - knot, 0) at the distinct inner quantiles of `length`
    (`knots`; default: one per `PER_KNOT` samples, at most `KNOTS`)."""
    w = np.asarray(length, dtype=float)
    knots = min(KNOTS, len(w) // PER_KNOT) if knots is None else knots
    if not len(w) or knots < 1:
        return np.zeros((len(w), 0))
    at = np.unique(np.quantile(w, np.linspace(0, 1, knots + 2)[1:-1]))
    at = at[(at > w.min()) & (at < w.max())]
    return np.maximum(w[:, None] - at[None, :], 0.0)


def net_of_smooth(y: np.ndarray, groups: np.ndarray, length: np.ndarray | None,
                  others: list[np.ndarray]) -> np.ndarray:
    """`y` centred within groups, net of a least-squares spline in `length` (None: no length term)
    and of each of `others` (linear), all within groups."""
    cols = [np.asarray(c, dtype=float) for c in others]
    if length is not None:
        cols += [np.asarray(length, dtype=float), *hinges(length).T]
    return residuals(y, np.column_stack(cols), groups) if cols else centred(y, groups)


def net_of_concave(y: np.ndarray, groups: np.ndarray, length: np.ndarray,
                   others: list[np.ndarray]) -> np.ndarray:
    """`y` centred within groups, net of the least-squares fit a + f(length) + b . others within
    groups where f is concave (piecewise linear, any starting slope, each hinge's slope change at
    most 0): non-negative least squares on the columns length, -length, -hinges, +-others."""
    return concave_fit(y, groups, length, others)[0]


def concave_fit(y: np.ndarray, groups: np.ndarray, length: np.ndarray,
                others: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`net_of_concave`'s residuals and the fit's active columns (samples, k), centred within
    groups: those with a positive coefficient, which the residuals are orthogonal to (the fit is
    least squares on them), what a candidate is made orthogonal to (`orthogonal`)."""
    w = np.asarray(length, dtype=float)
    free = [w, *[np.asarray(c, dtype=float) for c in others]]
    cols = [c for f in free for c in (f, -f)] + [-h for h in hinges(w).T]
    x = np.column_stack([centred(c, groups) for c in cols])
    yc = centred(np.asarray(y, dtype=float), groups)
    keep = (x * x).sum(axis=0) > 1e-12
    if not keep.any():
        return yc, np.zeros((len(yc), 0))
    scale = np.sqrt((x[:, keep] ** 2).sum(axis=0))
    coef, _ = nnls(x[:, keep] / scale, yc, maxiter=50 * int(keep.sum()))
    return yc - (x[:, keep] / scale) @ coef, x[:, keep][:, coef > 0]


def orthogonal(x: sparse.csr_matrix, design: np.ndarray, groups: np.ndarray) -> sparse.csr_matrix:
    """Each row of `x` centred within groups and net of a least-squares fit on `design`'s columns
    (centred within groups): with residuals of that fit permuted within groups, the Freedman-Lane
    statistic (the residual-forming projection applied to the candidate, not only to the reward).
    Without it a candidate the covariates partly carry (a step past L beside a concave curve that
    rises through it) is tested against a null as wide as its whole column, and loses its power."""
    dense = x.toarray().T.astype(float)
    xc = np.column_stack([centred(c, groups) for c in dense.T]) if dense.shape[1] else dense
    if design.shape[1] and xc.shape[1]:
        xc = xc - design @ np.linalg.lstsq(design, xc, rcond=None)[0]
    return sparse.csr_matrix(xc.T)


def local_jumps(length: np.ndarray, limits: list[int], window: int = WINDOW) -> sparse.csr_matrix:
    """(limits, samples) rows: +1 for replies of (L, L + window] words, -1 for (L - window, L]. Net
    of a concave curve, a step at L leaves a local jump there that "longer than L" over every reply
    dilutes; what the length family also tests (penalties.discovery)."""
    w = np.asarray(length, dtype=float)
    rows, cols, vals = [], [], []
    for r, lim in enumerate(limits):
        for sign, (lo, hi) in ((1.0, (lim, lim + window)), (-1.0, (lim - window, lim))):
            at = np.flatnonzero((w > lo) & (w <= hi))
            rows += [r] * len(at)
            cols += at.tolist()
            vals += [sign] * len(at)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(limits), len(w)))
