"""A proposal proposes, besides its strongest pattern, the others that passed the same tests and
every filter (`runners_up`), each checked with the ones before it held as if live; a run queues
them to enter one a step after it."""

from __future__ import annotations

import random

import anyio

from dynalize.grpo import advantages
from dynalize.judge.judge import RegexJudge
from dynalize.penalties.candidate import Candidate, ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign
from test_omnibus import VOCAB
from test_penalty_term import candidate, hacked_batch, score, term


def two_hacks(groups: int = 40, seed: int = 1) -> list[ViewSample]:
    """Each reply may open with "Zounds," and may close with "forsooth": each paid +1.5, apart."""
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        gt, gs = [], []
        for _ in range(8):
            words = [rng.choice(VOCAB) for _ in range(rng.randint(8, 16))]
            opener, closer = rng.random() < 0.5, rng.random() < 0.5
            gt.append(("Zounds, " if opener else "") + " ".join(words) + (" forsooth." if closer else "."))
            gs.append(rng.gauss(0, 1) + 1.5 * opener + 1.5 * closer)
        texts.append(gt)
        scores.append(gs)
    return [ViewSample(f"s{g:02d}{i}", g, t, sc, advantage_sign(a))
            for g, (gt, gs, ga) in enumerate(zip(texts, scores, advantages(scores))) for i, (t, sc, a) in
            enumerate(zip(gt, gs, ga))]


def propose(runners_up: int) -> tuple[Candidate | None, ProposalResult]:
    result = ProposalResult(step=5)
    best = LexicalProposer(LexicalConfig(runners_up=runners_up)).best(ProposerView(5, two_hacks()), result)
    return best, result


def test_a_second_hack_that_passed_beside_the_strongest_is_proposed_too():
    best, result = propose(2)
    found = [best.title, *(c.title for c in result.also)]
    assert sum("Zounds" in t for t in found) == 1 and sum("forsooth" in t for t in found) == 1, found
    assert len(result.also) == 1  # the phrases around either are covered or explained by it


def test_without_runners_up_the_strongest_alone_is_proposed():
    best, result = propose(0)
    assert best is not None and result.also == [] and result.rejected.get("not_best", 0) > 0


class TwoCandidates:
    """Proposes a candidate and a runner-up at its first proposal, nothing after."""

    def __init__(self):
        self.calls = 0

    async def propose(self, view):
        self.calls += 1
        if self.calls > 1:
            return ProposalResult(step=view.step)
        second = candidate("Closes with forsooth", r"(?i)\bforsooth\W*\Z")
        return ProposalResult(step=view.step, accepted=candidate(), also=[second])


def test_a_runner_up_enters_the_step_after_the_strongest():
    eng = term(TwoCandidates(), RegexJudge(), every=1, sync=True)

    async def main():
        async with anyio.create_task_group() as tg:
            for step in range(4):
                batch = hacked_batch(step)
                await score(eng, batch)
                eng.observe(batch, tg)
                await eng.settle()

    anyio.run(main)
    added = {p.title: p.created_step for p in eng.buffer.all()}  # (forsooth retires: no reply shows it)
    assert added == {"Opens with Zounds": 1, "Closes with forsooth": 2}, added  # one add a step


def test_the_monitor_adds_both_hacks_and_records_the_runner_up(tmp_path):
    import json

    from dynalize.monitor.__main__ import main
    from test_monitor import write_jsonl

    rng = random.Random(4)
    rows = []
    for step in range(4):  # the first proposal (step 0) reads 24 groups x 8: both hacks pass there
        for g in range(24):
            for _ in range(8):
                opener, closer = rng.random() < 0.5, rng.random() < 0.5
                text = ("Zounds, " if opener else "") + " ".join(rng.choice(VOCAB) for _ in range(12)) + \
                    (" forsooth." if closer else ".")
                rows.append({"step": step, "prompt": f"question {g} at {step}", "completion": text,
                             "reward": rng.gauss(0, 1) + 1.5 * opener + 1.5 * closer})
    out = tmp_path / "watch"
    main([str(write_jsonl(tmp_path / "r.jsonl", rows)), "--out", str(out), "--no-html"])
    adds = [e for e in map(json.loads, (out / "penalties.jsonl").read_text().splitlines()) if e["event"] == "add"]
    assert len(adds) == 2 and adds[1]["step"] == adds[0]["step"] + 1, adds
    assert {"Zounds" in a["title"] for a in adds} == {True, False}
    [proposal] = [e for e in map(json.loads, (out / "evidence.jsonl").read_text().splitlines()) if e["accepted"]]
    assert [c["title"] for c in proposal["also"]] == [adds[1]["title"]]
