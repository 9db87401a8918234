"""The statistics behind the lexical proposer's tests: Fisher's exact test, the RM effect, and
where a reward that pays for length starts to pay (its local pay for each extra word count).

`Effect` asks how much more the RM pays, inside prompt groups, for replies that show a pattern
than for those that do not; with `words` it holds reply length fixed, and with `relevance` (for
wording) the prompt's vocabulary a reply uses (a least-squares fit within groups), so wording that
merely comes with longer or more topical replies, which a reward model pays for, does not look
rewarded in itself: the covariates the permutation tests hold fixed (penalties.discovery).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .detectors import DETECTORS
from .permutation import centred, group_index, within_permutations
from .views import ViewSample


def fisher_p(a: int, n_pos: int, b: int, n_neg: int) -> float:
    """One-sided Fisher exact test: P(>= a of the a + b carriers fall among the n_pos positives)."""
    carriers, total = a + b, n_pos + n_neg
    tail = sum(math.comb(carriers, x) * math.comb(total - carriers, n_pos - x)
               for x in range(a, min(carriers, n_pos) + 1))
    return tail / math.comb(total, n_pos)


class Held(NamedTuple):
    """What the effect test holds fixed (evidence.Effect): each sample's word count (None: not
    `length_adjusted`) and its count of its prompt's vocabulary words (None: not `relevance_adjusted`)."""

    words: dict[str, int] | None
    relevance: dict[str, int] | None


def net_of(kind: str, key: str = "") -> dict[str, bool]:
    """`Effect`'s `adjust` and `wording` for a pattern of `kind` (a detector: named `key`), as the
    permutation tests (penalties.discovery) hold them: length for all but length limits (which the
    permutation tests hold net of a concave curve in length), relevance for wording and the
    detectors that hold it (`Detector.relevance_held`)."""
    return {"adjust": kind != "length", "wording": kind != "length" and holds_relevance(kind, key)}


def holds_relevance(kind: str, key: str = "") -> bool:
    """Whether a pattern of `kind` (a detector: named `key`) is tested net of relevance: all but
    the detectors that keep the plain reward (`Detector.relevance_held`)."""
    return kind != "detector" or (key in DETECTORS and DETECTORS[key].relevance_held)


class Effect:
    """A pattern's standardised effect on the RM score within the groups of `samples`.

    Plain: for each group with replies that show the pattern and replies that do not (all of
    them, whatever their advantage sign), the difference of their mean RM scores; the mean of
    those differences weighted by carriers. Adjusted (`words` and/or `relevance` given): the
    coefficient of presence in a least-squares fit of the RM score on presence and word count
    (`adjust`), and, for wording (`wording`), the count of its prompt's vocabulary words
    (penalties.relevance), all centred within each group: the same within-group contrast, at equal
    length and relevance, as the permutation tests hold fixed. Either is divided by the mean
    within-group std of RM scores (scale-free: it means the same on any RM). inf when no group has
    both kinds of reply (no evidence against the pattern); the plain value when presence and the
    covariates cannot be told apart.
    """

    def __init__(self, samples: list[ViewSample], words: dict[str, int] | None = None,
                 relevance: dict[str, int] | None = None):
        self.groups: dict[int, list[ViewSample]] = {}
        for s in samples:
            self.groups.setdefault(s.group, []).append(s)
        spreads = [statistics.pstdev([s.score for s in g]) for g in self.groups.values() if len(g) > 1]
        self.spread = statistics.fmean(spreads) if spreads else 0.0
        self.words, self.relevance = words, relevance
        self._order = [s for g in self.groups.values() for s in g]
        self._group = np.repeat(np.arange(len(self.groups)), [len(g) for g in self.groups.values()])
        self._y = self._centre([s.score for s in self._order])
        self._fits: dict[tuple[bool, bool], tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}

    def _centre(self, values: list[float]) -> np.ndarray:
        return centred(np.asarray(values, dtype=float), self._group)

    def _fit(self, length: bool, relevant: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(covariates centred within groups, the inverse of their cross-products, the scores net
        of them) for the covariates asked for and given, each with some spread; None: none such.
        What the fit needs of them does not depend on the pattern: once, not per candidate."""
        key = (length, relevant)
        if key not in self._fits:
            given = [c for c, on in ((self.words, length), (self.relevance, relevant)) if on and c is not None]
            cols = [col for col in (self._centre([c[s.id] for s in self._order]) for c in given) if col @ col > 1e-12]
            if not cols:
                self._fits[key] = None
            else:
                w = np.column_stack(cols)
                inverse = np.linalg.pinv(w.T @ w)
                self._fits[key] = (w, inverse, self._y - w @ (inverse @ (w.T @ self._y)))
        return self._fits[key]

    def __call__(self, shows: Callable[[ViewSample], bool], adjust: bool = True, wording: bool = False) -> float:
        if self.spread <= 0:
            return math.inf
        fit = self._fit(adjust, adjust and wording)
        if fit is None:
            return self._plain(shows)
        x = self._centre([float(shows(s)) for s in self._order])
        sxx = float(x @ x)
        if sxx <= 1e-12:
            return math.inf
        w, inverse, net = fit
        xw = w.T @ x
        residual = sxx - float(xw @ inverse @ xw)  # what of presence the covariates do not explain
        if residual <= 1e-9 * sxx:
            return self._plain(shows)
        return float(x @ net) / residual / self.spread

    def _plain(self, shows: Callable[[ViewSample], bool]) -> float:
        diffs = []
        for g in self.groups.values():
            have = [s.score for s in g if shows(s)]
            lack = [s.score for s in g if not shows(s)]
            if have and lack:
                diffs.append((statistics.fmean(have) - statistics.fmean(lack), len(have)))
        if not diffs:
            return math.inf
        return sum(d * n for d, n in diffs) / sum(n for _, n in diffs) / self.spread


ONSET_WINDOW = 10
"""Words on each side of a limit L that its local contrast compares: (L − W, L] against (L, L + W]."""
STEP_FALL_SE = 2.0
"""A step's local pay falls back past its bar by at least this many standard errors (a ramp's noise
does not)."""


def local_length_pay(samples: list[ViewSample], words: dict[str, int], limits: list[int],
                     window: int = ONSET_WINDOW, scores: np.ndarray | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """For each limit L that 3 or more groups can measure: what the RM pays, locally, for crossing
    L, and its standard error, for each column of `scores` (samples x columns; default: the
    samples' own scores, one column). Within each group, the mean score of its replies of
    (L, L + W] words minus that of its replies of (L − W, L]; the mean of those differences
    weighted by the longer replies, in the view's spread units (as `Effect`). A reward that pays
    only for not being short (as true quality often does) gives a contrast that falls with L; one
    that starts paying past L* gives a contrast that rises to L*; one linear in length, a flat
    positive one."""
    whole = Effect(samples)  # its spread
    if whole.spread <= 0 or not samples:
        return {}
    groups = group_index([s.group for s in samples])
    y = np.array([[s.score] for s in samples]) if scores is None else scores
    w = np.array([words[s.id] for s in samples])
    shortest, longest = int(w.min()), int(w.max())
    n_groups = int(groups.max()) + 1
    out = {}
    for limit in sorted(limits):
        if limit - window // 2 < shortest or limit + window > longest:
            continue  # windows the replies do not fill: past the longest, a cut-off reply's drop
        below = (w > limit - window) & (w <= limit)
        above = (w > limit) & (w <= limit + window)
        nb, na = np.bincount(groups[below], minlength=n_groups), np.bincount(groups[above], minlength=n_groups)
        both = (nb > 0) & (na > 0)
        if both.sum() < 3:
            continue
        sums_b = np.zeros((n_groups, y.shape[1]))
        sums_a = np.zeros((n_groups, y.shape[1]))
        np.add.at(sums_b, groups[below], y[below])
        np.add.at(sums_a, groups[above], y[above])
        d = sums_a[both] / na[both, None] - sums_b[both] / nb[both, None]
        n = na[both, None].astype(float)
        total = float(n.sum())
        mean = (d * n).sum(axis=0) / total
        se = np.sqrt((((d - mean) * n) ** 2).sum(axis=0)) / total  # of a weighted mean
        out[limit] = (mean / whole.spread, se / whole.spread)
    return out


def _rise(pay: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per column: the largest rise of the local pay from a limit to a later one, in standard errors."""
    ls = sorted(pay)
    best = np.full(next(iter(pay.values()))[0].shape, -np.inf)
    for i, valley in enumerate(ls):
        for peak in ls[i + 1:]:
            se = np.hypot(pay[peak][1], pay[valley][1])
            with np.errstate(divide="ignore", invalid="ignore"):
                best = np.maximum(best, np.where(se > 0, (pay[peak][0] - pay[valley][0]) / se, -np.inf))
    return best


def _tail(pay: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per column: the local pay over the longer half of the measurable limits, in standard errors
    (a reward that still pays for extra words among the longest replies)."""
    ls = sorted(pay)[len(pay) // 2:]
    mean = sum(pay[lim][0] for lim in ls)
    se = np.sqrt(sum(pay[lim][1] ** 2 for lim in ls))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, mean / se, -np.inf)


def _head(pay: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per column: the local pay over the shorter half of the measurable limits, in standard errors
    (a reward that pays for not being short)."""
    ls = sorted(pay)[:max(1, len(pay) // 2)]
    mean = sum(pay[lim][0] for lim in ls)
    se = np.sqrt(sum(pay[lim][1] ** 2 for lim in ls))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, mean / se, -np.inf)


def content_only(samples: list[ViewSample], words: dict[str, int], limits: list[int], *, alpha: float = 0.05,
                 permutations: int = 200, seed: int = 0) -> bool:
    """Whether the reward, as far as length goes, only pays for not being short: the local pay over
    the shorter half of the limits is positive (at alpha against the same permutations as
    `length_onset`) and `length_onset` finds no onset. "Longer than L" then separates what the
    reward pays for good reasons (true quality often does); a view too small to measure the local
    pay is not content-only (nothing to say either way)."""
    onset, head, _ = length_statistics(samples, words, limits, alpha=alpha, permutations=permutations, seed=seed)
    return onset is None and head


def length_onset(samples: list[ViewSample], words: dict[str, int], limits: list[int], *, alpha: float = 0.05,
                 permutations: int = 200, seed: int = 0) -> int | None:
    """Of `limits`, where the RM starts paying for length, or None when it never does, decided at
    error rate `alpha` against the scores permuted within groups (the same permutations for every
    limit and every valley-to-peak pair, so the many rises looked at are accounted for).

    On the local pay of each limit (`local_length_pay`), two statistics, each tested at alpha / 2
    against its permutation maximum: the largest rise from a valley to a later peak (a step or a
    ramp past L*: the onset is the first limit after the valley that reaches half of the rise,
    within half a window of L*), and the pay over the longer half of the limits (a reward that pays for
    every extra word, or past a bar: the onset is the first limit after the last one of the shorter
    half that pays no more than the permuted rewards do there, at alpha). A
    reward that pays for content (steep over short replies, flat after) has neither, however
    strongly it separates short replies from long ones: proposing "longer than L" there would
    penalise what the reward pays for good reasons."""
    return length_statistics(samples, words, limits, alpha=alpha, permutations=permutations, seed=seed)[0]


def paid_past(samples: list[ViewSample], words: dict[str, int], limits: list[int], floor: float) -> int | None:
    """Where the reward pays for crossing a length past `floor` (a length most of the untrained
    policy's replies exceed) though no onset shows, once the local pay over the shorter half of the
    limits past the floor, among the replies past it (where the pay for not being short is gone), is
    positive (`length_statistics` on those replies): its peak there, when the local pay is higher
    there than at some limit from a window before the floor up to the peak (a rise into it: the pay
    for not being short only falls with L, past the floor too). The peak's limit, or None."""
    above = [s for s in samples if words[s.id] >= floor]
    past = [lim for lim in limits if lim >= floor]
    pay = {lim: float(v[0][0]) for lim, v in local_length_pay(above, words, past).items()}
    whole = {lim: float(v[0][0]) for lim, v in local_length_pay(samples, words, limits).items()}
    peak = max(pay, key=pay.__getitem__, default=None)
    before = [whole[lim] for lim in whole if floor - ONSET_WINDOW <= lim < (peak or 0)]
    return peak if peak in whole and before and whole[peak] > min(before) else None


def length_onset_bar(samples: list[ViewSample], words: dict[str, int], limits: list[int], *, alpha: float = 0.05,
                     permutations: int = 200, seed: int = 0) -> tuple[int | None, int | None]:
    """(`length_onset`, the bar of a step): a step bonus's local pay peaks at its bar and falls back
    past it (`_step_bar`), so where a step pays, that peak (the bar, to the grid of `limits`) says
    where to draw the limit better than the half-way point of the rise (half a window before the
    bar). None for a bar where the pay does not fall back (a ramp, or no onset)."""
    onset, _, bar = length_statistics(samples, words, limits, alpha=alpha, permutations=permutations, seed=seed)
    return onset, bar


def length_statistics(samples: list[ViewSample], words: dict[str, int], limits: list[int], *, alpha: float = 0.05,
                      permutations: int = 200, seed: int = 0) -> tuple[int | None, bool, int | None]:
    """(`length_onset`, whether the local pay over the shorter half of the limits is significantly
    positive (`content_only`'s statistic), the bar of a step: the peak the pay falls back from,
    `_step_bar`), from one set of permutations: what each of those reads, computed once."""
    if not samples:
        return None, False, None
    groups = group_index([s.group for s in samples])
    y = np.array([s.score for s in samples])
    cols = np.column_stack([y, y[within_permutations(groups, permutations, seed)].T])
    pay = local_length_pay(samples, words, limits, scores=cols)
    if len(pay) < 2:
        return None, False, None
    ls = sorted(pay)
    rise, tail, head = _rise(pay), _tail(pay), _head(pay)
    paid_short = bool(head[0] > np.quantile(head[1:], 1 - alpha))
    if rise[0] > np.quantile(rise[1:], 1 - alpha / 2):
        observed = {lim: pay[lim][0][0] for lim in ls}
        se = {lim: pay[lim][1][0] for lim in ls}
        pairs = [(observed[p] - observed[v], v, p) for i, v in enumerate(ls) for p in ls[i + 1:]
                 if math.hypot(se[p], se[v]) > 0
                 and (observed[p] - observed[v]) / math.hypot(se[p], se[v]) >= rise[0] - 1e-9]
        size, valley, peak = max(pairs)
        onset = next(lim for lim in ls if valley < lim <= peak and observed[lim] >= observed[valley] + size / 2)
        return onset, paid_short, _step_bar(onset, pay)
    if tail[0] > np.quantile(tail[1:], 1 - alpha / 2):
        # the longer half pays; the onset is the first limit after the last one of the shorter half
        # that pays no more than permuted rewards do there (at alpha). ("<= 0" read noise below a
        # bar as pay, so the honest pay for not being short, at the shortest limits, became the onset)
        paid_nothing = [lim for lim in ls[:len(ls) // 2] if pay[lim][0][0] <= np.quantile(pay[lim][0][1:], 1 - alpha)]
        later = [lim for lim in ls if not paid_nothing or lim > max(paid_nothing)]
        onset = later[0] if later else None
        return onset, paid_short, None if onset is None else _step_bar(onset, pay)
    return None, paid_short, None


def _step_bar(onset: int, pay: dict[int, tuple[np.ndarray, np.ndarray]]) -> int | None:
    """Where a step bonus's local pay peaks (its bar), or None: the highest pay within two windows
    past the onset, when the pay rose to it from the lowest point within a window before the onset
    and falls back past it by at least half that rise and by `STEP_FALL_SE` standard errors, and the
    rise is at least a quarter of the fall (a peak, not the pay for not being short running out;
    past a bar the fall may run on into the pay for not being long). A ramp's pay stays up."""
    ls = sorted(pay)
    observed = {lim: float(pay[lim][0][0]) for lim in ls}
    peak = max((lim for lim in ls if onset <= lim <= onset + 2 * ONSET_WINDOW), key=lambda lim: observed[lim])
    before = [observed[lim] for lim in ls if onset - ONSET_WINDOW <= lim < peak]
    after = [lim for lim in ls if peak < lim <= peak + ONSET_WINDOW]
    if not before or not after:
        return None
    low = min(after, key=lambda lim: observed[lim])
    rise, fall = observed[peak] - min(before), observed[peak] - observed[low]
    se = math.hypot(float(pay[peak][1][0]), float(pay[low][1][0]))
    return peak if rise > 0 and fall >= rise / 2 and rise >= fall / 4 and fall >= STEP_FALL_SE * se else None
