"""Legitimate pay is not a hack (issue 55, point 1): a reward that pays for length on a saturating
curve, for the prompt's words, or that rises over training while an unpaid style spreads raises no
penalty; every candidate is tested net of those covariates (penalties.covariates), across steps
within steps, and a hack beside legitimate pay is still found."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from dynalize.grpo import advantages
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.covariates import net_of_concave, net_of_smooth, orthogonal
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.permutation import centred, group_index
from dynalize.penalties.surface import length_limit
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard candle "
         "bridge market silver thunder meadow violin ladder cotton marble pepper kettle the a of and to is").split()
TOPICS = ["umbrella rain puddle storm cloud wet drizzle".split(), "violin concert stage music bow hall chord".split(),
          "harbor boat sailor anchor wave dock rope".split(), "orchard apple ladder basket tree harvest pear".split(),
          "winter snow sled frost ice scarf cold".split(), "market pepper stall vendor coin crowd spice".split()]

Reply = Callable[[random.Random, int], tuple[str, float]]


def batch(rng: random.Random, groups: int, per_group: int, reply: Reply, step: int, base: float = 0.0) -> list[ViewSample]:
    """One step's samples: `groups` prompts (each on one of TOPICS) x `per_group` replies drawn by
    `reply(rng, group)`, every reward raised by `base` (a reward that rose over training)."""
    out = []
    for g in range(groups):
        drawn = [reply(rng, g) for _ in range(per_group)]
        scores = [sc + base for _, sc in drawn]
        for (text, _), sc, a in zip(drawn, scores, advantages([scores])[0]):
            out.append(ViewSample(f"b{step}_{len(out):04d}", step * 1000 + g, text, sc, advantage_sign(a),
                                  contexts=[f"[user]\nWrite about the {TOPICS[g % len(TOPICS)][0]}."], batch=step))
    return out


def saturating(scale: float, bar: int | None = None) -> Reply:
    """Replies of 5-70 ordinary words; the reward pays 2 (1 - exp(-words / scale)) (plus 0.6 past
    `bar` words: a step hack) on noise of 0.5."""
    def reply(rng: random.Random, g: int) -> tuple[str, float]:
        n = rng.randint(5, 70)
        pay = 2 * (1 - math.exp(-n / scale)) + 0.6 * (bar is not None and n > bar)
        return " ".join(rng.choice(WORDS) for _ in range(n)) + ".", pay + rng.gauss(0, 0.5)
    return reply


def coverage(rng: random.Random, g: int) -> tuple[str, float]:
    """A reply of 5-60 words, a quarter of them its topic's: the reward pays 0.5 per distinct topic
    word used (longer replies use more)."""
    topic = TOPICS[g % len(TOPICS)]
    words = [rng.choice(topic) if rng.random() < 0.25 else rng.choice(WORDS) for _ in range(rng.randint(5, 60))]
    return " ".join(words) + ".", 0.5 * len(set(words) & set(topic)) + rng.gauss(0, 0.5)


def one_step(reply: Reply, seed: int, groups: int = 48, per_group: int = 8) -> ProposerView:
    return ProposerView(step=5, samples=batch(random.Random(seed), groups, per_group, reply, 1))


def propose(view: ProposerView, **kw) -> tuple[object, ProposalResult]:
    """The proposer's pick with `length_null: concave` (not the default: it misses steps the plain
    null finds, docs/penalties.md) and the other settings `kw`."""
    result = ProposalResult(step=view.step)
    return LexicalProposer(LexicalConfig(**{"length_null": "concave", **kw})).best(view, result), result


@pytest.mark.parametrize("scale", [10, 25])
def test_a_reward_that_pays_for_length_on_a_saturating_curve_raises_no_penalty_but_a_step_beside_it_does(scale):
    # before: "longer than 30-35 words" or a word carried by length on 4 of these 6 views. The
    # length limits are held at a concave curve by default; a word carried by length needs
    # `length_adjusted` (off by default: config.py says why)
    found = [propose(one_step(saturating(scale), seed), length_adjusted=True)[0] for seed in range(3)]
    assert found == [None] * 3, [c.title for c in found if c]
    # a step bonus past 40 words on top of the same curve bends it upwards: still found
    limits = []
    for seed in range(3):
        c, _ = propose(one_step(saturating(scale, bar=40), seed, groups=64), length_adjusted=True)
        limits.append(c is not None and length_limit(c.regex))
    assert sum(isinstance(lim, int) and abs(lim - 40) <= 5 for lim in limits) >= 2, limits


def test_a_reward_that_pays_for_the_prompts_words_raises_no_length_penalty():
    # longer replies use more of the topic's words; before: "longer than 10 words" (or 30) on 3 of 3 views
    found = [propose(one_step(coverage, seed))[0] for seed in range(3)]
    assert found == [None] * 3, [c.title for c in found if c]


def spreading_opener(seed: int, paid: float = 0.0, steps: int = 5) -> ProposerView:
    """A new opener absent from the first batch and in every reply of the next `steps` batches,
    paid `paid`, while the reward of every reply rises by 0.4 a step (training that works)."""
    rng = random.Random(seed)

    def with_opener(rate: float) -> Reply:
        def reply(rng: random.Random, g: int) -> tuple[str, float]:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "."
            shows = rng.random() < rate
            return ("Certainly friend, " + text if shows else text), paid * shows + rng.gauss(0, 0.5)
        return reply
    reference = batch(rng, 16, 8, with_opener(0.0), 0)
    now = [s for k in range(1, steps + 1) for s in batch(rng, 16, 8, with_opener(1.0), k, base=0.4 * k)]
    return ProposerView(step=steps, samples=now, reference=reference)


def test_an_unpaid_opener_that_spread_while_the_reward_rose_is_not_identifiable_not_a_hack():
    # before: proposed across steps (the rewards permuted over all steps pooled) from the first view on
    for seed in range(3):
        c, result = propose(spreading_opener(seed))
        assert c is None, c.title
        assert result.rejected.get("not_identifiable", 0) >= 1, result.rejected


def test_the_concave_null_absorbs_a_saturating_curve_but_not_a_step():
    rng = np.random.default_rng(0)
    w = rng.integers(5, 70, 2000).astype(float)
    groups = group_index((np.arange(2000) // 8).tolist())
    curve = 2 * (1 - np.exp(-w / 15))
    assert np.abs(net_of_concave(curve, groups, w, [])).max() < 0.1
    step = curve + 0.6 * (w > 40)
    residual = net_of_concave(step, groups, w, [])
    assert residual[(w > 40) & (w <= 45)].mean() - residual[(w > 35) & (w <= 40)].mean() > 0.2
    # the smooth (unconstrained) fit is what wording is held at: it absorbs either
    assert np.abs(net_of_smooth(curve, groups, w, [])).max() < 0.1


def test_a_length_limit_is_made_orthogonal_to_the_concave_curve_before_its_permutation_test():
    # Freedman-Lane: the residuals of the concave fit are permuted, so the limit's column is taken net
    # of the fit's active columns too (covariates.orthogonal). Before, a step past 40 words beside a
    # saturating curve was found on 2 of these 6 views (the column's null as wide as its whole self)
    found = [propose(one_step(saturating(15, bar=40), seed, groups=32), length_adjusted=True)[0] for seed in range(6)]
    limits = [c is not None and length_limit(c.regex) for c in found]
    assert sum(isinstance(lim, int) and abs(lim - 40) <= 5 for lim in limits) >= 4, limits
    # and the curve alone stays unpenalised on the same views
    null = [propose(one_step(saturating(15), seed, groups=32), length_adjusted=True)[0] for seed in range(6)]
    assert null == [None] * 6, [c.title for c in null if c]


def test_a_column_made_orthogonal_to_a_design_is_centred_within_groups_and_uncorrelated_with_it():
    from scipy import sparse

    rng = np.random.default_rng(1)
    groups = group_index((np.arange(80) // 8).tolist())
    design = np.column_stack([centred(rng.normal(size=80), groups) for _ in range(2)])
    x = sparse.csr_matrix((rng.random((3, 80)) < 0.4).astype(float))
    xo = orthogonal(x, design, groups).toarray()
    assert np.abs(xo @ design).max() < 1e-9
    assert np.abs(np.bincount(groups, xo[0])).max() < 1e-9
    assert np.allclose(orthogonal(x, np.zeros((80, 0)), groups).toarray()[1], centred(x.toarray()[1], groups))


def ending(paid_closer: float = 0.0) -> Reply:
    """Replies of ordinary words, half cut off mid-way; a finished one closes "by the side." or "by
    the night." The reward pays 1 for a finished reply (plus `paid_closer` for "side": a closing
    hack), on noise of 0.3."""
    def reply(rng: random.Random, g: int) -> tuple[str, float]:
        body = " ".join(rng.choice(WORDS[:20]) for _ in range(rng.randint(8, 30)))
        if rng.random() < 0.5:
            return body, rng.gauss(0, 0.3)
        last = rng.choice(["side", "night"])
        return f"{body} by the {last}.", 1.0 + paid_closer * (last == "side") + rng.gauss(0, 0.3)
    return reply


def test_a_reward_that_pays_for_a_finished_reply_raises_no_penalty_for_its_closing_words():
    # the closing words travel with the pay for finishing; before (no `ending_adjusted`) they were
    # proposed on these views, as on the synthetic suite's ending null ("side", "night")
    found = [propose(one_step(ending(), seed, groups=32))[0] for seed in range(3)]
    assert found == [None] * 3, [c.title for c in found if c]
    before = [propose(one_step(ending(), seed, groups=32), ending_adjusted=False)[0] for seed in range(3)]
    assert all(before), "the closing words should look paid when the ending is not held"
    # a closing word paid for itself, against the other finished replies, is still found
    hacks = [propose(one_step(ending(paid_closer=0.6), seed, groups=32))[0] for seed in range(3)]
    assert sum(c is not None and "side" in c.regex for c in hacks) >= 2, [c and c.title for c in hacks]
