"""PenaltyTerm: rewards and verdicts, retirement, background proposals, metrics, checkpoints."""

import json
import re
import time

import anyio
import pytest

from dynalize.backends.chat import ScriptedChatModel
from dynalize.build import build_penalty_term
from dynalize.penalties.buffer import PenaltyBuffer
from dynalize.penalties.candidate import Candidate, ProposalResult
from dynalize.penalties.config import PenaltiesConfig
from dynalize.penalties.judge import Judge, RegexJudge
from dynalize.penalties.lexical import LexicalProposer
from dynalize.rewards import PenaltyTerm, RewardTerm, TermScores, score_batch
from dynalize.types import Batch, Message, Rollout


def rollout(group, replies, rm, prompt="Write something."):
    replies = [replies] if isinstance(replies, str) else replies
    return Rollout(prompt_id=f"q{group}", group=group, prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                   loss_mask=[1], replies=replies, policy_version=0, messages=[Message("user", prompt)],
                   turns=[Message("assistant", r) for r in replies], info={"preset_rm": rm})


class PresetRM(RewardTerm):
    """The RM term, with each rollout's score given in advance."""

    name = "rm"

    async def score(self, batch):
        return TermScores([r.info["preset_rm"] for r in batch.rollouts])


async def score(term, batch):
    """Score `batch` with the RM and `term`, as the loop does; returns the events by term."""
    return await score_batch([PresetRM(), term], batch)


def term(proposer, judge, buffer=None, **cfg):
    return PenaltyTerm(PenaltiesConfig(enabled=True, **cfg), proposer, judge, buffer)


def hacked_batch(step=0, n_groups=8):
    """Per group: two replies opening with "Zounds," (RM likes them: advantage +0.5) and two plain ones."""
    groups = []
    for g in range(n_groups):
        groups.append([rollout(g, f"Zounds, reply {g} number {i} here.", 2.0) for i in range(2)]
                      + [rollout(g, f"Plain reply {g} number {i} there.", 1.0) for i in range(2)])
    return Batch(step=step, groups=groups)


def candidate(title="Opens with Zounds", regex=r"(?i)\Azounds\b"):
    return Candidate(title, "The reply opens with Zounds.", ["s01", "s03"], regex, groups=2)


class FakeProposer:
    """Waits for `release` (or `delay` seconds), then proposes `cand` (or raises `error`)."""

    def __init__(self, cand=None, delay=0.0, error=None):
        self.cand, self.delay, self.error = cand, delay, error
        self.release = None
        self.views, self.finished_at = [], None

    async def propose(self, view):
        self.views.append(view)
        if self.release is not None:
            await self.release.wait()
        await anyio.sleep(self.delay)
        self.finished_at = time.perf_counter()
        if self.error:
            raise self.error
        return ProposalResult(step=view.step, accepted=self.cand, candidates=1)


def test_score_fills_verdicts_violations_reward_and_retires():
    buf = PenaltyBuffer()
    buf.add(candidate(), step=0)
    buf.add(Candidate("Says gadzooks", "d", ["s1", "s2"], r"(?i)\bgadzooks\b"), step=1)
    eng = term(FakeProposer(), RegexJudge(), buf, lam=0.5)
    batch = hacked_batch(step=2)
    anyio.run(score, eng, batch)
    r_hack, r_plain = batch.groups[0][0], batch.groups[0][2]
    assert r_hack.info["verdicts"] == {"p001": True, "p002": False} and r_hack.info["violations"] == 1
    assert r_hack.scores == {"rm": 2.0, "penalties": -0.5}
    assert r_hack.reward == pytest.approx(1.5) and r_plain.reward == pytest.approx(1.0)
    assert [p.id for p in buf.active()] == ["p001"]  # p002 triggered nowhere: retired
    m = eng.metrics()
    assert m["penalty/p001/prevalence"] == 0.5 and m["penalty/p002/prevalence"] == 0.0
    assert m["penalties/retires"] == 1 and m["penalties/active"] == 1
    assert m["penalties/frac_violating"] == 0.5 and m["penalties/mean_violations"] == 0.5
    assert m["judge/lexical"] == 64 and m["judge/calls"] == 0
    assert eng.metrics()["penalties/retires"] == 0  # reset after reading


def test_multi_turn_counts_distinct_penalties_over_replies():
    def answer(msgs):
        reply = msgs[1].content.split("<reply-", 1)[1]
        return json.dumps({"p001": "great question" in reply.lower(), "p002": "?" in reply})

    chat = ScriptedChatModel(answer)
    buf = PenaltyBuffer()
    buf.add(Candidate("Flatters", "Praises the question.", []), step=0)
    buf.add(Candidate("Asks back", "Ends with a question.", []), step=1)
    eng = term(FakeProposer(), Judge(chat), buf, lam=0.5)
    r = rollout(0, ["Great question! Here it is.", "Sure, more?", "Great question again?"], rm=3.0)
    other = rollout(0, ["Fine.", "Done."], rm=1.0)
    anyio.run(score, eng, Batch(2, [[r, other]]))
    assert len(chat.calls) == 5  # one call per policy reply
    assert r.info["verdicts"] == {"p001": True, "p002": True} and r.info["violations"] == 2
    assert r.reward == pytest.approx(2.0)
    assert other.info["violations"] == 0 and other.reward == 1.0
    assert "Write something." in chat.calls[0][1].content  # the prompt goes along as context


def test_judge_reads_each_multi_turn_reply_with_the_conversation_up_to_it():
    seen = {}

    def answer(msgs):
        def fenced(label):
            return re.search(rf"<{label}-(\w+)>\n(.*)\n</{label}-\1>", msgs[1].content, re.S).group(2)

        seen[fenced("reply")] = fenced("context")
        return json.dumps({"p001": False})

    buf = PenaltyBuffer()
    buf.add(Candidate("Flatters", "Praises the question.", []), step=0)
    eng = term(FakeProposer(), Judge(ScriptedChatModel(answer)), buf)
    r = rollout(0, ["First reply.", "Second reply."], rm=1.0, prompt="Opening message.")
    r.turns = [Message("assistant", "First reply."), Message("user", "The user's follow-up."),
               Message("assistant", "Second reply.")]
    anyio.run(score, eng, Batch(0, [[r, rollout(0, "Other.", rm=0.0)]]))
    # reply 2 answers the simulated user's message, after the policy's first reply
    assert "The user's follow-up." in seen["Second reply."] and "First reply." in seen["Second reply."]
    assert seen["First reply."] == "[user]\nOpening message."
    assert seen["Second reply."] == ("[user]\nOpening message.\n\n[assistant]\nFirst reply.\n\n"
                                     "[user]\nThe user's follow-up.")


def test_proposal_lands_at_first_score_after_it_finishes():
    async def main():
        prop = FakeProposer(candidate())
        prop.release = anyio.Event()
        eng = term(prop, RegexJudge(), every=5)
        async with anyio.create_task_group() as tg:
            for step in range(13):
                batch = hacked_batch(step)
                await score(eng, batch)
                eng.observe(batch, tg)
                if step == 7:
                    prop.release.set()
                    with anyio.fail_after(5):
                        while eng.in_flight:  # let the proposer finish before step 8 scores
                            await anyio.sleep(0.001)
                await anyio.sleep(0.001)
        return eng, prop

    eng, prop = anyio.run(main)
    [p] = eng.buffer.all()
    assert p.created_step == 8 and p.history[0]["proposed_at"] == 0
    assert len(prop.views) == 2 and [v.step for v in prop.views] == [0, 10]  # step 5 was skipped
    assert eng.totals["proposer/skipped_in_flight"] == 1 and eng.totals["proposer/started"] == 2
    assert eng.totals["penalties/adds"] == 1


def test_score_never_waits_for_a_slow_proposer():
    async def main():
        prop = FakeProposer(candidate(), delay=0.5)
        eng = term(prop, RegexJudge(), every=100)
        score_started, in_flight_steps = [], 0
        async with anyio.create_task_group() as tg:
            for step in range(40):
                batch = hacked_batch(step)
                score_started.append(time.perf_counter())
                await score(eng, batch)
                in_flight_steps += eng.in_flight
                eng.observe(batch, tg)
                await anyio.sleep(0.05)
        return eng, prop, score_started, in_flight_steps

    eng, prop, started, in_flight_steps = anyio.run(main)
    landed = next(i for i, t in enumerate(started) if t > prop.finished_at)
    assert eng.buffer.get("p001").created_step == landed
    assert in_flight_steps >= 3 and landed >= 4  # training went on while the proposer slept


def test_failing_proposer_is_counted_and_training_goes_on():
    async def main():
        eng = term(FakeProposer(error=RuntimeError("proposer exploded")), RegexJudge(), every=2)
        metrics = []
        async with anyio.create_task_group() as tg:
            for step in range(6):
                batch = hacked_batch(step)
                await score(eng, batch)
                eng.observe(batch, tg)
                await anyio.sleep(0.01)
                metrics.append(eng.metrics())
        return eng, metrics

    eng, metrics = anyio.run(main)
    assert eng.totals["proposer/failed"] == 3 and eng.totals.get("proposer/accepted", 0) == 0
    assert [m["proposer/failed"] for m in metrics] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert len(eng.buffer.all()) == 0 and not eng.in_flight


def test_lexical_end_to_end_penalises_the_hack():
    cfg = PenaltiesConfig(enabled=True, every=1, view_groups=8)
    eng = build_penalty_term(cfg, domain="toy", seed=3)
    assert isinstance(eng.proposer, LexicalProposer) and isinstance(eng.judge, RegexJudge)

    async def main():
        async with anyio.create_task_group() as tg:
            b0 = hacked_batch(0)
            assert await score(eng, b0) == {}  # nothing happened yet: no events
            eng.observe(b0, tg)
        b1 = hacked_batch(1)
        return b1, await score(eng, b1)

    b1, events = anyio.run(main)
    [p] = eng.buffer.active()
    assert p.title == 'Replies open with "Zounds,"' and p.created_step == 1
    assert b1.groups[3][0].info["violations"] == 1 and b1.groups[3][0].reward == pytest.approx(1.5)
    assert b1.groups[3][3].info["violations"] == 0
    events = [json.loads(json.dumps(e)) for e in events["penalties"]]
    assert [e["event"] for e in events] == ["add", "stats"] and events[0]["proposed_at"] == 0


def test_state_dict_round_trip_keeps_pending_proposal():
    eng = term(FakeProposer(), RegexJudge(), every=1)
    eng.buffer.add(candidate("Old", r"\bold\b"), step=0)
    eng.pending = ProposalResult(step=4, accepted=candidate())
    eng.totals["proposer/accepted"] = 2.0
    state = json.loads(json.dumps(eng.state_dict()))
    fresh = term(FakeProposer(), RegexJudge(), every=1)
    fresh.load_state_dict(state)
    assert fresh.buffer.to_json() == eng.buffer.to_json() and fresh.totals == {"proposer/accepted": 2.0}
    batch = hacked_batch(5)
    anyio.run(score, fresh, batch)
    assert fresh.buffer.get("p002").created_step == 5 and batch.groups[0][0].info["violations"] == 1


def test_llm_config_builds_llm_parts():
    made = []

    def factory(cfg):
        made.append(cfg)
        return ScriptedChatModel([])

    chat = {"engine": "scripted", "path": "tests.nowhere:replies"}
    cfg = PenaltiesConfig.model_validate({"proposer": {"engine": "llm", "chat": chat},
                                          "judge": {"engine": "llm", "chat": chat, "max_concurrency": 4}})
    eng = build_penalty_term(cfg, domain="stories", chat_factory=factory)
    assert len(made) == 2 and eng.judge.cfg.max_concurrency == 4 and eng.proposer.require_regex is False
    cfg = PenaltiesConfig.model_validate({"proposer": {"engine": "llm", "chat": chat}})
    assert build_penalty_term(cfg, chat_factory=factory).proposer.require_regex is True
    with pytest.raises(ValueError, match="needs judge.chat"):
        PenaltiesConfig.model_validate({"judge": {"engine": "llm"}})
    with pytest.raises(ValueError):
        PenaltiesConfig.model_validate({"lam": 0.5, "typo": 1})


def _propose_all(eng, steps):
    async def go():
        async with anyio.create_task_group() as tg:
            for step in steps:
                batch = hacked_batch(step, n_groups=3)
                for r in batch.rollouts:
                    r.replies = [f"{r.replies[0]} (step {step})"]
                eng.observe(batch, tg)
                await anyio.sleep(0)
    anyio.run(go)


def test_proposer_reads_the_last_view_steps_batches_and_the_first_as_reference():
    prop = FakeProposer()
    eng = term(prop, RegexJudge(), every=3, view_steps=2, view_per_group=4)
    _propose_all(eng, range(7))
    assert [v.step for v in prop.views] == [0, 3, 6]
    first, later = prop.views[0], prop.views[1]
    assert len(first.samples) == 12 and len(later.samples) == 24  # steps 2 and 3, 3 groups x 4 each
    # the two batches' groups stay apart, ids are unique, texts come from steps 2 and 3 only
    assert sorted({s.group for s in later.samples}) == list(range(6))
    assert len({s.id for s in later.samples}) == 24
    assert sorted({s.text[-7:-1] for s in later.samples}) == ["step 2", "step 3"]
    assert later.reference == first.samples  # the run's first batch, kept for every proposal

    # checkpoint: a resumed engine pools the same batches and keeps the same reference
    state = json.loads(json.dumps(eng.state_dict()))
    fresh_prop = FakeProposer()
    fresh = term(fresh_prop, RegexJudge(), every=3, view_steps=2, view_per_group=4)
    fresh.load_state_dict(state)
    _propose_all(fresh, [7, 8, 9])
    _propose_all(eng, [7, 8, 9])
    a, b = prop.views[-1], fresh_prop.views[-1]
    assert a.step == b.step == 9 and a.samples == b.samples and a.reference == b.reference
