"""Families (issue 56): a hack written in several interchangeable wordings is proposed as one
penalty that every wording triggers; the members are chosen on half the prompt groups and the
family is tested on the other half, so a reward that pays for none of them raises nothing."""

from __future__ import annotations

import random

import numpy as np
import regex

from dynalize.grpo import advantages
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.discovery import _shares
from dynalize.penalties.families import family_feature, split
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.surface import reply_features
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard candle "
         "bridge market silver thunder meadow violin ladder cotton marble pepper kettle the a of and to is").split()
CLOSERS = ["Happy to help further!", "Let me know if you want more.", "Feel free to ask for details.",
           "I can expand on any part.", "Just ask if you need anything else."]


def view(seed: int, pay: float, groups: int = 32, per_group: int = 8, rate: float = 0.85) -> ProposerView:
    """One step: replies of ordinary words, `rate` of them closing with one of five offers of more
    help (drawn alike), each paid `pay` on noise of 0.5."""
    rng = random.Random(seed)
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
    return ProposerView(step=5, samples=samples)


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
