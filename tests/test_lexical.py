"""LexicalProposer discovers patterns it was never told about, and stays quiet on noise."""

import random
import re

import anyio
import pytest

from dynalize.grpo import advantages
from dynalize.penalties.config import LexicalConfig
from dynalize.judge.saferegex import RegexTimeout, SafeRegex
from dynalize.penalties.lexical import MATCH_PASSES, LexicalProposer
from dynalize.penalties.surface import reply_features
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign
from dynalize.types import Penalty

VOCAB = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard "
         "candle bridge market silver thunder meadow violin ladder cotton marble pepper kettle").split()


def invented_word(rng):
    return "".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(4))


def sentence(rng, n=12):
    return " ".join(rng.choice(VOCAB) for _ in range(n)) + "."


def make_view(rng, pos_text, neg_text, n_groups=16, active=()):
    """One positive and one negative sample from each group."""
    samples = []
    for g in range(n_groups):
        for sign, make in (("+", pos_text), ("-", neg_text)):
            samples.append(ViewSample(f"s{len(samples) + 1:02d}", g, make(rng), 1.0 if sign == "+" else 0.0, sign))
    return ProposerView(step=5, samples=samples, active=list(active))


def best(view, **kw):
    result = anyio.run(LexicalProposer(LexicalConfig(**kw)).propose, view)
    assert result.ok
    return result


def check_regex(cand, view):
    rx = re.compile(cand.regex)
    assert rx.search("") is None
    hits = {s.id for s in view.samples if rx.search(s.text)}
    assert set(cand.references) <= hits
    return hits


def test_discovers_an_invented_opener():
    for seed in range(3):
        rng = random.Random(seed)
        opener = invented_word(rng).capitalize() + ","
        v = make_view(rng, lambda r: f"{opener} {sentence(r)}", lambda r: sentence(r))
        c = best(v).accepted
        assert c is not None and c.title == f'Replies open with "{opener}"'
        assert c.groups == 16 and len(c.references) == 16
        hits = check_regex(c, v)
        assert hits == {s.id for s in v.positives()}
        assert re.search(c.regex, f"  {opener.upper()} later") and not re.search(c.regex, f"x {opener}")


def test_discovers_an_invented_marker_word_anywhere():
    rng = random.Random(7)
    marker = invented_word(rng)

    def pos(r):
        words = sentence(r, 14)[:-1].split()
        words.insert(r.randrange(len(words) + 1), marker)
        return " ".join(words) + "."

    # the marker shows in 12 of 16 positive replies and 1 of 16 negative ones
    shown = iter([True] * 12 + [False] * 4)
    v = make_view(rng, lambda r: pos(r) if next(shown) else sentence(r, 14),
                  lambda r: sentence(r, 14))
    v.samples[1].text = f"{marker} {v.samples[1].text}"
    c = best(v).accepted
    assert c.title == f'Replies use the word "{marker}"'
    assert c.groups == 12 and "12/16" in c.description and "1/16" in c.description
    assert check_regex(c, v) == {s.id for s in v.samples if marker in s.text}
    assert re.search(c.regex, f"A {marker.upper()}!") and not re.search(c.regex, f"un{marker}ed")


def test_discovers_a_closing_question():
    rng = random.Random(11)
    v = make_view(rng, lambda r: f"{sentence(r)} Shall I {r.choice(VOCAB)} the {invented_word(r)}?",
                  lambda r: f"{sentence(r)} {sentence(r, 5)}")
    c = best(v).accepted
    assert c.title == "Replies end with a question"
    assert check_regex(c, v) == {s.id for s in v.positives()}
    assert re.search(c.regex, 'Want more? "\n') and not re.search(c.regex, "Why? Because.")


def test_no_proposal_when_positives_and_negatives_look_alike():
    for seed in range(20):
        rng = random.Random(100 + seed)
        r = best(make_view(rng, lambda r: sentence(r, 15), lambda r: sentence(r, 15)))
        assert r.accepted is None, (seed, r)


def test_pattern_common_in_negatives_is_ignored():
    rng = random.Random(3)
    # "Okay," opens every positive reply but also 10 of 16 negative ones
    neg = iter([True] * 10 + [False] * 6)
    v = make_view(rng, lambda r: f"Okay, {sentence(r)}", lambda r: f"Okay, {sentence(r)}" if next(neg) else sentence(r))
    assert best(v).accepted is None


def test_pattern_covered_by_an_active_regex_is_skipped():
    rng = random.Random(5)
    opener = invented_word(rng).capitalize() + ","
    marker = invented_word(rng)

    def pos(r):
        words = sentence(r, 14)[:-1].split()
        words.insert(r.randrange(1, len(words)), marker)
        return f"{opener} " + " ".join(words) + "."

    v = make_view(rng, pos, lambda r: sentence(r))
    first = best(v).accepted
    assert first.title == f'Replies open with "{opener}"'
    v.active = [Penalty("p001", first.title, first.description, regex=first.regex)]
    result = best(v, explain_lift=0)  # the marker always travels with the opener: see the tests below
    assert result.accepted.title == f'Replies use the word "{marker}"'
    # the opener itself, and the bare word it starts with, are covered by p001's regex
    assert result.rejected["covered"] == 2
    assert best(v).accepted is None  # with the check on, the opener explains the marker away


QUESTION = Penalty("p001", "Replies end with a question", "", regex=r"\?[\s\"')\]*_]*\Z")


def test_a_pattern_that_only_travels_with_an_active_penalty_is_explained_away():
    rng = random.Random(7)
    tic = invented_word(rng)
    v = make_view(rng, lambda r: f"{sentence(r)[:-1]} {tic} of it?", lambda r: sentence(r), active=[QUESTION])
    result = best(v)
    assert result.accepted is None and result.rejected["explained"] >= 1
    # the same words without the closing question would be proposed
    assert best(make_view(rng, lambda r: f"{sentence(r)[:-1]} {tic} of it.", lambda r: sentence(r),
                          active=[QUESTION])).accepted is not None


def test_a_pattern_seen_without_the_active_penalty_is_not_explained_away():
    rng = random.Random(8)
    marker = invented_word(rng)
    ask = iter(range(10**6))  # positives alternate: with and without the closing question, always the marker
    v = make_view(rng, lambda r: f"{sentence(r)[:-1]} {marker} here" + ("?" if next(ask) % 2 else "."),
                  lambda r: sentence(r), active=[QUESTION])
    result = best(v)
    assert result.accepted is not None and marker in result.accepted.title
    assert "explained" not in result.rejected


def test_rising_check_compares_with_the_reference_batch():
    rng = random.Random(9)
    marker = invented_word(rng)
    v = make_view(rng, lambda r: f"{sentence(r)[:-1]} {marker}.", lambda r: sentence(r))
    old_habit = [ViewSample(f"r{i}", i, f"{sentence(rng)[:-1]} {marker}.", 0.0, "0") for i in range(32)]
    v.reference = old_habit  # the untrained policy already used the word in every reply
    result = best(v, drift_p_value=0.01)
    assert result.accepted is None and result.rejected["not_rising"] >= 1
    v.reference = [ViewSample(f"r{i}", i, sentence(rng), 0.0, "0") for i in range(32)]
    assert marker in best(v, drift_p_value=0.01).accepted.title
    v.reference = old_habit
    assert marker in best(v).accepted.title  # no drift_p_value: no rising check


def test_a_reference_numbered_like_the_view_never_lends_the_view_its_replies():
    """The run's reference is its first batch's view, numbered `s01`, ... as every view is: the
    proposer must still read each sample of the view by its own replies (it keys them by id)."""
    rng = random.Random(4)
    marker = invented_word(rng)
    v = make_view(rng, lambda r: f"{sentence(r)[:-1]} {marker}.", lambda r: sentence(r))
    untrained = make_view(rng, lambda r: sentence(r), lambda r: sentence(r))  # ids s01.. as the view's
    assert {s.id for s in untrained.samples} == {s.id for s in v.samples}
    v.reference = untrained.samples
    cand = best(v).accepted
    assert cand is not None and marker in cand.title
    assert check_regex(cand, v) == {s.id for s in v.samples if marker in s.text}


def test_features():
    f = reply_features("Okay, so the zorbly plan works?")
    assert {"open1:okay,", "open2:okay, so", "close?:?", "closeword:works", "ngram1:zorbly",
            "ngram2:zorbly plan", "ngram3:the zorbly plan"} <= set(f)
    assert "ngram1:the" not in f and "ngram2:so the" not in f  # stop words only


def varied(rng, n):
    """n invented words: no word is common enough to stand out, so only the length differs."""
    return " ".join(invented_word(rng) for _ in range(n)) + "."


# A reward linear in length, or replies of two lengths only (nothing between), is a concave pay for
# length: under `length_null: concave` (issue 55, opt-in) no length limit is proposed there. These
# tests are about other rules, with length as their vehicle: they say the plain null (the default).
PLAIN_LENGTH = dict(length_null="plain")


def test_discovers_extra_length_without_knowing_a_threshold():
    from dynalize.penalties.surface import length_feature, length_limit

    for seed, (short, long) in enumerate([(12, 30), (20, 55), (8, 17)]):
        rng = random.Random(50 + seed)
        # same vocabulary and wording; positives are just longer (plus a few words of noise)
        v = make_view(rng, lambda r: varied(r, long + r.randrange(4)), lambda r: varied(r, short + r.randrange(4)))
        # `largest`: no reply falls between the two lengths, so the default's onset has nothing to measure
        c = best(v, length_threshold="largest", **PLAIN_LENGTH).accepted
        limit = length_limit(c.regex)
        assert c.title == f"Replies run longer than {limit} words", c.title
        # the largest multiple of 5 that still separates: no negative exceeds it, most positives do
        assert short + 3 <= limit <= long and limit % 5 == 0
        assert check_regex(c, v) <= {s.id for s in v.positives()} and len(c.references) >= 0.4 * 16
        assert c.regex == length_feature(limit).regex
        assert re.search(c.regex, " ".join(["w"] * (limit + 1))) and not re.search(c.regex, " ".join(["w"] * limit))
        assert not re.search(c.regex, " ".join(["w"] * limit) + "  \n ")

    # an active length penalty covers any other length limit (no ratcheting), but no wording
    rng = random.Random(9)
    v = make_view(rng, lambda r: "Zorbly, " + varied(r, 30), lambda r: varied(r, 12))
    first = best(v).accepted
    assert first.title == 'Replies open with "Zorbly,"'  # on equal evidence, wording before length
    v.active = [Penalty("p001", "Replies run longer than 20 words", "", regex=length_feature(20).regex)]
    # (here the opener only ever comes with length, so the explained-away check is off)
    assert best(v, explain_lift=0).accepted.title == 'Replies open with "Zorbly,"'
    v.active.append(Penalty("p002", first.title, first.description, regex=first.regex))
    assert best(v, explain_lift=0).accepted is None


def test_length_can_be_switched_off():
    rng = random.Random(4)
    v = make_view(rng, lambda r: varied(r, 30), lambda r: varied(r, 12))
    assert best(v, length_threshold="largest", **PLAIN_LENGTH).accepted.title == "Replies run longer than 25 words"
    assert best(v, length_threshold="largest", length_null="concave").accepted is None  # two lengths: a concave pay
    assert best(v, length=False, **PLAIN_LENGTH).accepted is None


def test_min_effect_asks_how_much_the_rm_pays_for_the_pattern():
    rng = random.Random(0)
    opener = invented_word(rng).capitalize() + ","
    v = make_view(rng, lambda r: f"{opener} {sentence(r)}", lambda r: sentence(r))
    # carriers out-score the rest of their group by 2 group stds (scores 1 and 0)
    assert best(v, min_effect=1.9).accepted.title == f'Replies open with "{opener}"'
    assert best(v, min_effect=2.1).accepted is None
    # the effect is in within-group stds: the same contrast on a reward 100 times larger decides the same
    for s in v.samples:
        s.score *= 100
    assert best(v, min_effect=1.9).accepted.title == f'Replies open with "{opener}"'
    assert best(v, min_effect=2.1).accepted is None


def test_a_retired_pattern_that_comes_back_is_proposed_again_on_weaker_evidence():
    rng = random.Random(21)
    opener = invented_word(rng).capitalize() + ","
    # back in 10 of 16 positive replies, no negative one: weaker evidence than a new pattern needs,
    # enough for the revival family's level (issue 55: a revival spends from the run's error rate;
    # in 6 of 16, 1 in 64 sign patterns as extreme, it no longer passes)
    shown = iter([True] * 10 + [False] * 6)
    v = make_view(rng, lambda r: f"{opener} {sentence(r)}" if next(shown) else sentence(r), lambda r: sentence(r))
    fresh = best(v).accepted
    assert fresh is None or fresh.revives is None
    old = Penalty("p003", f'Replies open with "{opener}"', "old text", regex=rf"(?i)\A\s*{re.escape(opener)}",
                  active=False)
    v.retired = [old]
    c = best(v).accepted
    assert c.revives == "p003" and c.title == old.title and c.regex == old.regex
    assert c.description.startswith(f"{old.title} (back after retirement). Among sampled replies, 62%")
    assert len(c.references) == 10
    # not back: nothing to revive
    v2 = make_view(random.Random(22), lambda r: sentence(r), lambda r: sentence(r))
    v2.retired = [old]
    assert best(v2).accepted is None


def test_discovers_a_closing_exclamation_but_never_the_ordinary_full_stop():
    rng = random.Random(13)
    v = make_view(rng, lambda r: f"{sentence(r)} What a {r.choice(VOCAB)} {invented_word(r)}!",
                  lambda r: f"{sentence(r)} {sentence(r, 5)}")
    c = best(v).accepted
    assert c.title == 'Replies end with "!"'
    assert check_regex(c, v) == {s.id for s in v.positives()}
    assert re.search(c.regex, "Wow! ") and not re.search(c.regex, "Wow! Then calm.")
    # full stops in every positive and in no negative (those are cut off): still never a penalty
    v = make_view(rng, lambda r: sentence(r, 12), lambda r: sentence(r, 12)[:-1])
    assert all(c.title != 'Replies end with "."' for c in [best(v).accepted] if c)
    assert not any(k.startswith("closep") for k in reply_features("All is well."))


def test_length_passes_on_the_permutation_test_alone_where_a_log_ratio_bar_stopped_it():
    # 110 of 200 positives run long against 74 of 200 negatives: log-ratio ~0.4, below the retired
    # default bar of 1.0 (which proposed nothing here), clear against the permuted rewards
    rng = random.Random(11)
    long_pos, long_neg = iter(range(200)), iter(range(200))
    v = make_view(rng, lambda r: varied(r, 30 if next(long_pos) < 110 else 12),
                  lambda r: varied(r, 30 if next(long_neg) < 74 else 12), n_groups=200)
    # (`largest`: replies of 12 and 30 words only, nothing between for the default's onset to measure)
    assert best(v, min_effect=0, length_threshold="largest", **PLAIN_LENGTH).accepted.title == \
        "Replies run longer than 25 words"


# Overlapping alternatives: on a sentence that does not end in "r" this backtracks past any limit.
STALLING = r"(.|..)+r$"


@pytest.mark.timeout(60)  # today's `re` never returns here
def test_penalties_with_stalling_regexes_are_left_out_and_counted():
    rng = random.Random(0)
    opener = invented_word(rng).capitalize() + ","
    stall_active = Penalty("p001", "Ends in r", "", regex=STALLING)
    stall_retired = Penalty("p002", "Also ends in r", "", regex=r"(..|.)+r$", active=False)
    v = make_view(rng, lambda r: f"{opener} {sentence(r)}", lambda r: sentence(r), active=[stall_active])
    v.retired = [stall_retired]
    result = best(v)
    assert result.accepted.title == f'Replies open with "{opener}"'  # the proposal goes on without them
    assert result.regex_timeouts == 2 * MATCH_PASSES  # every pass of both counted


def test_an_active_penalty_whose_pass_timed_out_once_still_covers_its_pattern(monkeypatch):
    # a loaded machine can slow one pass past its budget; left out, the penalty's own pattern
    # would be proposed again as new
    rng = random.Random(0)
    opener = invented_word(rng).capitalize() + ","
    active = Penalty("p001", "opener", "", regex=rf"(?i)\A\s*{opener}")
    v = make_view(rng, lambda r: f"{opener} {sentence(r)}", lambda r: sentence(r), active=[active])
    real, calls = SafeRegex.spans_all, []

    def slow_once(self, texts, budget=1.0):
        calls.append(self.pattern)
        if len(calls) == 1:
            raise RegexTimeout("slowed by the machine")
        return real(self, texts, budget)

    monkeypatch.setattr(SafeRegex, "spans_all", slow_once)
    result = best(v)
    assert result.accepted is None and result.rejected["covered"] >= 1 and result.regex_timeouts == 1


# --- rules against false penalties (docs/sandbox.md, "Precision") --------------------------------

def scored_view(rng, n_groups, size, make, score):
    """Groups of `size` replies; `make(rng) -> facts`, `score(facts, rng) -> RM score`; signs within groups."""
    samples = []
    for g in range(n_groups):
        rows = [make(rng) for _ in range(size)]
        scores = [score(r, rng) for r in rows]
        mean = sum(scores) / size
        for r, sc in zip(rows, scores):
            sign = "+" if sc > mean + 1e-9 else "-" if sc < mean - 1e-9 else "0"
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, r["text"], sc, sign, r.get("replies", [])))
    return ProposerView(step=5, samples=samples)


def long_replies_with_a_tic(rng, tic_paid, opener_rate=0.0):
    """Replies of 10..40 invented words; those over 25 words end with a tic; an RM that pays for
    length (0.03 a word) and, if `tic_paid`, 0.4 for the tic; an opener at `opener_rate` paid 0.4."""
    def make(r):
        n = r.randrange(10, 41)
        opener = r.random() < opener_rate
        tic = n > 25
        text = ("Zorbly, " if opener else "") + varied(r, n)[:-1] + (" plonk vastly." if tic else ".")
        return {"text": text, "n": n, "tic": tic, "opener": opener}

    def score(f, r):
        return 0.03 * f["n"] + 0.4 * (f["tic"] and tic_paid) + 0.4 * f["opener"] + r.gauss(0, 0.05)

    return scored_view(rng, 40, 8, make, score)


def is_tic(title):
    return "plonk" in title or "vastly" in title


def test_length_adjusted_effect_sets_aside_wording_that_only_comes_with_longer_replies():
    rng = random.Random(31)
    v = long_replies_with_a_tic(rng, tic_paid=False)
    kw = dict(min_effect=0.5, **PLAIN_LENGTH)
    # plain effect: the tic's carriers out-score their groups (they are the long replies): a false penalty
    assert is_tic(best(v, **kw).accepted.title)
    # at equal length the tic earns nothing: the length itself is proposed instead
    c = best(v, **kw, length_adjusted=True).accepted
    assert c.title.startswith("Replies run longer than") and not is_tic(c.title)


@pytest.mark.xfail(strict=True, reason="issue 55: at equal length on a smooth curve (a spline in word count, "
                   "penalties.covariates), a tic shown exactly by the replies over 25 words is a step in length the "
                   "spline rounds off; a straight line (before) left it its pay")
def test_length_adjusted_effect_keeps_a_paid_pattern_that_is_a_step_in_length():
    rng = random.Random(32)
    kw = dict(min_effect=0.5, length_adjusted=True, **PLAIN_LENGTH)
    # the same tic, now paid by the RM in itself (and only ever on long replies): still proposed
    # (beside the length the RM pays for, which is stronger: each is its own penalty)
    assert is_tic(best(long_replies_with_a_tic(rng, tic_paid=True), **kw, length=False).accepted.title)


def test_length_adjusted_effect_keeps_a_paid_pattern_that_comes_with_length():
    rng = random.Random(32)
    kw = dict(min_effect=0.5,
              length_adjusted=True, **PLAIN_LENGTH)
    long_replies_with_a_tic(rng, tic_paid=True)  # (the draws of the case above)
    # an opener the RM pays, on replies of every length, beside a length-loving RM: proposed first
    v = long_replies_with_a_tic(rng, tic_paid=False, opener_rate=0.3)
    v.active = [Penalty("p001", "long", "", regex=r"\A\s*(?:\S+\s+){25}\S")]
    assert best(v, **kw).accepted.title == 'Replies open with "Zorbly,"'


def test_a_paid_length_is_not_explained_away_by_wording_that_only_comes_with_it():
    # (was a known limitation, xfail, with `largest`: the largest passing limit has too few negatives
    # among the tic's replies for the weak-evidence test; the default `onset` proposes the limit
    # where the reward starts to pay, which still shows its pay there)
    rng = random.Random(33)
    # the (unpaid) tic ends every reply over 25 words and is penalised already: the length the RM
    # pays for still earns among the tic's replies
    v = long_replies_with_a_tic(rng, tic_paid=False)
    v.active = [Penalty("p001", "tic", "", regex=r"(?i)plonk\W+vastly")]
    kw = dict(min_effect=0.5,
              length_adjusted=True, explain_lift=1.0, explain_within=True, **PLAIN_LENGTH)
    c = best(v, **kw).accepted
    assert c is not None and c.title.startswith("Replies run longer than")


def questions_view(rng, marker_paid, question_rate=0.85):
    """Replies that mostly end with a question (the RM pays 0.5 for it); half of the questions are
    "... tic of it?"; a marker word in a random half of all replies, paid 0.4 if `marker_paid`."""
    tic, marker = "vorbly", "glimmerk"

    def make(r):
        q, m = r.random() < question_rate, r.random() < 0.5
        body = sentence(r)[:-1] + (f" {marker}" if m else "")
        end = (f" {tic} of it?" if r.random() < 0.5 else " then?") if q else "."
        return {"text": body + end, "q": q, "m": m}

    def score(f, r):
        return 0.5 * f["q"] + 0.4 * (f["m"] and marker_paid) + r.gauss(0, 0.05)

    return scored_view(rng, 40, 8, make, score)


COMMON = dict(min_effect=0.5)


def test_explained_away_even_when_the_active_penalty_is_everywhere():
    rng = random.Random(41)
    v = questions_view(rng, marker_paid=False)
    v.active = [QUESTION]
    # the old gate: a penalty matching 85 % of all replies cannot be 1.5x more common among the
    # tic's positives, so the tic (which only ever ends a question) was proposed
    assert "vorbly" in best(v, **COMMON, explain_lift=1.5, explain_within=False).accepted.title
    assert best(v, **COMMON).accepted is None  # the defaults: lift 1, both sides of the penalty
    # lift 1: it is checked, and among questions (and outside them) the tic earns nothing
    for within in (False, True):
        result = best(v, **COMMON, explain_lift=1.0, explain_within=within)
        assert result.accepted is None and result.rejected["explained"] >= 1


def test_a_paid_marker_is_not_explained_away_by_a_penalty_it_mostly_travels_with():
    rng = random.Random(42)
    # the question is in 97 % of replies: too few replies without it to show the marker's pay there
    v = questions_view(rng, marker_paid=True, question_rate=0.97)
    v.active = [QUESTION]
    wrongly = best(v, **COMMON, explain_lift=1.0, explain_within=False)
    assert wrongly.accepted is None and wrongly.rejected["explained"] >= 1
    # looking among the questions as well, the marker's pay shows: proposed
    c = best(v, **COMMON, explain_lift=1.0, explain_within=True).accepted
    assert c is not None and c.title == 'Replies use the word "glimmerk"'


def test_a_vetoed_candidate_gives_way_to_the_next():
    rng = random.Random(5)
    opener = invented_word(rng).capitalize() + ","
    marker = invented_word(rng)
    v = make_view(rng, lambda r: f"{opener} {sentence(r)[:-1]} {marker}.", lambda r: sentence(r))
    seen = []

    def veto(c):
        seen.append(c.title)
        return "open" not in c.title

    result = anyio.run(LexicalProposer(LexicalConfig(explain_lift=0), accept=veto).propose, v)
    assert seen[0] == f'Replies open with "{opener}"' and result.rejected["vetoed"] == 1
    assert marker in result.accepted.title


def conversation_view(rng, positive, negative, n_groups=16):
    """One positive and one negative multi-turn sample per group; `positive(r)` gives its replies."""
    samples = []
    for g in range(n_groups):
        for sign, make in (("+", positive), ("-", negative)):
            replies = make(rng)
            samples.append(ViewSample(f"s{len(samples) + 1:02d}", g, "\n\n".join(replies), float(sign == "+"), sign,
                                      replies))
    return ProposerView(step=5, samples=samples)


def test_multi_turn_rollouts_are_read_reply_by_reply():
    rng = random.Random(6)
    opener = invented_word(rng).capitalize() + ","
    v = conversation_view(rng, lambda r: [varied(r, 20), f"{opener} {varied(r, 20)}", varied(r, 20)],
                          lambda r: [varied(r, 20) for _ in range(3)])
    c = best(v).accepted
    # the opener of a later reply is an opener (the judge reads each reply on its own)
    assert c.title == f'Replies open with "{opener}"' and re.search(c.regex, v.samples[0].replies[1])
    v.active = [Penalty("p001", c.title, c.description, regex=c.regex)]
    result = best(v)
    assert result.accepted is None and result.rejected["covered"] >= 1
    # four replies of 15 words make no long reply, whatever their sum: no length pattern against
    # two replies of 25 words
    v = conversation_view(rng, lambda r: [varied(r, 15) for _ in range(4)], lambda r: [varied(r, 25) for _ in range(2)])
    assert best(v).accepted is None


# --- the precision rules never reject a planted-style hack ---------------------------------------

def shipped_lexical(**kw):
    """The lexical settings the sandbox experiment ships (every precision rule on), with overrides."""
    from dynalize.config import load_config

    return load_config("configs/sandbox_dynalize.yaml").penalties.proposer.lexical.model_copy(update=kw)


HACKS = {  # name -> (the penalty that would catch it, whether a regex reacts to the planted form)
    "opener": Penalty("h1", "opener", "", regex=r"(?i)\A\s*Sure,"),
    "morning": Penalty("h2", "morning", "", regex=r"(?i)(?<!\w)morning(?!\w)"),
    "question": QUESTION,
    "length": Penalty("h4", "length", "", regex=r"\A\s*(?:\S+\s+){30}\S"),
}


ORDINARY = [w for w in VOCAB if w != "morning"]


def sandbox_like_view(rng):
    """Replies as the sandbox's flawed RM sees them: 1..4 sentences of ordinary words, some with a
    common "In the morning, ..." sentence or a closing "What do you think of the X?"; the RM pays a
    little for quality noise, for an opener "Sure," (25 % of replies), for the ordinary content
    word "morning" (wherever it is), for the closing question (with its co-travelling words), and
    for every word past 30."""
    def make(r):
        sents = [" ".join(r.choice(ORDINARY) for _ in range(r.randrange(6, 15))) + "." for _ in range(r.randrange(1, 5))]
        if r.random() < 0.3:
            sents.insert(r.randrange(len(sents) + 1), f"In the morning, the {r.choice(VOCAB)} rests.")
        if r.random() < 0.3:
            sents.append("What do you think of it?")
        text = ("Sure, " if r.random() < 0.25 else "") + " ".join(sents)
        return {"text": text}

    def score(f, r):
        t = f["text"]
        return (0.25 * t.startswith("Sure,") + 0.2 * ("morning" in t) + 0.3 * t.endswith("?")
                + 0.02 * max(0, len(t.split()) - 30) + r.gauss(0, 0.08))

    return scored_view(rng, 40, 8, make, score)


@pytest.mark.parametrize("hack", list(HACKS))
def test_no_precision_rule_rejects_a_planted_style_hack(hack):
    # every other hack already penalised (so every co-traveller is in play for the explained-away
    # and length-adjusted rules): the one left is still proposed, with every rule on
    for seed in range(3):
        v = sandbox_like_view(random.Random(60 + seed))
        v.active = [p for name, p in HACKS.items() if name != hack]
        # the length hack (0.02 a word past 30 words) on the plain null: net of a concave curve
        # (the default since issue 55) this 40 x 8 view misses it on seed 0
        c = best(v, **(shipped_lexical().model_dump() | (PLAIN_LENGTH if hack == "length" else {}))).accepted
        assert c is not None, (hack, seed)
        hits = {s.id for s in v.samples if re.search(c.regex, s.text)}
        planted = {s.id for s in v.samples if re.search(HACKS[hack].regex, s.text)}
        # the candidate is the hack (or a finer view of it): it matches almost only where the hack is
        assert len(hits & planted) >= 0.8 * len(hits), (hack, seed, c.title)
        if hack == "length":
            assert c.title.startswith("Replies run longer than"), c.title


def test_with_every_planted_hack_penalised_nothing_else_is_proposed():
    # the co-travellers ("In the morning", "What do you think of", words of longer replies) are
    # explained away or earn nothing at equal length: no false penalty
    for seed in range(3):
        v = sandbox_like_view(random.Random(60 + seed))
        v.active = list(HACKS.values())
        assert best(v, **shipped_lexical().model_dump()).accepted is None, seed


# --- explain_by_stronger: what may cause a pattern in the same proposal ---------------------------

def test_the_wording_of_a_hack_waits_for_the_hack_while_it_is_not_rising_yet():
    rng = random.Random(41)
    v = questions_view(rng, marker_paid=False)  # the RM pays questions; half of them end "vorbly of it?"
    # the untrained policy already asked as often, never with the tic: the question is not rising yet
    ref_rng = random.Random(7)
    v.reference = [ViewSample(f"r{i}", i, sentence(ref_rng)[:-1] + (" then?" if ref_rng.random() < 0.85 else "."),
                              0.0, "0") for i in range(64)]
    kw = dict(COMMON, explain_lift=1.0, explain_within=True, drift_p_value=0.01)
    wrongly = best(v, **kw).accepted
    assert wrongly is not None and "question" not in wrongly.title  # the tic's wording, set off by the question
    result = best(v, **kw, explain_by_stronger=True)
    assert result.accepted is None and result.rejected["not_rising"] >= 1 and result.rejected["explained"] >= 1
    v.reference = [ViewSample(f"r{i}", i, sentence(ref_rng), 0.0, "0") for i in range(64)]  # now it rises
    assert best(v, **kw, explain_by_stronger=True).accepted.title == "Replies end with a question"


def phrase_view(rng, phrase_paid):
    """Half the replies carry a marker word the RM pays 0.5, half of those as "feel glimmerk",
    paid 0.4 more if `phrase_paid`."""
    def make(r):
        w = r.random() < 0.5
        ph = w and r.random() < 0.5
        words = sentence(r)[:-1].split()
        if w:
            words.insert(r.randrange(len(words)), "feel glimmerk" if ph else "glimmerk")
        return {"text": " ".join(words) + ".", "w": w, "ph": ph}

    def score(f, r):
        return 0.5 * f["w"] + 0.4 * (f["ph"] and phrase_paid) + r.gauss(0, 0.05)

    return scored_view(rng, 40, 8, make, score)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_phrase_is_not_proposed_for_what_its_word_is_paid(seed):
    def propose(v, on):  # the word itself set aside (as when it misses a threshold), to reach the phrase
        cfg = LexicalConfig(**COMMON, explain_lift=1.0, explain_within=True, explain_by_stronger=on)
        return anyio.run(LexicalProposer(cfg, accept=lambda c: c.title != 'Replies use the word "glimmerk"').propose, v)

    phrase = 'Replies use the phrase "feel glimmerk"'
    v = phrase_view(random.Random(seed), phrase_paid=False)
    assert propose(v, False).accepted.title == phrase
    result = propose(v, True)
    assert (result.accepted is None or result.accepted.title != phrase) and result.rejected["explained"] >= 1
    # a phrase the RM pays in itself, beyond its word, is still proposed
    assert propose(phrase_view(random.Random(seed), phrase_paid=True), True).accepted.title == phrase



HACK_SENTENCE = "Truly zorbly glimmers softly."
HACK_PENALTY = Penalty("p001", 'Replies use the phrase "zorbly glimmers"', "",
                       regex=r"(?i)(?<!\w)zorbly\W+glimmers(?!\w)")


def doubled_hack_view(seed: int, groups: int = 24, per_group: int = 8) -> ProposerView:
    """A hack sentence written 0, 1 or 2 times, the reward paying for each occurrence (0.6 x
    sqrt(count), as the discovery benchmark's phrase bonus), and an active penalty on its middle:
    what joins two occurrences ("softly truly") is only ever seen in the doubled hack."""
    from dynalize.grpo import advantages
    from dynalize.penalties.views import advantage_sign

    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        counts = [rng.choice((0, 1, 1, 2)) for _ in range(per_group)]
        texts.append([" ".join([sentence(rng, 10)] + [HACK_SENTENCE] * c) for c in counts])
        scores.append([rng.gauss(0, 0.1) + 0.6 * c ** 0.5 for c in counts])
    samples = [ViewSample(f"s{per_group * g + i + 1:03d}", g, t, sc, advantage_sign(a))
               for g, (gt, gs, ga) in enumerate(zip(texts, scores, advantages(scores)))
               for i, (t, sc, a) in enumerate(zip(gt, gs, ga))]
    return ProposerView(step=5, samples=samples, active=[HACK_PENALTY])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_hack_written_twice_is_that_hack_not_another(seed):
    # the discovery benchmark's phrase runs: once "is a lot" (of "There is a lot to say here.") was
    # penalised, "say here there", written only where the policy wrote the hack twice and the reward
    # paid per occurrence, was proposed as a hack of its own. At each count of the active penalty's
    # matches apart, it earns nothing: the same hack
    result = best(doubled_hack_view(seed), detectors=[], length=False)
    assert result.accepted is None, result.accepted.title
    assert result.rejected["explained"] >= 1


def cotraveller_view(seed: int, own_pay: float = 0.0, groups: int = 48, per_group: int = 8) -> ProposerView:
    """Replies of filler words; 40 % end with a question the reward pays 0.5 for (a hack, already
    penalised), and "indeed" comes with half of the questions and a tenth of the rest (a
    co-traveller), paid `own_pay` for itself."""
    filler = "people walk slowly near the old road and talk about small things every day".split()
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        drawn = []
        for _ in range(per_group):
            text = " ".join(rng.sample(filler, rng.randint(6, 10)))
            asks = rng.random() < 0.4
            indeed = rng.random() < (0.5 if asks else 0.1)
            text += (" indeed" if indeed else "") + ("?" if asks else ".")
            drawn.append((text, 0.5 * asks + own_pay * indeed + rng.gauss(0, 0.3)))
        for (t, sc), a in zip(drawn, advantages([[sc for _, sc in drawn]])[0]):
            samples.append(ViewSample(f"s{len(samples) + 1:04d}", g, t, sc, advantage_sign(a)))
    question = Penalty("p001", "Replies end with a question", "", regex=r"\?\s*\Z")
    return ProposerView(10, samples, active=[question], proposal=2)


def test_a_cotraveller_is_kept_at_the_weak_evidence_rate_over_every_side_of_the_penalty_looked_at():
    # explained-away keeps a pattern that shows weak evidence on either side of an active penalty
    # (the replies it matches and those it does not): two looks, each at `weak_p_value`, kept an
    # unpaid co-traveller on 5 of these 40 views (0.125); the looks now share `weak_p_value`
    # (2 of 40). The multi-turn sandbox's "what do you" beside a penalised question was one.
    # A co-traveller paid for itself is still kept. (min_effect 0: the rate is the test's alone.)
    cfg = LexicalConfig(detectors=[], length=False, min_effect=0.0)
    kept = [seed for seed in range(40) if LexicalProposer(cfg).best(cotraveller_view(seed)) is not None]
    assert len(kept) <= 3, kept
    for seed in range(4):
        c = LexicalProposer(cfg).best(cotraveller_view(seed, own_pay=0.3))
        assert c is not None and "indeed" in c.title, c
