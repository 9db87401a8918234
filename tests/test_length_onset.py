"""The length onset: proposed "longer than L words" penalties start where the reward starts to pay,
decided at a stated error rate against rewards permuted within groups
(`length_threshold: onset`), on any threshold, for a step bonus and for a bonus growing with length,
also on a reward that already pays for not being short; and none where it never starts to pay."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from dynalize.grpo import advantages
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.evidence import length_onset, length_onset_bar
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.surface import length_limit
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = "the a cat dog sat ran far near home slowly quickly".split()


def grouped_view(reply: Callable[[random.Random], tuple[str, float]], seed: int, groups: int = 80,
                 per_group: int = 8) -> ProposerView:
    """A proposer view of `groups` x `per_group` replies, each (text, RM score) drawn by `reply`:
    640 replies, the size of the sandbox proposer's pooled view."""
    rng = random.Random(seed)
    drawn = [[reply(rng) for _ in range(per_group)] for _ in range(groups)]
    scores = [[sc for _, sc in g] for g in drawn]
    samples = []
    for g, (members, adv) in enumerate(zip(drawn, advantages(scores))):
        for (text, sc), a in zip(members, adv):
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, text, sc, advantage_sign(a)))
    return ProposerView(step=0, samples=samples)


def view(onset: int, shape: str, seed: int = 0) -> ProposerView:
    """Replies of 8 to 80 words; the reward pays past `onset` words (a step, or a ramp)."""
    def reply(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(8, 80)
        pay = (n > onset) * 1.0 if shape == "step" else max(0, n - onset) / 20
        text = " ".join(rng.choice(WORDS) for _ in range(n))
        return text, rng.gauss(0, 0.3) + pay
    return grouped_view(reply, seed)


@pytest.mark.parametrize("shape", ["step", "ramp"])
@pytest.mark.parametrize("onset", [20, 30, 50])
def test_the_fitted_onset_is_within_5_words_of_where_the_reward_starts_to_pay(onset, shape):
    v = view(onset, shape)
    words = {s.id: len(s.text.split()) for s in v.samples}
    assert abs(length_onset(v.samples, words, list(range(5, 80, 5))) - onset) <= 5


@pytest.mark.parametrize("shape", ["step", "ramp"])
@pytest.mark.parametrize("onset", [30, 50])
def test_the_onset_setting_proposes_the_limit_where_the_reward_starts_to_pay(onset, shape):
    cfg = dict(min_effect=0.3, length_adjusted=True)
    v = view(onset, shape, seed=1)
    onset_pick = LexicalProposer(LexicalConfig(**cfg, length_threshold="onset")).best(v)
    largest_pick = LexicalProposer(LexicalConfig(**cfg, length_threshold="largest")).best(v)
    assert onset_pick is not None and largest_pick is not None
    assert abs(length_limit(onset_pick.regex) - onset) <= 5, onset_pick.title
    assert length_limit(largest_pick.regex) >= length_limit(onset_pick.regex)


def view_on_content(bonus_from: int | None, seed: int = 0) -> ProposerView:
    """Replies of 5 to 60 words scored as true quality often is: more for not being short, flat
    from 25 words on; with `bonus_from`, a bonus of 0.5 past that many words on top (a hack)."""
    def reply(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(5, 60)
        bonus = 0.5 * (bonus_from is not None and n > bonus_from)
        text = " ".join(["word"] * n)  # nothing but length to tell replies apart
        return text, rng.gauss(0, 0.3) + min(1.0, n / 25) + bonus
    return grouped_view(reply, seed)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("onset", [40, 50])
def test_the_onset_is_found_on_a_reward_that_already_rises_with_length(onset, seed):
    v = view_on_content(onset, seed)
    words = {s.id: len(s.text.split()) for s in v.samples}
    found = length_onset(v.samples, words, list(range(5, 60, 5)))
    assert found is not None and abs(found - onset) <= 5


def honest_and_ramp(rng: random.Random) -> tuple[str, float]:
    """The discovery benchmark's honest length pay (less for fewer than 15 or more than 35 words)
    and a ramp from 30 words (benchmarks/discovery_worlds.py)."""
    n = rng.randint(8, 60)
    honest = -min(0.5, max(0, 15 - n, n - 35) / 30)
    return " ".join(rng.choice(WORDS) for _ in range(n)), rng.gauss(0, 0.3) + honest + 1.2 * min(25, max(0, n - 30)) / 25


@pytest.mark.parametrize(("groups", "at_least"), [(20, 8), (80, 7)])
def test_the_pay_for_not_being_short_is_not_the_onset_of_a_ramp_past_it(groups, at_least):
    # the longer limits pay (the ramp); the onset is after the last shorter limit that does not pay
    # more than permuted rewards do. Counting "pays nothing" as "<= 0", noise between 15 and 30
    # words hid that gap, and the honest pay at 15 was the onset (4 and 6 of 10 views within 5 words)
    near = 0
    for seed in range(10):
        v = grouped_view(honest_and_ramp, seed, groups=groups)
        words = {s.id: len(s.text.split()) for s in v.samples}
        near += abs((length_onset(v.samples, words, list(range(5, 60, 5))) or 0) - 30) <= 5
    assert near >= at_least


@pytest.mark.parametrize("seed", range(4))
def test_a_reward_that_only_pays_for_not_being_short_has_no_onset(seed):
    v = view_on_content(None, seed)
    words = {s.id: len(s.text.split()) for s in v.samples}
    assert length_onset(v.samples, words, list(range(5, 60, 5))) is None


def test_the_onset_setting_proposes_no_length_penalty_where_the_reward_never_starts_to_pay():
    cfg = dict(min_effect=0.3, length_adjusted=True, detectors=[])  # the texts loop one word: no loop detector
    v = view_on_content(None)
    largest_pick = LexicalProposer(LexicalConfig(**cfg, length_threshold="largest")).best(v)
    assert largest_pick is not None and length_limit(largest_pick.regex) is not None  # the contrast is there
    result = ProposalResult(step=0)
    onset_pick = LexicalProposer(LexicalConfig(**cfg, length_threshold="onset")).best(v, result)
    assert onset_pick is None
    assert result.rejected.get("no_onset") == 1


def view_on_length(linear: bool, seed: int) -> ProposerView:
    """Replies of 8 to 80 words; the reward ignores length, or pays 1/40 a word under unit noise."""
    def reply(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(8, 80)
        text = " ".join(rng.choice(WORDS) for _ in range(n))
        return text, rng.gauss(0, 1.0 if linear else 0.3) + (n / 40 if linear else 0.0)
    return grouped_view(reply, seed)


def onsets(linear: bool, seeds: int) -> int:
    found = 0
    for seed in range(seeds):
        v = view_on_length(linear, seed)
        words = {s.id: len(s.text.split()) for s in v.samples}
        found += length_onset(v.samples, words, list(range(5, 80, 5))) is not None
    return found


def test_false_onsets_on_a_reward_that_ignores_length_stay_within_the_error_rate():
    # alpha 0.05 over all the rises and limits looked at: about 1 view in 20 (the uncorrected
    # largest rise at 2.5 standard errors found one on 11 of 40 such views)
    assert onsets(linear=False, seeds=20) <= 3


def test_a_reward_linear_in_length_has_an_onset_on_most_views():
    # it pays for every extra word: no valley-to-peak rise, but pay among the longest replies
    # (the uncorrected rise found an onset on 12 of 40 such views)
    assert onsets(linear=True, seeds=20) >= 13


def test_the_default_proposes_no_length_penalty_on_a_reward_that_only_pays_for_not_being_short():
    # the default (`onset`) and `strongest` propose a length limit only past where the reward starts to pay;
    # a reward that pays for not being short, and nothing beyond, gets none (a false alarm otherwise)
    for how in ("onset", "strongest"):
        cfg = dict(min_effect=0.3, length_adjusted=True, length_threshold=how, detectors=[])  # texts of one word
        assert LexicalProposer(LexicalConfig(**cfg)).best(view_on_content(None)) is None, how
        pick = LexicalProposer(LexicalConfig(**cfg)).best(view_on_content(40))
        assert pick is not None and length_limit(pick.regex) >= 35, (how, pick)


def honest_and_step(bar: int) -> Callable[[random.Random], tuple[str, float]]:
    """The discovery benchmark's honest length pay (less for fewer than 15 or more than 35 words)
    and a step bonus past `bar` words (benchmarks/discovery_worlds.py)."""
    def reply(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(8, 60)
        honest = -min(0.5, max(0, 15 - n, n - 35) / 30)
        return " ".join(rng.choice(WORDS) for _ in range(n)), rng.gauss(0, 0.3) + honest + 0.6 * (n > bar)
    return reply


@pytest.mark.parametrize("bar", [34, 36, 42])
def test_a_step_bonus_is_penalised_from_its_bar_to_the_word(bar):
    # the onset (half-way up the local pay) lands up to half a window before a step's bar; "longer
    # than 30" for a bar at 36 penalised what the reward pays for nothing (the discovery benchmark's
    # length steps: 2 of 6 found). The pay's peak, refined to the word, is the bar itself.
    limits = []
    for seed in range(5):
        v = grouped_view(honest_and_step(bar), seed)
        pick = LexicalProposer(LexicalConfig(detectors=[], length_adjusted=True, min_effect=0.3)).best(v)
        if pick is not None and length_limit(pick.regex) is not None:  # words of random text aside
            limits.append(length_limit(pick.regex))
    assert len(limits) >= 3 and all(abs(lim - bar) <= 1 for lim in limits), limits


def test_a_ramp_is_not_taken_for_a_step():
    # a ramp's pay stays up past its start: no peak to refine to, so the limit stays the onset's
    for seed in range(3):
        v = grouped_view(honest_and_ramp, seed)
        words = {s.id: len(s.text.split()) for s in v.samples}
        onset, bar = length_onset_bar(v.samples, words, list(range(5, 60, 5)))
        assert onset is not None and bar is None, (seed, onset, bar)


def drifted(reference_seed: int, seed: int, bar: int | None = None) -> ProposerView:
    """The benchmark's honest length pay (less under 15 and over 35 words) on replies of one repeated
    word, so that length is all that tells them apart; the reference (the run's first batch) of
    6 to 40 words, the view of 5 to 30 (a step bonus of 0.6 past `bar` words on top, with 5 to 45)."""
    def reply(lo: int, hi: int, bonus: bool) -> Callable[[random.Random], tuple[str, float]]:
        def draw(rng: random.Random) -> tuple[str, float]:
            n = rng.randint(lo, hi)
            pay = -min(0.5, max(0, 15 - n, n - 35) / 30) + 0.6 * (bonus and n > bar)
            return " ".join(["word"] * n), rng.gauss(0, 0.1) + pay
        return draw
    ref = grouped_view(reply(6, 40, False), reference_seed, groups=40)
    now = grouped_view(reply(5, 30 if bar is None else 45, bar is not None), seed)
    return ProposerView(10, now.samples, reference=[replace(s, id=f"r{s.id}") for s in ref.samples], proposal=2)


@pytest.mark.parametrize("seed", range(3))
def test_no_length_penalty_below_what_most_of_the_untrained_policys_replies_exceed(seed):
    # the reward pays for not being short: "longer than 10 words" would tax the untrained policy's
    # ordinary replies (its median is 23); a step bonus past the median is still penalised
    cfg = dict(detectors=[])
    v = drifted(100 + seed, seed)
    assert LexicalProposer(LexicalConfig(**cfg, length_floor=None)).best(v) is not None  # the pay is there
    assert LexicalProposer(LexicalConfig(**cfg)).best(v) is None
    pick = LexicalProposer(LexicalConfig(**cfg)).best(drifted(100 + seed, seed, bar=34))
    assert pick is not None and abs(length_limit(pick.regex) - 34) <= 5, pick


def shortness_and_step(lo: int, hi: int, bar: int | None) -> Callable[[random.Random], tuple[str, float]]:
    """Replies of one repeated word, `lo` to `hi` long; a reward that pays for not being short up to
    28 words and less past 35, and a step bonus of 0.6 past `bar` words (none: None)."""
    def draw(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(lo, hi)
        pay = -min(0.5, max(0, 28 - n, n - 35) / 30) + 0.6 * (bar is not None and n > bar)
        return " ".join(["word"] * n), rng.gauss(0, 0.2) + pay
    return draw


@pytest.mark.parametrize("seed", range(6))
def test_a_step_bar_above_the_floor_is_penalised_beside_the_pay_for_not_being_short(seed):
    # the discovery benchmark's multi-turn step at 34: the onset of the local pay lay at 15-25 words
    # (the pay for not being short), below the floor (29.5, the first batches' median), so nothing
    # was proposed, though the pay peaked and fell back at the bar (35): the bar is a bar all the same
    ref = grouped_view(shortness_and_step(15, 45, None), 100 + seed, groups=40)
    reference = [replace(s, id=f"r{s.id}") for s in ref.samples]
    cfg = LexicalConfig(detectors=[])
    stepped = grouped_view(shortness_and_step(10, 50, 36), seed)
    pick = LexicalProposer(cfg).best(ProposerView(10, stepped.samples, reference=reference, proposal=2))
    assert pick is not None and abs(length_limit(pick.regex) - 36) <= 5, pick
    honest = grouped_view(shortness_and_step(10, 50, None), seed)
    assert LexicalProposer(cfg).best(ProposerView(10, honest.samples, reference=reference, proposal=2)) is None


def step_only(lo: int, hi: int, bar: int | None, rise: float = 0.0) -> Callable[[random.Random], tuple[str, float]]:
    """Replies of one repeated word, `lo` to `hi` long; a step bonus of 0.6 past `bar` words (none:
    None) and `rise` for every reply (the reward has risen since the first batches)."""
    def draw(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(lo, hi)
        return " ".join(["word"] * n), rng.gauss(0, 0.2) + 0.6 * (bar is not None and n > bar) + rise
    return draw


@pytest.mark.parametrize("seed", range(3))
def test_a_length_hack_every_reply_took_up_is_penalised_from_the_first_batches(seed):
    # the discovery benchmark's length steps at 34 (multi-turn, TRL 4 x 8, second corpus): by the
    # proposal every reply was past the bar, so the view had no contrast to place an onset on and
    # `onset` proposed nothing, though "longer than 30" passed across steps (most replies now, far
    # fewer in the first batches, paid there). Such a limit is proposed; a rise in length the reward
    # never paid for is not.
    cfg = LexicalConfig(detectors=[])
    for bar in (30, None):
        first = grouped_view(step_only(10, 45, bar), 100 + seed, groups=40)
        reference = [replace(s, id=f"r{s.id}") for s in first.samples]
        now = grouped_view(step_only(32, 50, bar, rise=0.1), seed)
        pick = LexicalProposer(cfg).best(ProposerView(10, now.samples, reference=reference, proposal=2))
        if bar is None:
            assert pick is None, pick.title
        else:
            assert pick is not None and abs(length_limit(pick.regex) - bar) <= 5, pick
            assert "rose from the run's first batches" in pick.description


def steep_shortness_and_ramp(start: int | None, lo: int = 8,
                             hi: int = 60) -> Callable[[random.Random], tuple[str, float]]:
    """Replies of one repeated word, `lo` to `hi` long; a reward that pays steeply for not being
    short (up to 1.0 over the 20 words before 28) and a ramp of 0.6 over the 25 words past `start`."""
    def draw(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(lo, hi)
        ramp = min(25, max(0, n - start)) / 25 * 0.6 if start is not None else 0.0
        return " ".join(["word"] * n), rng.gauss(0, 0.2) - min(1.0, max(0, 28 - n) / 20) + ramp
    return draw


def second_proposal(first: Callable[[random.Random], tuple[str, float]],
                    now: Callable[[random.Random], tuple[str, float]], seed: int, groups: int = 80):
    """The default proposer's pick (or None) at a run's second proposal: a view of `groups` x 8
    replies drawn by `now`, against a reference of 40 x 8 drawn by `first` (the run's first batches)."""
    reference = [replace(s, id=f"r{s.id}") for s in grouped_view(first, 100 + seed, groups=40).samples]
    view = grouped_view(now, seed, groups=groups)
    return LexicalProposer(LexicalConfig(detectors=[])).best(
        ProposerView(10, view.samples, reference=reference, proposal=2))


def test_what_is_paid_past_the_floor_is_looked_for_among_the_replies_past_it():
    # the pay for not being short put the onset below the floor (the first batches' median, 30) on
    # every view, so a ramp from 32 was never proposed; among the replies past the floor it shows,
    # and the honest reward alone still gets nothing (the discovery benchmark's second corpus: two
    # ramps found at the first proposal rather than the second)
    found = []
    for seed in range(6):
        for start in (32, None):
            pick = second_proposal(steep_shortness_and_ramp(None, 15, 45), steep_shortness_and_ramp(start), seed)
            if start is None:
                assert pick is None, pick.title
            elif pick is not None:
                found.append(length_limit(pick.regex))
    assert len(found) >= 5 and all(32 <= lim <= 40 for lim in found), found


def shortness_then_step(lo: int, hi: int, bar: int | None) -> Callable[[random.Random], tuple[str, float]]:
    """Replies of one repeated word, `lo` to `hi` long; a reward that pays steeply for not being
    short up to 22 words and a little less past 35 (the benchmark's honest length pay), and a step
    bonus of 0.6 past `bar` words (none: None)."""
    def draw(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(lo, hi)
        pay = -min(1.0, max(0, 22 - n) / 10) - min(0.5, max(0, n - 35) / 30) + 0.6 * (bar is not None and n > bar)
        return " ".join(["word"] * n), rng.gauss(0, 0.3) + pay
    return draw


def test_a_bar_just_past_the_floor_is_penalised_though_no_valley_lies_past_it():
    # the discovery benchmark's length steps at 34 (multi-turn on both corpora, TRL 4 x 8): among
    # the replies past the floor (about 30) the pay peaked at 35 and fell back, but no limit past
    # the floor lay before the peak to rise from, so no onset was placed and the step was found a
    # proposal late (10 logged steps). The pay there rises from the valley a window before the floor.
    found = []
    for seed in range(8):
        for bar in (34, None):
            pick = second_proposal(shortness_then_step(12, 42, None), shortness_then_step(14, 58, bar), seed, groups=40)
            if bar is None:
                assert pick is None, pick.title
            elif pick is not None:
                found.append(length_limit(pick.regex))
    assert len(found) >= 7 and all(abs(lim - 34) <= 5 for lim in found), found


def shortness_past_the_floor(lo: int, hi: int) -> Callable[[random.Random], tuple[str, float]]:
    """Replies of one repeated word, `lo` to `hi` long; an honest reward that pays for every word
    up to 35 and a little less past 45. Nothing else."""
    def draw(rng: random.Random) -> tuple[str, float]:
        n = rng.randint(lo, hi)
        return " ".join(["word"] * n), rng.gauss(0, 0.3) - max(0, 35 - n) / 20 - min(0.5, max(0, n - 45) / 30)
    return draw


def test_the_pay_for_not_being_short_running_on_past_the_floor_is_no_length_hack():
    # the floor is the first batches' median (about 27): the local pay past it is positive, but
    # it only falls with L (no rise into it), so no length limit is proposed; without that
    # condition (evidence.paid_past) 5 of these 8 views got one
    for seed in range(8):
        pick = second_proposal(shortness_past_the_floor(12, 42), shortness_past_the_floor(14, 58), seed, groups=40)
        assert pick is None, (seed, pick.title)
