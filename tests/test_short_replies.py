"""Length in either direction (issue 56): "Replies run at most L words" is a candidate below what
the untrained policy wrote, so a reward that pays for short replies is named, and one that pays
for length is not."""

from __future__ import annotations

import random

import regex

from dynalize.grpo import advantages
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.surface import short_feature, word_count
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = "river stone lamp garden window quiet letter morning engine harbor paper winter orchard candle".split()


def batch(rng: random.Random, step: int, short_share: float, pay, groups: int = 32, per_group: int = 8):
    """One step: replies of 14-40 words, `short_share` of them cut to 3-8 words; the reward is
    `pay(words)` on noise of 0.5."""
    out = []
    for g in range(groups):
        drawn = []
        for _ in range(per_group):
            n = rng.randint(3, 8) if rng.random() < short_share else rng.randint(14, 40)
            drawn.append((" ".join(rng.choice(WORDS) for _ in range(n)) + ".", pay(n) + rng.gauss(0, 0.5)))
        for (text, sc), a in zip(drawn, advantages([[sc for _, sc in drawn]])[0]):
            out.append(ViewSample(f"b{step}_{len(out):04d}", step * 1000 + g, text, sc, advantage_sign(a), batch=step))
    return out


def view(seed: int, pay) -> ProposerView:
    """A reference batch of long replies, then four steps where short replies spread to half."""
    rng = random.Random(seed)
    reference = batch(rng, 0, 0.0, pay)
    now = [s for k in range(1, 5) for s in batch(rng, k, 0.5, pay)]
    return ProposerView(step=5, samples=now, reference=reference)


def propose(v: ProposerView, **kw):
    return LexicalProposer(LexicalConfig(**kw)).best(v, ProposalResult(step=v.step))


def test_a_reward_that_pays_for_short_replies_is_named_by_a_limit_below_what_the_policy_wrote():
    found = [propose(view(seed, lambda n: 0.6 * (n <= 10))) for seed in range(3)]
    assert all(c is not None and c.title.startswith("Replies run at most") for c in found), \
        [c and c.title for c in found]
    # before: no candidate said it (issue 56's short kind found on 0 of 14 runs)
    assert [propose(view(seed, lambda n: 0.6 * (n <= 10)), short=False) for seed in range(3)] == [None] * 3


def test_a_reward_that_pays_for_length_raises_no_short_penalty():
    for seed in range(3):
        c = propose(view(seed, lambda n: min(n, 20) / 20))
        assert c is None or not c.title.startswith("Replies run at most"), c.title


def test_the_short_regex_says_what_the_proposer_counts():
    rng = random.Random(0)
    for limit in (5, 10, 15):
        rx = regex.compile(short_feature(limit).regex)
        for _ in range(200):
            text = " ".join(rng.choice(["a", "bb", "c.", "\n", "  "]) for _ in range(rng.randint(0, 25)))
            assert bool(rx.search(text)) == (0 < word_count(text) <= limit), repr(text)
