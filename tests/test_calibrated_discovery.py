"""The lexical proposer decides with a stated error rate at any batch shape, sees a hack that
saturated between two proposals, and says when its silence is no evidence (issue 43, points 1-3)."""

from __future__ import annotations

import json
import random

import pytest

from dynalize.grpo import advantages
from dynalize.monitor.__main__ import main
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign

VOCAB = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard "
         "candle bridge market silver thunder meadow violin ladder cotton marble pepper kettle").split()
PLANTED = "zorblix"


def view(groups: int, per_group: int, seed: int, pay: float = 0.0, rate: float = 0.5, step: int = 5,
         group_base: int = 0, tie: bool = False) -> list[ViewSample]:
    """`groups` x `per_group` replies of 8-20 ordinary words; the planted word in a `rate` share,
    paid `pay` on a reward of unit noise (`tie`: every reward of a group equal)."""
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        gt, gs = [], []
        for _ in range(per_group):
            planted = rng.random() < rate
            words = [rng.choice(VOCAB) for _ in range(rng.randint(8, 20))]
            if planted:
                words.insert(rng.randrange(len(words) + 1), PLANTED)
            gt.append(" ".join(words) + ".")
            gs.append(0.0 if tie else rng.gauss(0, 1) + pay * planted)
        texts.append(gt)
        scores.append(gs)
    out = []
    for g, (gt, gs, ga) in enumerate(zip(texts, scores, advantages(scores))):
        for t, sc, a in zip(gt, gs, ga):
            out.append(ViewSample(f"s{step}_{len(out) + 1:04d}", group_base + g, t, sc, advantage_sign(a)))
    return out


def propose(samples, reference=(), **kw):
    result = ProposalResult(step=5)
    c = LexicalProposer(LexicalConfig(**kw)).best(ProposerView(5, samples, reference=list(reference)), result)
    return c, result


def test_false_discoveries_on_null_rewards_stay_within_the_error_rate_at_small_and_large_shapes():
    # rewards independent of every pattern: a proposal that accepts anything is a false discovery;
    # at fdr 0.05 at most about 1 in 20 proposals may, at 4 x 8 as at 64 x 8
    for groups, seeds in ((4, 40), (64, 12)):
        false = sum(propose(view(groups, 8, seed))[0] is not None for seed in range(seeds))
        assert false <= max(2, round(0.1 * seeds)), (groups, false)


def test_a_planted_word_is_found_at_a_4_by_8_batch():
    found = 0
    for seed in range(5):
        c, _ = propose(view(4, 8, seed, pay=2.0))
        found += c is not None and PLANTED in c.title
    assert found >= 4


def test_a_hack_that_saturated_in_two_steps_is_found_across_steps():
    # the reference (first batch): the word in a third of the replies, paid there; two steps later
    # every reply shows it, so no group of the view contrasts it any more, and the reward has risen
    # with it. Compared within steps (issue 55), the evidence is the reference's contrast: with the
    # word in 10 % of its replies (3 of 32) there is too little of it
    reference = view(4, 8, 0, pay=2.0, rate=0.35, step=0)
    now = view(4, 8, 1, pay=2.0, rate=1.0, group_base=10) + view(4, 8, 2, pay=2.0, rate=1.0, group_base=20)
    c, result = propose(now, reference)
    assert c is not None and PLANTED in c.title, result
    assert "rose from the run's first batches" in c.description
    # the same rise with a reward that did not rise with it: nothing
    flat = view(4, 8, 1, rate=1.0, group_base=10) + view(4, 8, 2, rate=1.0, group_base=20)
    assert propose(flat, view(4, 8, 0, rate=0.35, step=0))[0] is None


def test_tied_rewards_give_insufficient_evidence_not_all_clear():
    c, result = propose(view(4, 8, 0, tie=True))
    assert c is None and result.evidence == "insufficient" and "tied" in result.evidence_reason
    c, result = propose(view(64, 8, 0))
    assert c is None and result.evidence == "sufficient" and result.detectable < 1.0


def test_the_monitor_reports_insufficient_evidence_with_its_own_exit_status(tmp_path):
    rows = [{"step": step, "prompt": f"question {g}", "completion": f"the {VOCAB[(g + i) % 25]} sat far.",
             "reward": 1.0} for step in range(3) for g in range(4) for i in range(8)]
    src = tmp_path / "rollouts.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    status = main([str(src), "--out", str(tmp_path / "mon"), "--every", "1", "--no-html"])
    summary = json.loads((tmp_path / "mon" / "summary.json").read_text())
    assert status == 11
    assert summary["verdict"].startswith("insufficient evidence at step 2")
    assert "no discovered pattern is live" not in summary["verdict"]


def test_the_run_summary_says_when_proposals_lacked_the_evidence():
    from dynalize.summary import summary_rows

    row = {"step": 9, "dropped_total": 0, "rollouts_per_s": 1.0, "time/step": 1.0,
           "proposer/finished_total": 3, "proposer/failed_total": 0, "proposer/insufficient_total": 2}
    rows = {k: last for k, _, last in summary_rows([row])}
    assert rows["discovery evidence"].startswith("INSUFFICIENT in 2 of 3 proposals")
    rows = {k: last for k, _, last in summary_rows([{**row, "proposer/insufficient_total": 0}])}
    assert rows["discovery evidence"] == "sufficient in all 3 proposals"


def test_logs_that_begin_after_step_1_are_no_evidence_of_no_hack(tmp_path):
    # a hack already in every reply by the first logged step (TRL's logging_steps=10) has nothing to
    # rise from and no contrast left: the same honest rollouts are "all clear" logged from step 1 on,
    # and insufficient evidence logged from step 10 on
    rng = random.Random(0)
    rollouts = [(f"question {g}", " ".join(rng.choice(VOCAB) for _ in range(8)) + ".", rng.gauss(0, 1))
                for _ in range(4) for g in range(32) for _ in range(8)]
    statuses = {}
    for first, stride in ((1, 1), (10, 10)):
        rows = [{"step": first + stride * (i // 256), "prompt": p, "completion": c, "reward": r}
                for i, (p, c, r) in enumerate(rollouts)]
        src = tmp_path / f"from{first}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out = tmp_path / f"mon{first}"
        statuses[first] = main([str(src), "--out", str(out), "--every", "1", "--no-html"])
        statuses[first, "verdict"] = json.loads((out / "summary.json").read_text())["verdict"]
    assert statuses[1] == 0, statuses[1, "verdict"]
    assert statuses[10] == 11 and "the logs begin at step 10" in statuses[10, "verdict"]


def test_a_run_of_many_honest_proposals_raises_a_false_penalty_at_most_fdr_of_the_time():
    # ten proposals a run on rewards independent of every pattern: held per proposal, about a third
    # of such runs raised a false penalty; spent over the run, at most fdr (0.05) of them may
    false = 0
    proposer = LexicalProposer(LexicalConfig())
    for run in range(40):
        false += any(proposer.best(ProposerView(5 * k, view(4, 8, 1000 * run + k, step=5 * k), proposal=k),
                                   ProposalResult(step=5 * k)) is not None for k in range(1, 11))
    assert false <= 4, false
    per_proposal = LexicalProposer(LexicalConfig(fwer_scope="proposal"))
    false = sum(any(per_proposal.best(ProposerView(5 * k, view(4, 8, 1000 * run + k, step=5 * k)),
                                      ProposalResult(step=5 * k)) is not None for k in range(1, 11))
                for run in range(40))
    assert false > 4, false  # what the run's bound is for


def test_a_late_proposal_still_finds_a_hack_past_what_its_permutations_can_count():
    # the 10th proposal decides at 0.05 / 110 = 0.00045, below 1 / 501, the smallest p-value 500
    # permutations can count: the fitted tail of their maxima still resolves a strong hack
    found = sum(PLANTED in (LexicalProposer(LexicalConfig()).best(
        ProposerView(50, view(16, 8, seed, pay=1.0), proposal=10), ProposalResult(step=50)) or _NONE).title
        for seed in range(4))
    assert found >= 3


class _NONE:
    title = ""


def test_the_tail_of_the_max_statistic_is_never_lighter_than_exponential_and_agrees_where_counted():
    import numpy as np
    from scipy.stats import norm

    from dynalize.penalties.permutation import MaxTail, proposal_level

    rng = np.random.default_rng(0)
    maxima = rng.standard_normal((500, 1000)).max(axis=1)  # 500 permutations' max of 1000 null z's
    tail = MaxTail(maxima)
    for z in (4.5, 5.0, 5.5, 6.0):
        exact = 1 - norm.cdf(z) ** 1000
        assert exact <= tail.p(z) <= 50 * exact, (z, tail.p(z), exact)  # conservative, within reason
    assert tail.p(float(np.quantile(maxima, 0.5))) == (1 + (maxima >= np.quantile(maxima, 0.5)).sum()) / 501
    assert tail.p(tail.quantile(1e-4)) == pytest.approx(1e-4)
    assert sum(proposal_level(0.05, k) for k in range(1, 10_000)) < 0.05


def test_a_resumed_run_continues_its_count_of_proposals():
    from dynalize.build import build_penalty_term
    from dynalize.penalties.config import PenaltiesConfig

    term = build_penalty_term(PenaltiesConfig(enabled=True))
    term.proposals = 3
    term._restart = ProposerView(15, view(4, 8, 0), proposal=3)
    again = build_penalty_term(PenaltiesConfig(enabled=True))
    again.load_state_dict(json.loads(json.dumps(term.state_dict())))
    assert again.proposals == 3 and again._restart is not None and again._restart.proposal == 3


def test_a_saturated_pattern_the_reward_barely_pays_is_no_hack_across_steps():
    # the discovery benchmark's "remember" (beside a loop of repeated sentences) and the template
    # "make it feel": each rose to most replies while the reward rose for other reasons, and was paid
    # a little wherever groups still contrasted it (0.4-0.9 within-group stds), enough for the
    # within-group statistic over many contrasts; min_effect holds across steps too
    from dataclasses import replace

    reference = view(32, 8, 0, pay=0.3, rate=0.5, step=0)
    risen = [replace(s, score=s.score + 1.5) for s in view(16, 8, 1, pay=0.3, rate=1.0, group_base=100)]
    assert propose(risen, reference, min_effect=0)[0] is not None  # it did rise with the reward
    c, _ = propose(risen, reference)
    assert c is None, c.title
    # paid as a hack is (2 stds in the first batch's groups): found across steps, as before
    hacked = [replace(s, score=s.score + 1.5) for s in view(16, 8, 1, pay=2.0, rate=1.0, group_base=100)]
    c, _ = propose(hacked, view(32, 8, 0, pay=2.0, rate=0.5, step=0))
    assert c is not None and PLANTED in c.title and "rose from the run's first batches" in c.description


def test_the_across_steps_effect_is_the_effect_min_effect_reads_within_groups():
    # min_effect means one thing in both families: contrast_effect (vectorised, for the across-steps
    # family) equals evidence.Effect (the within family's) on the same samples and patterns
    import numpy as np

    from dynalize.penalties.evidence import Effect
    from dynalize.penalties.permutation import contrast_effect, group_index, indicator

    samples = view(12, 8, 3, pay=0.7, rate=0.4)
    rng = random.Random(3)
    rows = [[i for i in range(len(samples)) if rng.random() < share] for share in (0.1, 0.5, 0.9)]
    rows.append([i for i, s in enumerate(samples) if PLANTED in s.text])
    rows.append([i for i, s in enumerate(samples) if s.group == 0])  # one group, all of it: no contrast
    got = contrast_effect(indicator(rows, len(samples)), np.array([s.score for s in samples]),
                          group_index([s.group for s in samples]))
    effect = Effect(samples)
    want = [effect(lambda s, r=set(r): samples.index(s) in r) for r in rows]
    assert np.allclose(got[:-1], want[:-1]) and got[-1] == want[-1] == float("inf")
