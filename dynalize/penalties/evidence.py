"""The statistics behind the lexical proposer's tests: Fisher's exact test, the RM effect, and
where a reward that pays for length starts to pay.

`Effect` asks how much more the RM pays, inside prompt groups, for replies that show a pattern
than for those that do not; with `words` it holds reply length fixed (a least-squares fit within
groups on presence and word count), so wording that merely comes with longer replies, which a
length-loving RM pays for, does not look rewarded in itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from .views import ViewSample


def fisher_p(a: int, n_pos: int, b: int, n_neg: int) -> float:
    """One-sided Fisher exact test: P(>= a of the a + b carriers fall among the n_pos positives)."""
    carriers, total = a + b, n_pos + n_neg
    tail = sum(math.comb(carriers, x) * math.comb(total - carriers, n_pos - x)
               for x in range(a, min(carriers, n_pos) + 1))
    return tail / math.comb(total, n_pos)


class Effect:
    """A pattern's standardised effect on the RM score within the groups of `samples`.

    Plain: for each group with replies that show the pattern and replies that do not (all of
    them, whatever their advantage sign), the difference of their mean RM scores; the mean of
    those differences weighted by carriers. Length-adjusted (`words` given, `adjust=True`): the
    coefficient of presence in a least-squares fit of the RM score on presence and word count,
    both centred within each group (the same within-group contrast, at equal length). Either is
    divided by the mean within-group std of RM scores (scale-free: it means the same on any RM).
    inf when no group has both kinds of reply (no evidence against the pattern); the plain value
    when presence and length cannot be told apart.
    """

    def __init__(self, samples: list[ViewSample], words: dict[str, int] | None = None):
        self.groups: dict[int, list[ViewSample]] = {}
        for s in samples:
            self.groups.setdefault(s.group, []).append(s)
        spreads = [statistics.pstdev([s.score for s in g]) for g in self.groups.values() if len(g) > 1]
        self.spread = statistics.fmean(spreads) if spreads else 0.0
        self.words = words
        # what the fit needs of length and score does not depend on the pattern: once, not per candidate
        self._centred: list[list[tuple[float, float]]] = []  # per group: (word count, RM score), centred
        self._sww = self._swy = 0.0
        if words is not None:
            for g in self.groups.values():
                ws = [float(words[s.id]) for s in g]
                ys = [s.score for s in g]
                mw, my = statistics.fmean(ws), statistics.fmean(ys)
                self._centred.append([(w - mw, y - my) for w, y in zip(ws, ys)])
                for w, y in self._centred[-1]:
                    self._sww, self._swy = self._sww + w * w, self._swy + w * y

    def __call__(self, shows: Callable[[ViewSample], bool], adjust: bool = True) -> float:
        if self.spread <= 0:
            return math.inf
        if self.words is None or not adjust:
            return self._plain(shows)
        sxx = sxw = sxy = 0.0
        sww, swy = self._sww, self._swy
        for g, centred in zip(self.groups.values(), self._centred):
            xs = [float(shows(s)) for s in g]
            mx = statistics.fmean(xs)
            for x, (w, y) in zip(xs, centred):
                x -= mx
                sxx, sxw, sxy = sxx + x * x, sxw + x * w, sxy + x * y
        if sxx <= 1e-12:
            return math.inf
        det = sxx * sww - sxw * sxw
        if sww <= 1e-12 or det <= 1e-9 * sxx * sww:
            return self._plain(shows)
        return (sxy * sww - swy * sxw) / det / self.spread

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


def length_onset(samples: list[ViewSample], words: dict[str, int], limits: list[int]) -> int:
    """Of `limits`, where the RM starts paying for length: the L whose step 1[w > L] or hinge
    max(0, w − L) in word count `w`, fitted by least squares within groups (both centred in each
    group), leaves the smallest residual sum of squares. A step fits an RM that pays a bonus past
    L words; a hinge one that pays more the further past L. Ties go to the smaller L."""
    groups: dict[int, list[ViewSample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)

    def sse(feature: Callable[[int], float]) -> float:
        sxx = sxy = syy = 0.0
        for g in groups.values():
            xs = [feature(words[s.id]) for s in g]
            ys = [s.score for s in g]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            for x, y in zip(xs, ys):
                sxx, sxy, syy = sxx + (x - mx) ** 2, sxy + (x - mx) * (y - my), syy + (y - my) ** 2
        return syy - (sxy * sxy / sxx if sxx > 1e-12 else 0.0)

    def best_fit(limit: int) -> float:
        return min(sse(lambda w: float(w > limit)), sse(lambda w: float(max(0, w - limit))))

    return min(sorted(limits), key=best_fit)
