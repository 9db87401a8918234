"""Sequential Monte-Carlo permutation tests: as many permutations as a proposal's decision needs.

A proposal's permutation null (candidates x permutations, penalties.permutation.standardised) is
its largest cost, and most proposals find nothing: their strongest candidate is reached by many
permutation maxima long before the last permutation. Following Besag and Clifford (1991,
"Sequential Monte Carlo p-values"), the permutations are run in stages and stop once `h` =
`TAIL_COUNT` maxima reach the strongest candidate of every family: its p-value is then at least
(1 + h) / (B + 1) whatever the remaining permutations give, above the family's level, so no
candidate of any family passes, exactly as with all B permutations (step-down adjusted p-values
never fall below the strongest candidate's). Where a candidate may still pass, every permutation
runs: its p-value (counted, or from the fitted tail, permutation.MaxTail) is the fixed-count one.
The decisions are therefore those of the fixed count, pattern for pattern; what the early stop
changes is the permutation count behind the family's critical value (`Family.critical`, from
which `detectable_effect` is read): B / `FIRST_SHARE` fewer maxima estimate it.

The permutations are the same rows in both cases (the first stage is the first rows of the full
set: permutation.within_permutations draws them row by row from one seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .permutation import TAIL_COUNT

FIRST_SHARE = 5
"""The first stage runs 1 / FIRST_SHARE of the permutations (100 of 500), at least `FIRST_MIN`."""

FIRST_MIN = 4 * TAIL_COUNT
"""The fewest permutations of a first stage: enough that `TAIL_COUNT` maxima can reach a statistic."""

Nulls = Callable[[int, int], tuple[np.ndarray, np.ndarray]]
"""(lo, hi) -> every candidate's statistic (k,) and its null under permutations lo..hi-1 (k, hi - lo)."""


def out_of_reach(z: np.ndarray, null: np.ndarray, alpha: float, total: int) -> bool:
    """Whether no candidate of a family (statistics `z`, null over the permutations run so far) can
    pass at `alpha` once all `total` permutations have run: `TAIL_COUNT` or more permutation maxima
    already reach its strongest candidate, whose p-value is then at least (1 + count) / (total + 1)."""
    finite = z[~np.isnan(z)]
    if not len(finite) or not null.shape[1]:
        return not len(finite)
    maxima = np.nan_to_num(null, nan=-np.inf).max(axis=0)
    count = int((maxima >= finite.max() - 1e-12).sum())
    return count >= TAIL_COUNT and (1 + count) / (total + 1) > alpha


def sequential_null(nulls: Nulls, total: int, families: Sequence[tuple[np.ndarray, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Every candidate's statistic and its permutation null, over the first stage's permutations when
    that decides every family (`families`: each family's candidate rows and level; `out_of_reach`),
    else over all `total` (the module docstring)."""
    first = min(total, max(FIRST_MIN, total // FIRST_SHARE))
    z, null = nulls(0, first)
    if first < total and not all(out_of_reach(z[rows], null[rows], alpha, total) for rows, alpha in families):
        null = np.hstack([null, nulls(first, total)[1]])
    return z, null
