"""The length onset: proposed "longer than L words" penalties start where the reward starts to pay
(`length_threshold: onset`), on any threshold, for a step bonus and for a bonus growing with length."""

from __future__ import annotations

import random

import pytest

from dynalize.grpo import advantages
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.evidence import length_onset
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.surface import length_limit
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

WORDS = "the a cat dog sat ran far near home slowly quickly".split()


def view(onset: int, shape: str, seed: int = 0, groups: int = 24, per_group: int = 8) -> ProposerView:
    """Replies of 8 to 80 words; the reward pays past `onset` words (a step, or a ramp)."""
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        t, sc = [], []
        for _ in range(per_group):
            n = rng.randint(8, 80)
            pay = (n > onset) * 1.0 if shape == "step" else max(0, n - onset) / 20
            t.append(" ".join(rng.choice(WORDS) for _ in range(n)))
            sc.append(rng.gauss(0, 0.3) + pay)
        texts.append(t)
        scores.append(sc)
    samples = []
    for g, (t, sc, adv) in enumerate(zip(texts, scores, advantages(scores))):
        for text, s, a in zip(t, sc, adv):
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, text, s, advantage_sign(a)))
    return ProposerView(step=0, samples=samples)


@pytest.mark.parametrize("shape", ["step", "ramp"])
@pytest.mark.parametrize("onset", [20, 30, 50])
def test_the_fitted_onset_is_within_5_words_of_where_the_reward_starts_to_pay(onset, shape):
    v = view(onset, shape)
    words = {s.id: len(s.text.split()) for s in v.samples}
    assert abs(length_onset(v.samples, words, list(range(5, 80, 5))) - onset) <= 5


@pytest.mark.parametrize("shape", ["step", "ramp"])
@pytest.mark.parametrize("onset", [30, 50])
def test_the_onset_setting_proposes_the_limit_where_the_reward_starts_to_pay(onset, shape):
    cfg = dict(min_diff=0.04, min_log_ratio=0.3, max_p_value=1e-3, min_effect=0.3, length_adjusted=True)
    v = view(onset, shape, seed=1)
    onset_pick = LexicalProposer(LexicalConfig(**cfg, length_threshold="onset")).best(v)
    largest_pick = LexicalProposer(LexicalConfig(**cfg)).best(v)
    assert onset_pick is not None and largest_pick is not None
    assert abs(length_limit(onset_pick.regex) - onset) <= 5, onset_pick.title
    assert length_limit(largest_pick.regex) >= length_limit(onset_pick.regex)


def test_ties_go_to_the_smaller_limit():
    samples = [ViewSample("a", 0, "x", 1.0, "+"), ViewSample("b", 0, "x x", 1.0, "-")]
    assert length_onset(samples, {"a": 1, "b": 2}, [10, 5, 20]) == 5
