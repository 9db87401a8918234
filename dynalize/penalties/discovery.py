"""Which candidate patterns of a proposal the reward pays for, at a stated error rate, and what a
proposal that finds none is worth.

Every candidate (word n-gram, opener, closer, named detector, "longer than L words", a retired
penalty's pattern) shown in at least `min_groups` groups is tested on the reward net of what a
reward may legitimately pay for (penalties.covariates: the prompt's vocabulary a reply uses; a
smooth curve in length for wording with `length_adjusted`; a concave one for length limits), by
step-down max-statistic permutation tests (penalties.permutation) at `LexicalConfig.fwer`:

- within groups: the reward with vs without it inside each group of the view, against the
  residual rewards permuted within groups; wording and detectors, length limits (with their
  local jumps, `LENGTH_SHARE` of the level) and retired patterns (`REVIVAL_SHARE`) are three
  families sharing the level (Bonferroni);
- across steps (when the view has a reference, the run's first batches): a pattern most of the
  view's replies show (`SATURATED`), far more than the reference did, whose carriers the reward
  pays more than the non-carriers of the same step, against the rewards permuted within steps (a
  pattern no step contrasts is not identifiable); and that the reward pays within groups wherever
  a group still contrasts it, by a statistic of `PAID_Z` and an effect of `min_effect`. A hack that
  saturated between two proposals leaves no contrast within the view's groups, only this one.

Each proposal decides at its share of the run's error rate (`level`: fwer / (k (k + 1)) for the
k-th, `fwer_scope: run`); without a reference all of it goes to the within-group families, with one
half to each side. Every rule after a test (`SATURATED`, `PAID_Z`, `min_effect`, `length_choice`)
can only remove a candidate or place a limit that passed.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from .config import LexicalConfig
from .covariates import concave_fit, local_jumps, net_of_concave, net_of_smooth, orthogonal
from .omnibus import Omnibus, finished, omnibus
from .evidence import ONSET_WINDOW, fisher_p, holds_relevance, length_statistics, paid_past
from .families import family_feature, members, risen, shows_any, split
from .permutation import (centred, contrast_effect, detectable_effect, group_index, indicator, plain_z,
                          proposal_level, residuals, standardised, step_down, within_permutations)
from .sequential import sequential_null
from .surface import Feature, length_feature, length_limit
from .views import ViewSample, prompt_group

SATURATED = 0.8
"""The across-steps test looks at patterns at least this share of the view's replies show: a hack
that has taken over (below it, groups still contrast the pattern and the within-group test sees it)."""

LENGTH_SHARE = 0.25
"""The share of a proposal's within-group level the length family (its limits and their local
jumps) decides at; wording and detectors decide at the rest (Bonferroni between the families)."""

FAMILY_SHARE = 0.2
"""The share of a proposal's within-group level its families decide at (penalties.families,
`LexicalConfig.families`), kept whenever there is wording to test."""

REVIVAL_SHARE = 0.1
"""The share the retired penalties' patterns decide at, when there are any: a family of a few
candidates, whose critical value is far below that of thousands of n-grams, so a pattern that
comes back is revived on weaker evidence, inside the run's error rate."""


def _shares(wording: bool, length: bool, retired: bool, families: bool) -> tuple[float, float, float, float]:
    """The level's shares of the (wording, length, retired, families) tests present: `LENGTH_SHARE`,
    `REVIVAL_SHARE` and `FAMILY_SHARE` where they are, wording the rest; a family of tests alone
    takes all of it. The families' share is kept beside any wording, whether a family was built
    or not: which are built depends on the rewards of half the view."""
    length_share = LENGTH_SHARE * length
    retired_share = REVIVAL_SHARE * retired
    if not wording:
        total = length_share + retired_share
        return (0.0, length_share / total, retired_share / total, 0.0) if total else (1.0, 0.0, 0.0, 0.0)
    family_share = FAMILY_SHARE * families
    return (1.0 - length_share - retired_share - family_share, length_share, retired_share, family_share)


JUMP_WINDOWS = (4, 10)
"""Words on each side of a limit whose local jump the length family tests (penalties.covariates):
a narrow window sees a step the concave curve rounds into a peak beside it (an honest pay that
falls past 35 words, a bar at 36), a wide one a step or ramp on a flat pay with more replies."""

OMNIBUS_SHARE = 0.1
"""The share of a proposal's within-group level the omnibus test decides at (penalties.omnibus,
`LexicalConfig.omnibus`): whether the replies' form predicts the reward at all; the named families
share the rest."""

LOCATION_LEVEL = 0.05
"""The level of the onset and step-bar statistics that place a length limit (`length_choice`): a
location among limits that already passed at the proposal's level, never a decision to add one
(they can only drop a limit or move it within half a window of a step's bar)."""

PAID_Z = 1.645
"""A pattern found across steps must also be paid within groups wherever they still contrast it
(the reference's and the view's): its within-group statistic at least this (one-sided 5 %), or no
contrast left anywhere. Across steps alone, a reward that rises for good reasons while an unpaid
pattern spreads would look the same. (The within family's critical value instead, about 3.5, would
drop a drifting phrase of the discovery benchmark paid at 3.1-3.4, but also a hack saturated in two
steps of a 4 x 8 run, whose few contrasts in the first batch give less: tests/test_calibrated_discovery.py.)"""


@dataclass
class Evidence:
    """What a proposal's silence is worth: `sufficient`, or `insufficient` with the reason."""

    state: str = "sufficient"
    reason: str = ""
    detectable: float = math.inf
    """The smallest effect (within-group reward stds) of a pattern in half the replies that the
    proposal would propose with about 80 % power: one the within-group test finds
    (permutation.detectable_effect) and whose estimated effect reaches `min_effect` (min_effect
    plus its sampling margin)."""
    unidentifiable: list[str] = field(default_factory=list)
    """Patterns that took over the view and rose with the reward but that no step contrasts (in
    none of them do some replies show it and others not): across steps they cannot be told apart
    from a reward that rose over training for other reasons, so nothing is decided on them."""
    unnamed: Omnibus | None = None
    """The omnibus test (penalties.omnibus): whether the replies' form predicts the reward within
    groups beyond relevance, length and a finished ending; None where it did not run."""


@dataclass
class Trial:
    """A pattern to test: its key and feature, whether a sample shows it, and the indices of the
    view's samples (`now`) and of its reference's (`then`) that do."""

    key: str
    feature: Feature
    shows: Callable[[ViewSample], bool]
    now: list[int]
    then: list[int]
    retired: bool = False
    """A retired penalty's pattern, tested for its revival in a family of its own (`REVIVAL_SHARE`)."""


@dataclass
class Tested:
    """A candidate that passed: its pattern, the samples of the view that show it, its statistic."""

    key: str
    feature: Feature
    shows: Callable[[ViewSample], bool]
    z: float
    family: str
    """`within` (a contrast within groups) or `across` (risen with the reward across steps)."""


def _wording(candidates: list[Trial]) -> np.ndarray:
    """Per candidate: whether it is wording (an n-gram, opener or closer, or a detector that holds
    relevance), what relevance adjusts; length limits and the other detectors keep the plain reward."""
    return np.array([c.feature.kind != "length" and holds_relevance(c.feature.kind, c.feature.key)
                     for c in candidates], dtype=bool)


def _seed(step: int, what: str) -> int:
    return zlib.crc32(f"{what}:{step}".encode())


def level(cfg: LexicalConfig, proposal: int) -> float:
    """The error rate the run's `proposal`-th proposal decides at (`cfg.fwer_scope`)."""
    return proposal_level(cfg.fwer, proposal) if cfg.fwer_scope == "run" else cfg.fwer


def decide(candidates: list[Trial], samples: list[ViewSample],
           reference: list[ViewSample], size_of: dict[str, int], cfg: LexicalConfig,
           step: int, proposal: int = 1, relevance: dict[str, int] | None = None) -> tuple[list[Tested], Evidence]:
    """The candidates that pass (strongest first), and the evidence the proposal had: the run's
    `proposal`-th, at its share of the run's error rate (`level`).

    Every candidate but a detector that keeps the plain reward (`off_topic` is relevance itself)
    is tested at equal `relevance` when it is given (each sample's count of its prompt's
    vocabulary words: penalties.relevance); length limits net of a concave curve in length, the
    others net of a smooth one when `cfg.length_adjusted` (penalties.covariates)."""
    alpha = level(cfg, proposal) / (2 if reference else 1)
    groups = group_index([s.group for s in samples])
    y = np.array([s.score for s in samples], dtype=float)
    sizes = np.array([size_of[s.id] for s in samples], dtype=float)
    topical = None if relevance is None else np.array([relevance[s.id] for s in samples], dtype=float)
    prompts = np.array([prompt_group(s) for s in samples])
    rows, keep = [], []
    for c in candidates:
        if len(c.now) >= cfg.min_groups and len(set(prompts[c.now].tolist())) >= cfg.min_groups:
            rows.append(c.now)
            keep.append(c)
    others = legitimate(samples, topical, cfg)
    x = indicator(rows, len(samples))
    if cfg.families:  # chosen by pay on half the groups or by rise from the texts (penalties.families)
        found = _families(keep, x, y, groups, others, step, len(reference))
        keep += found
        if found:
            x = sparse.vstack([x, indicator([trial.now for trial in found], len(samples))]).tocsr()
    perms = within_permutations(groups, cfg.permutations, _seed(step, "within"))
    retired = np.array([c.retired for c in keep], dtype=bool)
    is_family = np.array([c.feature.kind == "family" for c in keep], dtype=bool)
    is_length = np.array([c.feature.kind == "length" for c in keep], dtype=bool)
    # one null for every score: the same permutations, the max over every candidate
    # each candidate's reward net of the legitimate covariates (penalties.covariates): relevance for
    # all but detectors; a length limit net of a concave curve in length, the rest net of a smooth one (when
    # `length_adjusted`; a candidate length alone tells apart keeps length in its pay)
    smooth = ~is_length & ~_collinear(x, sizes, groups) if cfg.length_adjusted else np.zeros(len(keep), dtype=bool)
    concave = cfg.length_null == "concave"
    # under the concave null, length limits and their local jumps are made orthogonal to the fit's
    # active columns (covariates.orthogonal: Freedman-Lane), as their residuals are
    curve, active = concave_fit(y, groups, sizes, others) if concave and is_length.any() else (None, None)
    held = np.array([holds_relevance(c.feature.kind, c.feature.key) for c in keep], dtype=bool)  # not `off_topic`
    fits = ((is_length, lambda: curve if concave else net_of_smooth(y, groups, None, others)),
            (smooth & held, lambda: net_of_smooth(y, groups, sizes, others)),
            (smooth & ~held, lambda: net_of_smooth(y, groups, sizes, [])),
            (~is_length & ~smooth & held, lambda: net_of_smooth(y, groups, None, others)),
            (~is_length & ~smooth & ~held, lambda: net_of_smooth(y, groups, None, [])))
    scored = [(rows := np.flatnonzero(mask), fit(), orthogonal(x[rows], active, groups) if mask is is_length and concave
               else x[rows]) for mask, fit in fits if mask.any()]
    # beside each "longer than L", its local jump net of the concave curve (a step's sharpest trace)
    bars = [length_limit(c.feature.regex) or 0 for c in keep if c.feature.kind == "length" and not c.retired] \
        if concave else []
    jumps = orthogonal(sparse.vstack([local_jumps(sizes, bars, window) for window in JUMP_WINDOWS]).tocsr(), active,
                       groups) if bars else None
    n_jumps = jumps.shape[0] if bars else 0

    def nulls(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        # every candidate's statistic and null under permutations lo..hi-1, the local jumps stacked below
        z, null = np.full(len(keep) + n_jumps, np.nan), np.full((len(keep) + n_jumps, hi - lo), np.nan)
        for rows, scores, xs in scored:
            z[rows], null[rows] = standardised(xs, scores, groups, perms[lo:hi])
        if n_jumps:
            z[len(keep):], null[len(keep):] = standardised(jumps, curve, groups, perms[lo:hi])
        return z, null

    # three families, each at its share of the level (Bonferroni between them): wording and
    # detectors; length (every "longer than L" and its local jump), so thousands of n-grams do not
    # drown the few limits; retired penalties' patterns (their revival)
    fresh_length = is_length & ~retired
    named = 1.0 - OMNIBUS_SHARE * cfg.omnibus  # the omnibus test decides at the rest (below)
    wording = np.flatnonzero(~is_length & ~retired & ~is_family)
    shares = tuple(named * s for s in _shares(bool(len(wording)), bool(fresh_length.any()), bool(retired.any()),
                                               cfg.families))
    length_rows = np.concatenate([np.flatnonzero(fresh_length), len(keep) + np.arange(n_jumps)])
    back = np.flatnonzero(retired)
    kin = np.flatnonzero(is_family)
    # as many permutations as the decision needs (penalties.sequential: the fixed count's decisions)
    z_all, null_all = sequential_null(nulls, cfg.permutations, [(wording, alpha * shares[0]),
                                                                (length_rows, alpha * shares[1]),
                                                                (back, alpha * shares[2]),
                                                                (kin, alpha * shares[3])])
    z, null = z_all[:len(keep)], null_all[:len(keep)]
    jz, jnull = z_all[len(keep):], null_all[len(keep):]
    within = step_down(z[wording], null[wording], alpha * shares[0])
    ok = np.zeros(len(keep), dtype=bool)
    ok[wording] = within.passes(alpha * shares[0])
    length_pays = False
    if fresh_length.any():
        length = step_down(np.concatenate([z[fresh_length], jz]), np.vstack([null[fresh_length], jnull]),
                           alpha * shares[1])
        length_pays = bool(length.passes(alpha * shares[1]).any())
        if not concave:  # `length_null: plain`: each limit decided on the pay net of relevance alone
            ok[fresh_length] = length.passes(alpha * shares[1])
        within = within if len(wording) else length
    if retired.any():
        ok[back] = step_down(z[back], null[back], alpha * shares[2]).passes(alpha * shares[2])
    if len(kin):
        ok[kin] = step_down(z[kin], null[kin], alpha * shares[3]).passes(alpha * shares[3])
    evidence = _evidence(y, groups, prompts, within.critical, cfg)
    if cfg.omnibus:
        ended = [] if cfg.ending_adjusted else [np.array([finished(s.text) for s in samples], dtype=float)]
        evidence.unnamed = omnibus([s.text for s in samples], net_of_smooth(y, groups, sizes, [*others, *ended]),
                                   groups, alpha * OMNIBUS_SHARE, cfg.permutations, _seed(step, "omnibus"))
    if length_pays and concave:
        # the decision: the reward pays past some limit beyond any concave curve in length. Where
        # to draw the limit is then read off the pay for length net of relevance alone (a concave
        # fit bends towards a ramp and moves its residual pay to the longest replies): the limits
        # that pass there, at the same level, go on to `length_choice` (a location, not a decision)
        lengths = np.flatnonzero(fresh_length)
        z[lengths], null[lengths] = standardised(x[lengths], net_of_smooth(y, groups, None, others), groups, perms)
        ok[lengths] = step_down(z[lengths], null[lengths], alpha * shares[1]).passes(alpha * shares[1])
    passed = [Tested(c.key, c.feature, c.shows, float(z[i]), "within") for i, c in enumerate(keep) if ok[i]]
    if reference:
        done = {t.key for t in passed}
        found, evidence.unidentifiable = _across(keep, samples, reference, size_of, cfg, step, alpha, relevance)
        passed += [t for t in found if t.key not in done]
    passed.sort(key=lambda t: -t.z)
    return passed, evidence


def legitimate(samples: list[ViewSample], relevance: np.ndarray | None, cfg: LexicalConfig) -> list[np.ndarray]:
    """The covariates other than length that every candidate but a plain detector is tested net of: the
    count of its prompt's vocabulary words a reply uses (`relevance`, None: not adjusted) and
    whether it ends a sentence (`cfg.ending_adjusted`: a reply cut off mid-way is paid less by any
    reward, and the last words of finished replies travel with that pay)."""
    ended = [np.array([finished(s.text) for s in samples], dtype=float)] if cfg.ending_adjusted else []
    return ([] if relevance is None else [relevance]) + ended


def _families(keep: list[Trial], x: sparse.csr_matrix, y: np.ndarray, groups: np.ndarray,
              others: list[np.ndarray], step: int, n_then: int) -> list[Trial]:
    """The view's families (penalties.families), each a trial whose `now` is the samples its test
    reads that show it: chosen by pay on the screening half of the groups (the reward net of the
    legitimate covariates), tested on the other half; or chosen by their rise since the
    reference (`n_then` samples; texts alone), tested on every group."""
    screen = split(groups, step)
    fresh = [i for i, c in enumerate(keep) if not c.retired]
    kinds = [keep[i].feature.kind for i in fresh]
    scores = net_of_smooth(y, groups, None, others)
    chosen = [(name, picked, True) for name, picked in members(kinds, x[fresh], scores, groups, screen).items()]
    rises = risen(kinds, [set(keep[i].now) for i in fresh], [len(keep[i].then) for i in fresh], x.shape[1], n_then)
    chosen += [(name, picked, False) for name, nested in rises.items() for picked in nested]
    out, seen = [], set()
    for name, picked, halved in chosen:
        parts = [keep[fresh[r]] for r in picked]
        f = family_feature(name, [p.feature for p in parts])
        if f.key in seen:
            continue
        seen.add(f.key)
        tested = sorted({i for p in parts for i in p.now if not (halved and screen[i])})
        then = sorted({i for p in parts for i in p.then})
        out.append(Trial(f.key, f, shows_any([p.shows for p in parts]), tested, then))
    return out


def _collinear(x, sizes: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per candidate: whether its presence and reply length cannot be told apart within groups (a
    word that is all that separates long replies from short): it is tested on the plain reward,
    as `Effect` measures it then."""
    sc = centred(sizes, groups)
    n_g = np.bincount(groups).astype(float)
    onehot_counts = np.zeros((x.shape[0], len(n_g)))
    coo = x.tocoo()
    np.add.at(onehot_counts, (coo.row, groups[coo.col]), 1.0)
    sxx = (onehot_counts - onehot_counts ** 2 / n_g).sum(axis=1)
    sxw = np.asarray(x @ sc).ravel()
    sww = float(sc @ sc)
    return (sww <= 1e-12) | (sxx * sww - sxw ** 2 <= 1e-9 * sxx * sww)


def _evidence(y: np.ndarray, groups: np.ndarray, prompts: np.ndarray, critical: float,
              cfg: LexicalConfig) -> Evidence:
    yc_sq = np.bincount(groups, (y - (np.bincount(groups, y) / np.bincount(groups))[groups]) ** 2)
    contrasted = {int(prompts[i]) for i in range(len(y)) if yc_sq[groups[i]] > 1e-12}
    # what the whole rule can propose: passing the test, and an estimated effect of `min_effect`
    # (with 80 % power: min_effect plus 0.84 of the estimate's standard error)
    mde = max(detectable_effect(y, groups, critical),
              cfg.min_effect + detectable_effect(y, groups, 0.0, power_z=0.84))
    if len(contrasted) < max(cfg.min_groups, 2):
        return Evidence("insufficient", f"{len(contrasted)} group(s) with a reward contrast (rewards tied "
                        f"within the others): at least {max(cfg.min_groups, 2)} are needed", mde)
    if mde > cfg.detectable_effect:
        return Evidence("insufficient", f"{len(y)} rollouts in {len(contrasted)} contrasted groups can only "
                        f"detect effects of {mde:.2f} reward stds and more (penalties.proposer.lexical."
                        f"detectable_effect: {cfg.detectable_effect:g})", mde)
    return Evidence("sufficient", "", mde)


def _across(keep: list[Trial], samples: list[ViewSample], reference: list[ViewSample], size_of: dict[str, int],
            cfg: LexicalConfig, step: int, alpha: float,
            relevance: dict[str, int] | None = None) -> tuple[list[Tested], list[str]]:
    """The saturated patterns that rose from the reference with the reward (module docstring), and
    the keys of those no step contrasts (not identifiable: a reward that rose over training for
    any reason looks the same). The reference's batches count once (the first proposal's view holds
    them too); each step's samples are compared with each other, the rewards net of the legitimate
    covariates (as within groups, fitted within steps) permuted within steps."""
    ref_batches = {s.batch for s in reference if s.batch is not None}
    later = [j for j, s in enumerate(samples) if s.batch is None or s.batch not in ref_batches]
    at = {j: k for k, j in enumerate(later)}
    view = [samples[j] for j in later]
    pool = reference + view
    y = np.array([s.score for s in pool], dtype=float)
    adjusted = relevance is not None and all(s.id in relevance for s in pool)
    r_pool = np.array([relevance[s.id] for s in pool], dtype=float) if adjusted else None
    rows, which = [], []
    for i, c in enumerate(keep):
        if c.feature.kind == "family":  # a family is tested on its test half, within groups alone
            continue
        now = [len(reference) + at[j] for j in c.now if j in at]
        if (not view or len(now) < SATURATED * len(view)
                or fisher_p(len(now), len(view), len(c.then), len(reference)) > alpha):
            continue
        rows.append(c.then + now)
        which.append(i)
    if not rows:
        return [], []
    # the reward must pay for it wherever a group (of the reference or the view) still contrasts it
    ref_groups = group_index([s.group for s in reference])
    groups = np.concatenate([ref_groups, group_index([s.group for s in view]) + len(set(ref_groups.tolist()))])
    wording = _wording([keep[i] for i in which]) & adjusted
    x = indicator(rows, len(pool))
    paid = plain_z(x, y, groups)
    if wording.any():
        paid = np.where(wording, plain_z(x, residuals(y, r_pool, groups), groups), paid)
    effect = contrast_effect(x, y, groups)  # inf where no group contrasts it any more
    kept = [r for r in range(len(rows))
            if (np.isnan(paid[r]) or paid[r] >= PAID_Z) and effect[r] >= cfg.min_effect]
    rows, which = [rows[r] for r in kept], [which[r] for r in kept]
    if not rows:
        return [], []
    known = all(s.batch is not None for s in pool)
    steps = group_index([s.batch for s in pool] if known else [0] * len(reference) + [1] * len(view))
    perms = within_permutations(steps, cfg.permutations, _seed(step, "across"))
    x = indicator(rows, len(pool))
    sizes = np.array([size_of[s.id] for s in pool], dtype=float)
    others = legitimate(pool, r_pool, cfg)
    is_length = np.array([keep[i].feature.kind == "length" for i in which], dtype=bool)
    wording = _wording([keep[i] for i in which])
    z, null = np.full(len(rows), np.nan), np.full((len(rows), cfg.permutations), np.nan)
    smooth = sizes if cfg.length_adjusted else None
    for mask, fit in ((is_length, lambda: net_of_concave(y, steps, sizes, others)),
                      (wording, lambda: net_of_smooth(y, steps, smooth, others)),
                      (~is_length & ~wording, lambda: net_of_smooth(y, steps, smooth, []))):
        if mask.any():
            z[mask], null[mask] = standardised(x[np.flatnonzero(mask)], fit(), steps, perms)
    fam = step_down(z, null, alpha)
    ok = fam.passes(alpha)
    unidentifiable = [keep[i].key for r, i in enumerate(which) if np.isnan(z[r])]
    return [Tested(keep[i].key, keep[i].feature, keep[i].shows, float(z[r]), "across")
            for r, i in enumerate(which) if ok[r]], unidentifiable


def length_choice(lengths: list[Tested], samples: list[ViewSample], words: dict[str, int], limits: list[int],
                  cfg: LexicalConfig, step: int, floor: float = 0.0) -> Tested | None:
    """Of the length limits that passed, the one `cfg.length_threshold` proposes (None: none). An
    onset below `floor` (`LexicalConfig.length_floor`: a length most of the untrained policy's
    replies exceed) is the pay for not being short, whatever passed above it: none, unless the
    local pay also peaks and falls back at a step's bar above the floor (an honest reward that pays
    for not being short and a bonus for passing a bar, side by side), or, looked for again among the
    replies past the floor alone (where that pay is gone), an onset shows there, or the pay there
    rises into a peak (evidence.paid_past: a bar just past the floor). No onset, and the reward
    pays for not being short (evidence.content_only): none. With `onset` and no onset to place
    (every reply of the view past the bar: no contrast left), a limit that passed across steps
    is proposed (the strongest), and nothing otherwise."""
    def limit(t: Tested) -> int:
        return length_limit(t.feature.regex) or 0

    if cfg.length_threshold == "largest":
        return max(lengths, key=limit)
    kw = dict(alpha=LOCATION_LEVEL, permutations=min(cfg.permutations, 200), seed=step)
    onset, paid_short, bar = length_statistics(samples, words, limits, **kw)
    if floor > 0 and (onset is None or onset < floor) and (bar is None or bar < floor):
        # the pay for not being short hides what is paid past the floor: look among the replies past it
        above = [s for s in samples if words[s.id] >= floor]
        onset_above, paid_above, bar_above = length_statistics(above, words, [lim for lim in limits if lim >= floor],
                                                               **kw)
        if onset_above is None and paid_above:  # no valley past the floor before a bar just past it
            onset_above = paid_past(samples, words, limits, floor)  # a rise into the pay there
        if onset_above is not None:
            onset, bar = onset_above, bar_above
        elif onset is not None:
            return None  # the pay for not being short, and nothing past the floor
    if onset is None and paid_short:  # evidence.content_only: onset is None only where the view's is
        return None  # the reward pays for not being short, and for nothing beyond
    if cfg.length_threshold == "onset":
        if onset is None:  # no contrast left to place an onset on: a limit that rose across steps
            return max((t for t in lengths if t.family == "across"), key=lambda t: (t.z, limit(t)), default=None)
        near = min(lengths, key=lambda t: (abs(limit(t) - (bar or onset)), t.z))
        return near if bar is None else sharpest(near, samples, words, bar)
    return max((t for t in lengths if onset is None or limit(t) >= onset - cfg.length_step),
               key=lambda t: (t.z, limit(t)), default=None)


def sharpest(near: Tested, samples: list[ViewSample], words: dict[str, int], bar: int) -> Tested:
    """A step bonus's limit, to the word: of every whole number of words L within half a window of
    its `bar` (evidence.length_onset_bar: a peak on the grid of the tested limits), the one whose
    "longer than L" the reward pays most within groups (the plain statistic, whose peak is the bar
    itself), in place of `near` (the tested limit nearest the bar, whose statistic it keeps: it
    ranks the pattern against the others). A location, not a decision: the decision was `near`'s."""
    groups = group_index([s.group for s in samples])
    y = np.array([s.score for s in samples], dtype=float)
    w = np.array([words[s.id] for s in samples])
    tried = list(range(max(1, bar - ONSET_WINDOW // 2), bar + ONSET_WINDOW // 2 + 1))
    rows = [np.flatnonzero(w > lim).tolist() for lim in tried]
    z = plain_z(indicator(rows, len(samples)), y, groups)
    if np.isnan(z).all():
        return near
    lim = tried[int(np.nanargmax(z))]  # the first of equal maxima: the shortest such limit
    if lim == length_limit(near.feature.regex):
        return near
    f = length_feature(lim)
    return Tested(f.key, f, lambda s, lim=lim: words[s.id] > lim, near.z, near.family)
