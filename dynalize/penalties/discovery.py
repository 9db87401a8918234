"""Which candidate patterns of a proposal the reward pays for, at a stated error rate, and what a
proposal that finds none is worth.

Every candidate (word n-gram, opener, closer, named detector, "longer than L words") shown in at
least `min_groups` groups is tested in one of two families, both decided by step-down
max-statistic permutation tests (penalties.permutation) at `LexicalConfig.fdr` between them:

- within groups: the reward with vs without it inside each group of the view (at equal length for
  wording when `length_adjusted`), against the rewards permuted within groups;
- across steps (when the view has a reference, the run's first batches): a pattern most of the
  view's replies show (`SATURATED`), far more than the reference did, whose carriers the reward
  pays more across the pooled reference and view than the rest, against the rewards permuted over
  the pool; and that the reward pays within groups wherever a group still contrasts it, by a
  statistic of `PAID_Z` and an effect of `min_effect` (as the within family's `min_effect`). A
  hack that saturated between two proposals leaves no contrast within groups, only this one.

Each proposal decides at its share of the run's error rate (`level`: fdr / (k (k + 1)) for the
k-th, `fdr_scope: run`); without a reference all of it goes to the within-group family, with one
half to each.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .config import LexicalConfig
from .evidence import ONSET_WINDOW, fisher_p, length_statistics, paid_past
from .permutation import (centred, contrast_effect, detectable_effect, group_index, indicator, plain_z,
                          proposal_level, residuals, standardised, step_down, within_permutations)
from .sequential import sequential_null
from .surface import Feature, length_feature, length_limit
from .views import ViewSample, prompt_group

SATURATED = 0.8
"""The across-steps test looks at patterns at least this share of the view's replies show: a hack
that has taken over (below it, groups still contrast the pattern and the within-group test sees it)."""

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
    within-group test would find with about 80 % power (permutation.detectable_effect)."""


@dataclass
class Trial:
    """A pattern to test: its key and feature, whether a sample shows it, and the indices of the
    view's samples (`now`) and of its reference's (`then`) that do."""

    key: str
    feature: Feature
    shows: Callable[[ViewSample], bool]
    now: list[int]
    then: list[int]


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
    """Per candidate: whether it is wording (an n-gram, opener or closer), what relevance adjusts;
    length limits and detectors keep the plain reward."""
    return np.array([c.feature.kind not in ("length", "detector") for c in candidates], dtype=bool)


def _seed(step: int, what: str) -> int:
    return zlib.crc32(f"{what}:{step}".encode())


def level(cfg: LexicalConfig, proposal: int) -> float:
    """The error rate the run's `proposal`-th proposal decides at (`cfg.fdr_scope`)."""
    return proposal_level(cfg.fdr, proposal) if cfg.fdr_scope == "run" else cfg.fdr


def decide(candidates: list[Trial], samples: list[ViewSample],
           reference: list[ViewSample], size_of: dict[str, int], cfg: LexicalConfig,
           step: int, proposal: int = 1, relevance: dict[str, int] | None = None) -> tuple[list[Tested], Evidence]:
    """The candidates that pass (strongest first), and the evidence the proposal had: the run's
    `proposal`-th, at its share of the run's error rate (`level`).

    Length candidates (kind `length`) are tested on the plain reward, the others at equal length
    when `cfg.length_adjusted`; wording (n-grams, openers, closers) also at equal `relevance` when
    it is given (each sample's count of its prompt's vocabulary words: penalties.relevance)."""
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
    perms = within_permutations(groups, cfg.permutations, _seed(step, "within"))
    is_length = np.array([c.feature.kind == "length" for c in keep], dtype=bool)
    x = indicator(rows, len(samples))
    plain = is_length | _collinear(x, sizes, groups) if cfg.length_adjusted else np.ones(len(keep), dtype=bool)
    wording = _wording(keep) & (topical is not None)

    def nulls(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        # one null for every score: the same permutations, the max over every candidate
        z, null = np.full(len(keep), np.nan), np.full((len(keep), hi - lo), np.nan)
        for at_length in (False, True):  # each candidate's reward: net of length (~plain), of relevance (wording)
            for at_relevance in (False, True):
                mask = (plain != at_length) & (wording == at_relevance)
                if mask.any():
                    net_of = [sizes] * at_length + [topical] * at_relevance
                    scores = residuals(y, np.column_stack(net_of), groups) if net_of else y
                    z[mask], null[mask] = standardised(x[np.flatnonzero(mask)], scores, groups, perms[lo:hi])
        return z, null

    # as many permutations as the decision needs (penalties.sequential: the fixed count's decisions)
    z, null = sequential_null(nulls, cfg.permutations, [(np.arange(len(keep)), alpha)])
    within = step_down(z, null, alpha)
    evidence = _evidence(y, groups, prompts, within.critical, cfg)
    ok = within.passes(alpha)
    passed = [Tested(c.key, c.feature, c.shows, float(z[i]), "within") for i, c in enumerate(keep) if ok[i]]
    if reference:
        done = {t.key for t in passed}
        passed += [t for t in _across(keep, samples, reference, cfg, step, alpha, relevance) if t.key not in done]
    passed.sort(key=lambda t: -t.z)
    return passed, evidence


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
    mde = detectable_effect(y, groups, critical)
    if len(contrasted) < max(cfg.min_groups, 2):
        return Evidence("insufficient", f"{len(contrasted)} group(s) with a reward contrast (rewards tied "
                        f"within the others): at least {max(cfg.min_groups, 2)} are needed", mde)
    if mde > cfg.detectable_effect:
        return Evidence("insufficient", f"{len(y)} rollouts in {len(contrasted)} contrasted groups can only "
                        f"detect effects of {mde:.2f} reward stds and more (penalties.proposer.lexical."
                        f"detectable_effect: {cfg.detectable_effect:g})", mde)
    return Evidence("sufficient", "", mde)


def _across(keep: list[Trial],
            samples: list[ViewSample], reference: list[ViewSample], cfg: LexicalConfig, step: int,
            alpha: float, relevance: dict[str, int] | None = None) -> list[Tested]:
    """The saturated patterns that rose from the reference with the reward (module docstring);
    wording net of `relevance` where every sample of the pool has it (as within groups)."""
    pool = reference + samples
    y = np.array([s.score for s in pool], dtype=float)
    one = np.zeros(len(pool), dtype=np.int64)
    adjusted = relevance is not None and all(s.id in relevance for s in pool)
    r_pool = np.array([relevance[s.id] for s in pool], dtype=float) if adjusted else None
    rows, which = [], []
    for i, c in enumerate(keep):
        if (len(c.now) < SATURATED * len(samples)
                or fisher_p(len(c.now), len(samples), len(c.then), len(reference)) > alpha):
            continue
        rows.append(c.then + [len(reference) + j for j in c.now])
        which.append(i)
    if not rows:
        return []
    # the reward must pay for it wherever a group (of the reference or the view) still contrasts it
    ref_groups = group_index([s.group for s in reference])
    groups = np.concatenate([ref_groups, group_index([s.group for s in samples]) + len(set(ref_groups.tolist()))])
    wording = _wording([keep[i] for i in which]) & adjusted
    x = indicator(rows, len(pool))
    paid = plain_z(x, y, groups)
    if wording.any():
        paid = np.where(wording, plain_z(x, residuals(y, r_pool, groups), groups), paid)
    effect = contrast_effect(x, y, groups)  # inf where no group contrasts it any more
    kept = [r for r in range(len(rows))
            if (np.isnan(paid[r]) or paid[r] >= PAID_Z) and effect[r] >= cfg.min_effect]
    rows, which, wording = [rows[r] for r in kept], [which[r] for r in kept], wording[kept]
    if not rows:
        return []
    perms = np.random.default_rng(_seed(step, "across")).permuted(
        np.tile(np.arange(len(pool)), (cfg.permutations, 1)), axis=1)
    x = indicator(rows, len(pool))
    z, null = standardised(x, y, one, perms)
    if wording.any():
        z_net, null_net = standardised(x, residuals(y, r_pool, one), one, perms)
        z, null = np.where(wording, z_net, z), np.where(wording[:, None], null_net, null)
    fam = step_down(z, null, alpha)
    ok = fam.passes(alpha)
    return [Tested(keep[i].key, keep[i].feature, keep[i].shows, float(z[r]), "across")
            for r, i in enumerate(which) if ok[r]]


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
    kw = dict(alpha=cfg.fdr, permutations=min(cfg.permutations, 200), seed=step)
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
