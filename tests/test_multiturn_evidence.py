"""Multi-turn evidence that does not saturate: with `unit: reply` the lexical proposer counts each
reply with its rollout's advantage, so a pattern the RM pays per reply is found even where nearly
every conversation has some reply that shows it."""

from __future__ import annotations

import random
import statistics

from dynalize.grpo import advantages
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign, per_reply, rollout_id

CFG = dict(min_diff=0.04, min_log_ratio=0.3, max_p_value=1e-3, min_effect=0.3, length_adjusted=True, length=False)
FILLER = "the cat sat on a mat near the old door".split()


def conversations(seed: int = 0, groups: int = 16, per_group: int = 8, turns: int = 4, rate: float = 0.5) -> ProposerView:
    """4-reply conversations; each reply carries the marker word "velvet" with probability `rate`,
    and the RM is the share of replies that carry it (plus noise): with rate 0.5, 94 % of the
    conversations have a reply with it, whatever their reward."""
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        gt, gs = [], []
        for _ in range(per_group):
            marked = [rng.random() < rate for _ in range(turns)]
            replies = [" ".join(rng.sample(FILLER, 6) + (["velvet"] if m else [])) + "." for m in marked]
            gt.append(replies)
            gs.append(statistics.fmean(map(float, marked)) + rng.gauss(0, 0.1))
        texts.append(gt)
        scores.append(gs)
    samples = []
    for g, (gt, gs, ga) in enumerate(zip(texts, scores, advantages(scores))):
        for replies, s, a in zip(gt, gs, ga):
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, "\n\n".join(replies), s, advantage_sign(a), replies))
    return ProposerView(step=0, samples=samples)


def test_presence_per_rollout_saturates_where_the_share_of_replies_does_not():
    for seed in range(3):
        v = conversations(seed=seed)
        with_marker = [any("velvet" in r for r in s.replies) for s in v.samples]
        assert sum(with_marker) / len(with_marker) > 0.85  # positives and negatives alike show it
        rollout = LexicalProposer(LexicalConfig(**CFG)).best(v)
        reply = LexicalProposer(LexicalConfig(**CFG, unit="reply")).best(v)
        assert rollout is None or "velvet" not in rollout.title, rollout.title
        assert reply is not None and "velvet" in reply.title, reply


def test_per_reply_references_name_the_rollouts_and_single_turn_views_are_unchanged():
    v = conversations(seed=1)
    c = LexicalProposer(LexicalConfig(**CFG, unit="reply")).best(v)
    ids = {s.id for s in v.samples}
    assert c is not None and c.references and set(c.references) <= ids
    split = per_reply(v)
    assert len(split.samples) == 4 * len(v.samples)
    assert {rollout_id(s.id) for s in split.samples} == ids
    single = ProposerView(0, [ViewSample("s1", 0, "one reply", 1.0, "+"), ViewSample("s2", 0, "other", 0.0, "-")])
    assert per_reply(single).samples == single.samples
