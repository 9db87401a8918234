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

CFG = dict(min_effect=0.3, length_adjusted=True, length=False)
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


def test_a_reply_with_its_own_score_is_compared_with_its_turn_of_the_group_by_that_score():
    # two conversations of one group; the RM scored each reply (the rollout's score is their mean)
    a = ViewSample("s1", 0, "x", 0.5, "+", ["a1", "a2"], reply_scores=[1.0, 0.0])
    b = ViewSample("s2", 0, "y", 0.25, "-", ["b1", "b2"], reply_scores=[0.0, 0.5])
    lent = ViewSample("s3", 1, "z", 0.7, "+", ["c1", "c2"])  # no own scores: the rollout's are lent
    split = {s.id: s for s in per_reply(ProposerView(0, [a, b, lent])).samples}
    # turn 1: a1 (1.0) beats b1 (0.0); turn 2: b2 (0.5) beats a2 (0.0), though a's rollout won
    assert [(split[k].score, split[k].sign) for k in ("s1.1", "s2.1", "s1.2", "s2.2")] == \
        [(1.0, "+"), (0.0, "-"), (0.0, "-"), (0.5, "+")]
    assert split["s1.1"].group == split["s2.1"].group != split["s1.2"].group == split["s2.2"].group
    assert {split[k].group for k in ("s1.1", "s1.2")}.isdisjoint({1})  # new groups never merge with old ones
    assert all(split[k].origin == 0 for k in ("s1.1", "s2.2"))
    assert [(split[k].score, split[k].sign, split[k].group, split[k].origin) for k in ("s3.1", "s3.2")] == \
        [(0.7, "+", 1, None)] * 2


def test_the_term_lends_replies_the_rms_own_scores_only_when_the_rm_is_the_whole_reward_before_penalties():
    from dynalize.rewards.penalties import reply_scores
    from dynalize.types import Rollout

    r = Rollout(prompt_id="p", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                replies=["one", "two"], policy_version=0)
    r.info["rm_scores"] = [0.2, 0.6]
    assert reply_scores(r, 0.4) == [0.2, 0.6]  # the reward before penalties is their mean
    assert reply_scores(r, 0.9) == []  # another term adds to it: no share can be put on one reply
    r.replies = ["one"]
    r.info["rm_scores"] = [0.4]
    assert reply_scores(r, 0.4) == []  # single-turn: nothing to split


def test_own_scores_find_a_pattern_the_rm_pays_in_one_reply_that_the_rollouts_score_dilutes():
    # 16 groups x 8 four-reply conversations; the RM pays each reply +1 for "velvet" (rare: 15 %),
    # plus a large per-conversation noise that swamps the mean of four replies
    rng = random.Random(3)
    samples = []
    for g in range(16):
        rows = []
        for _ in range(8):
            marked = [rng.random() < 0.15 for _ in range(4)]
            replies = [" ".join(rng.sample(FILLER, 6) + (["velvet"] if m else [])) + "." for m in marked]
            own = [float(m) + rng.gauss(0, 0.3) for m in marked]
            noise = rng.gauss(0, 1.5)
            rows.append((replies, [x + noise for x in own]))
        means = [statistics.fmean(o) for _, o in rows]
        for (replies, own), m, adv in zip(rows, means, advantages([means])[0]):
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, "\n\n".join(replies), m, advantage_sign(adv),
                                      replies, reply_scores=own))
    view = ProposerView(0, samples)
    lent = ProposerView(0, [ViewSample(s.id, s.group, s.text, s.score, s.sign, s.replies) for s in samples])
    cfg = LexicalConfig(**CFG, unit="reply")
    own_found = LexicalProposer(cfg).best(view)
    lent_found = LexicalProposer(cfg).best(lent)
    assert own_found is not None and "velvet" in own_found.title, own_found
    assert lent_found is None or "velvet" not in lent_found.title, lent_found
