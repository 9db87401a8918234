"""Every decision that can add or revive a penalty spends from the run's error rate, and power is
said honestly (issue 55, points 2 and 3): revival is tested in the proposal's permutation family,
`fdr` is read as the family-wise `fwer` with a warning, the reference batch counts once, a tail fit
never undercuts the counted p-value, "could detect" is what the whole rule can propose, and the
monitor's exit status reads the run's recent proposals, not the last one alone."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from dynalize.grpo import advantages
from dynalize.monitor.summary import INSUFFICIENT_EXIT, exit_status, last_evidence
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.permutation import MaxTail
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign
from dynalize.types import Penalty

VOCAB = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard "
         "candle bridge market silver thunder meadow violin ladder cotton marble pepper kettle").split()


def null_view(seed: int, groups: int = 4, per_group: int = 8, pay_word: str | None = None, pay: float = 0.0,
              step: int = 5) -> list[ViewSample]:
    """Replies of 8-20 ordinary words on a reward of unit noise (plus `pay` where `pay_word` shows)."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        texts = [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(8, 20))) + "." for _ in range(per_group)]
        scores = [rng.gauss(0, 1) + (pay if pay_word and pay_word in t.split() else 0.0) for t in texts]
        for t, sc, a in zip(texts, scores, advantages([scores])[0]):
            out.append(ViewSample(f"s{len(out) + 1:03d}", g, t, sc, advantage_sign(a), batch=step))
    return out


def retired_words() -> list[Penalty]:
    return [Penalty(f"p{i:03d}", f'Replies use the word "{w}"', "old", regex=rf"(?i)\b{w}\b", active=False)
            for i, w in enumerate(VOCAB)]


def test_revival_spends_from_the_error_rate_yet_revives_a_pattern_paid_again():
    # 25 retired word penalties, each word in about half the replies, the reward paying for none:
    # before, each was revived on Fisher p <= 0.05 and an effect of 0.8 std, outside the budget
    # (revived on 7 of 20 views); in the proposal's permutation family, about 1 in 20 at most
    revived = 0
    for seed in range(20):
        v = ProposerView(5, null_view(seed), retired=retired_words())
        c = LexicalProposer(LexicalConfig(detectors=[])).best(v)
        revived += c is not None and c.revives is not None
    assert revived <= 2, revived
    # a family of a few retired patterns has a low critical value: a word paid again comes back
    v = ProposerView(5, null_view(0, groups=8, pay_word="lamp", pay=1.5), retired=retired_words())
    c = LexicalProposer(LexicalConfig(detectors=[])).best(v)
    assert c is not None and c.revives == "p002" and c.title == 'Replies use the word "lamp"'


def test_the_old_name_fdr_is_read_as_fwer_with_a_one_line_warning():
    with pytest.warns(FutureWarning, match="fdr is deprecated: it is read as fwer"):
        cfg = LexicalConfig(fdr=0.1, fdr_scope="proposal")
    assert (cfg.fwer, cfg.fwer_scope) == (0.1, "proposal")
    with pytest.raises(ValueError, match="both fdr"):
        LexicalConfig(fdr=0.1, fwer=0.2)


def test_a_fitted_tail_never_undercuts_what_the_permutations_counted():
    # a discrete null (maxima on a grid of whole numbers): no smooth tail describes its atoms, and a
    # fitted one gave 0.0016 where 6 of 500 maxima reached the statistic (counted: 0.012)
    for seed in range(5):
        maxima = np.round(np.random.default_rng(seed).standard_normal(500), 0) + 2
        tail = MaxTail(maxima)
        for z in np.unique(maxima):
            count = int((maxima >= z).sum())
            assert tail.p(float(z)) == pytest.approx((1 + count) / 501), (seed, z)
        assert not tail.fitted
    smooth = MaxTail(np.random.default_rng(0).standard_normal((500, 1000)).max(axis=1))
    assert smooth.fitted and smooth.p(6.0) < 1 / 501  # a tail that fits still reaches past the counts


def test_could_detect_is_never_below_what_min_effect_lets_through():
    # a large view: the test alone could see 0.3 std, but nothing under min_effect (0.8) is proposed
    result = ProposalResult(step=5)
    LexicalProposer(LexicalConfig(detectors=[])).best(ProposerView(5, null_view(1, groups=128, per_group=16)), result)
    assert result.evidence == "sufficient"
    assert 0.8 < result.detectable < 1.0, result.detectable


def write_evidence(tmp_path, states: list[str]):
    with open(tmp_path / "evidence.jsonl", "w") as f:
        for k, state in enumerate(states, 1):
            f.write(json.dumps({"step": 5 * k, "state": state, "reason": "few groups" if state != "sufficient" else "",
                                "detectable": 0.9 if state == "sufficient" else 2.0}) + "\n")
    return last_evidence(tmp_path)


def test_the_exit_status_reads_the_runs_recent_proposals_not_the_last_alone(tmp_path):
    # before, one underpowered proposal at the end turned a run's 0 into 11, and one powered one
    # the other way round
    assert exit_status([], write_evidence(tmp_path, ["sufficient", "sufficient", "insufficient"])) == 0
    weak = write_evidence(tmp_path, ["insufficient", "insufficient", "sufficient"])
    assert exit_status([], weak) == INSUFFICIENT_EXIT
    assert weak["step"] == 10 and weak["recent"] == "2 of the latest 3 proposal(s) insufficient"
    assert exit_status([], write_evidence(tmp_path, ["insufficient"])) == INSUFFICIENT_EXIT
