"""Families (issue 56): a hack written in several interchangeable wordings is proposed as one
penalty that every wording triggers; the members are chosen on half the prompt groups and the
family is tested on the other half, or chosen by how they rose since the run's reference (texts
alone) and tested on every group, so a reward that pays for none of them raises nothing."""

from __future__ import annotations

import random

import numpy as np
import regex

from dynalize.grpo import advantages
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.discovery import _shares
from dynalize.penalties.families import MAX_MEMBERS, family_feature, risen, split
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.surface import reply_features
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard candle "
         "bridge market silver thunder meadow violin ladder cotton marble pepper kettle the a of and to is").split()
CLOSERS = ["Happy to help further!", "Let me know if you want more.", "Feel free to ask for details.",
           "I can expand on any part.", "Just ask if you need anything else."]


def view(seed: int, pay: float, groups: int = 32, per_group: int = 8, rate: float = 0.85,
         reference: int = 0) -> ProposerView:
    """One step: replies of ordinary words, `rate` of them closing with one of five offers of more
    help (drawn alike), each paid `pay` on noise of 0.5; with a reference of `reference` groups of
    the run's first batch, where no reply offers more help."""
    rng = random.Random(seed)
    first = [ViewSample(f"r{i:04d}", i // per_group, " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + ".",
                        rng.gauss(0, 0.5), "0", batch=0) for i in range(reference * per_group)]
    samples = []
    for g in range(groups):
        drawn = []
        for _ in range(per_group):
            body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "."
            hacked = rng.random() < rate
            drawn.append((f"{body} {rng.choice(CLOSERS)}" if hacked else body, pay * hacked + rng.gauss(0, 0.5)))
        scores = [sc for _, sc in drawn]
        for (text, sc), a in zip(drawn, advantages([scores])[0]):
            samples.append(ViewSample(f"s{len(samples):04d}", g, text, sc, advantage_sign(a), batch=1))
    return ProposerView(step=5, samples=samples, reference=first)


def propose(v: ProposerView, **kw):
    return LexicalProposer(LexicalConfig(**kw)).best(v, ProposalResult(step=v.step))


def test_a_closing_offer_in_five_wordings_is_proposed_as_one_family_that_most_wordings_trigger():
    found = [propose(view(seed, pay=0.6, groups=64)) for seed in range(4)]
    fired = []
    for c in found:
        rx = regex.compile(c.regex) if c is not None else None
        fired.append(sum(bool(rx and rx.search(f"Some words here. {w}")) for w in CLOSERS))
    assert all(n >= 3 for n in fired), [(c and c.title, n) for c, n in zip(found, fired)]
    # without families no single wording stands out against the rest (mostly other wordings)
    alone = [propose(view(seed, pay=0.6, groups=64), families=False) for seed in range(4)]
    assert alone == [None] * 4, [c.title for c in alone if c]


def test_a_family_that_rose_since_the_reference_is_found_on_a_view_of_ten_groups():
    # 10 groups of 16: half of them is too few to screen each wording's pay and test the union on
    # the other half; the wordings that rose since the reference, tested on every group, are not
    found = [propose(view(seed, pay=0.6, groups=10, per_group=16, reference=4)) for seed in range(4)]
    fired = [sum(bool(c and regex.compile(c.regex).search(f"Some words here. {w}")) for w in CLOSERS) for c in found]
    assert all(n >= 3 for n in fired), [(c and c.title, n) for c, n in zip(found, fired)]


def test_wordings_that_rose_without_pay_raise_no_family():
    for seed in range(6):
        c = propose(view(seed, pay=0.0, groups=10, per_group=16, reference=4))
        assert c is None, c.title


def test_members_chosen_by_rise_are_the_steepest_risers_of_one_class_nested_from_two():
    kinds = ["closeword", "closeword", "closeword", "ngram1", "closeword", "open1", "closep"]
    shown = [set(range(0, 30)), set(range(30, 70)), set(range(70, 75)), set(range(50)), set(range(75, 95)),
             set(range(45)), set(range(30, 60))]
    then = [0, 0, 5, 0, 20, 1, 0]
    nested = risen(kinds, shown, then, 100, 50)
    # the word and the opener are alone in their classes; 2 and 4 did not rise; the closing phrase
    # shows only where closing word 1 does: no member of its own
    assert nested == {"closers": [[1, 0]]}
    assert risen(kinds, shown, then, 100, 0) == {}
    many = risen(["ngram1"] * 12, [set(range(10 * i, 10 * i + 20 + i)) for i in range(12)], [0] * 12, 200, 50)["words"]
    assert [len(m) for m in many] == list(range(2, MAX_MEMBERS + 1)) and many[0] == [11, 10]


def test_wordings_the_reward_does_not_pay_for_raise_no_family():
    for seed in range(6):
        c = propose(view(seed, pay=0.0, groups=64))
        assert c is None, c.title


def test_a_family_is_chosen_on_one_half_of_the_groups_and_tested_on_the_other():
    groups = np.repeat(np.arange(10), 4)
    screen = split(groups, step=5)
    assert screen.sum() == 20 and all(len(set(screen[groups == g])) == 1 for g in range(10))
    assert (split(groups, step=5) == screen).all() and not (split(groups, step=10) == screen).all()


def test_a_familys_regex_matches_each_member_as_its_own_regex_does():
    parts = [reply_features(t) for t in ("Great question! Here.", "What a lovely question. Here.")]
    openers = [next(f for k, f in p.items() if k.startswith("open1:")) for p in parts]
    f = family_feature("openers", openers)
    rx = regex.compile(f.regex)
    assert rx.search("great question! And more") and rx.search("What a day") and not rx.search("Here, what")
    assert f.title == 'Replies open with any of "Great", "What"'


def test_the_families_share_of_the_level_is_kept_whether_or_not_a_family_is_built():
    # which families exist depends on half the rewards: the wording tests never take their share
    with_families = _shares(True, True, False, True)
    assert abs(sum(with_families) - 1) < 1e-12 and with_families[3] > 0
    assert _shares(True, True, False, False)[0] > with_families[0]
