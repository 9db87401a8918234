"""The statistics behind the lexical proposer's tests: Fisher's exact test, the RM effect, and
where a reward that pays for length starts to pay (its local pay for each extra word count).

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


ONSET_WINDOW = 10
"""Words on each side of a limit L that its local contrast compares: (L − W, L] against (L, L + W]."""
ONSET_T = 2.5
"""How many standard errors a rise of the local contrast must reach to count as the RM starting to pay."""


def local_length_pay(samples: list[ViewSample], words: dict[str, int], limits: list[int],
                     window: int = ONSET_WINDOW) -> dict[int, tuple[float, float]]:
    """For each limit L that 3 or more groups can measure: what the RM pays, locally, for crossing
    L, and its standard error. Within each group, the mean RM score of its replies of (L, L + W]
    words minus that of its replies of (L − W, L]; the mean of those differences weighted by the
    longer replies, in the view's spread units (as `Effect`). A reward that pays only for not
    being short (as true quality often does) gives a contrast that falls with L; one that starts
    paying past L* gives a contrast that rises to L*."""
    whole = Effect(samples)  # its groups and spread
    if whole.spread <= 0:
        return {}
    shortest, longest = min(words[s.id] for s in samples), max(words[s.id] for s in samples)
    out = {}
    for limit in sorted(limits):
        if limit - window // 2 < shortest or limit + window > longest:
            continue  # windows the replies do not fill: past the longest, a cut-off reply's drop
        diffs = []
        for g in whole.groups.values():
            below = [s.score for s in g if limit - window < words[s.id] <= limit]
            above = [s.score for s in g if limit < words[s.id] <= limit + window]
            if below and above:
                diffs.append((statistics.fmean(above) - statistics.fmean(below), len(above)))
        if len(diffs) < 3:
            continue
        total = sum(n for _, n in diffs)
        mean = sum(d * n for d, n in diffs) / total
        se = math.sqrt(sum((n * (d - mean)) ** 2 for d, n in diffs)) / total  # of a weighted mean
        out[limit] = (mean / whole.spread, se / whole.spread)
    return out


def length_onset(samples: list[ViewSample], words: dict[str, int], limits: list[int]) -> int | None:
    """Of `limits`, where the RM starts paying for length, or None when it never does.

    On the local pay of each limit (`local_length_pay`): the largest rise from a valley to a later
    peak that reaches `ONSET_T` standard errors, and the first limit after the valley that reaches
    half of it. For a step or a ramp past L* that point lies within half a window of L*. A reward
    that pays for content (steep over short replies, flat after) has no such rise, however strongly
    it separates short replies from long ones: proposing "longer than L" there would penalise
    what the reward pays for good reasons."""
    pay = local_length_pay(samples, words, limits)
    ls = sorted(pay)
    rises = []
    for i, valley in enumerate(ls):
        for peak in ls[i + 1:]:
            rise = pay[peak][0] - pay[valley][0]
            if rise > 0 and rise >= ONSET_T * math.hypot(pay[peak][1], pay[valley][1]):
                rises.append((rise, valley, peak))
    if not rises:
        return None
    rise, valley, peak = max(rises)
    return next(lim for lim in ls if valley < lim <= peak and pay[lim][0] >= pay[valley][0] + rise / 2)
