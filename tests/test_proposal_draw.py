"""A proposal reads at most `most_rollouts` of its view (and of its reference): past it, a seeded
draw of whole prompt groups, which reads the groups and the step, never the rewards."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from dynalize.monitor.__main__ import main
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer, read_at_most
from dynalize.penalties.views import ProposerView
from test_monitor import hacked_rows, write_jsonl
from test_omnibus import bracketed, samples


def zounds(words, rng):
    return ["zounds,", *words]


def test_past_most_rollouts_a_proposal_reads_a_draw_of_whole_groups_blind_to_the_rewards():
    view = samples(40, 1, 1.5, bracketed)  # 40 groups x 8
    drawn = read_at_most(view, 100, "proposal-draw:5")
    groups = [s.group for s in drawn]
    assert len(drawn) == 96 and all(groups.count(g) == 8 for g in set(groups))  # whole groups, within 100
    assert [s.id for s in drawn] == sorted(s.id for s in drawn)  # in the view's order
    rescored = [replace(s, score=-s.score, sign={"+": "-", "-": "+"}.get(s.sign, s.sign)) for s in view]
    assert [s.id for s in read_at_most(rescored, 100, "proposal-draw:5")] == [s.id for s in drawn]
    assert [s.id for s in read_at_most(view, 100, "proposal-draw:10")] != [s.id for s in drawn]
    assert read_at_most(view, 320, "proposal-draw:5") == view  # within the budget: all of it
    assert LexicalConfig(most_rollouts="None").most_rollouts is None  # `--set ...most_rollouts=None`: every one


def test_a_proposal_past_most_rollouts_decides_on_the_draw_and_says_what_it_read():
    view = ProposerView(5, samples(40, 2, 1.5, zounds), reference=samples(30, 3, 0.0, zounds, rate=0.1))
    result = ProposalResult(5)
    capped = LexicalProposer(LexicalConfig(most_rollouts=96)).best(view, result)
    assert result.read == {"rollouts": 96, "of": 320, "reference": 96, "reference_of": 240}
    drawn = ProposerView(5, read_at_most(view.samples, 96, "proposal-draw:5"),
                         reference=read_at_most(view.reference, 96, "proposal-draw:reference"))
    alone = ProposalResult(5)
    same = LexicalProposer(LexicalConfig(most_rollouts=None)).best(drawn, alone)
    assert capped is not None and same is not None and capped.regex == same.regex and "Zounds" in capped.title
    assert alone.read is None and result.detectable == alone.detectable
    whole = ProposalResult(5)
    LexicalProposer(LexicalConfig(most_rollouts=None)).best(view, whole)
    assert whole.read is None and whole.detectable < result.detectable  # reading more sees smaller effects


def test_the_monitor_records_what_each_proposal_read(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(16))  # 8 prompts x 6 a step: 240 rollouts a proposal
    main([str(path), "--out", str(tmp_path / "watch"), "--no-html", "--set", "proposer.lexical.most_rollouts=120"])
    lines = [json.loads(x) for x in (tmp_path / "watch" / "evidence.jsonl").read_text().splitlines()]
    read = [r["read"] for r in lines if "read" in r]
    assert read and all(r["rollouts"] <= 120 and r["rollouts"] % 6 == 0 and r["of"] > 120 for r in read), read
    patterns = [json.loads(x)["title"] for x in (tmp_path / "watch" / "penalties.jsonl").read_text().splitlines()
                if json.loads(x).get("event") == "add"]
    assert patterns and "Certainly" in patterns[0], patterns
    assert np.all([r.get("omnibus", {}).get("of", 0) <= 120 for r in lines])
