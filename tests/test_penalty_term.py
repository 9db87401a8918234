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
from dynalize.penalties.config import JudgeConfig, PenaltiesConfig
from dynalize.judge.judge import Judge, RegexJudge
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
                    await _until(lambda: not eng.in_flight)  # the proposer finishes before step 8 scores
        return eng, prop

    eng, prop = anyio.run(main)
    [p] = eng.buffer.all()
    assert p.created_step == 8 and p.history[0]["proposed_at"] == 0
    assert len(prop.views) == 2 and [v.step for v in prop.views] == [0, 10]  # step 5 was skipped
    assert eng.totals["proposer/skipped_in_flight"] == 1 and eng.totals["proposer/started"] == 2
    assert eng.totals["penalties/adds"] == 1


def test_score_never_waits_for_a_slow_proposer():
    prop = GatedProposer(candidate())  # runs until the test opens its gate

    async def main():
        eng = term(prop, RegexJudge(), every=100)
        in_flight = []
        async with anyio.create_task_group() as tg:
            for step in range(8):
                if step == 5:  # four steps scored and observed while the proposal ran
                    prop.gates[0].set()
                    await _until(lambda: not eng.in_flight)
                batch = hacked_batch(step)
                await score(eng, batch)
                in_flight.append(eng.in_flight)
                eng.observe(batch, tg)
        return eng, in_flight

    eng, in_flight = anyio.run(main)
    assert in_flight == [False, True, True, True, True, False, False, False]
    assert eng.buffer.get("p001").created_step == 5  # it lands at the first score after it finished
    assert eng.totals.get("proposer/skipped_in_flight", 0) == 0  # every=100: steps 1-4 were off the schedule


def test_with_sync_the_next_score_waits_for_the_proposal_and_applies_it():
    prop = FakeProposer(candidate(), delay=0.3)

    async def main():
        eng = term(prop, RegexJudge(), every=2, sync=True)
        async with anyio.create_task_group() as tg:
            for step in range(4):
                batch = hacked_batch(step)
                await score(eng, batch)
                assert not eng.in_flight
                eng.observe(batch, tg)
        return eng

    eng = anyio.run(main)
    [p] = eng.buffer.all()
    assert p.created_step == 1 and p.history[0]["proposed_at"] == 0  # always the step after, however slow


def drive(eng, steps, read):
    """Score and observe `steps` batches as the loop does; what `read(eng)` says after each step."""
    async def main():
        out = []
        async with anyio.create_task_group() as tg:
            for step in range(steps):
                batch = hacked_batch(step)
                await score(eng, batch)
                eng.observe(batch, tg)
                await _until(lambda: not eng.in_flight)  # the proposal lands before the next step
                out.append(read(eng))
        return out

    return anyio.run(main)


def test_failing_proposer_is_counted_and_training_goes_on():
    eng = term(FakeProposer(error=RuntimeError("proposer exploded")), RegexJudge(), every=2)
    metrics = drive(eng, 6, lambda e: e.metrics())
    assert eng.totals["proposer/failed"] == 3 and eng.totals.get("proposer/accepted", 0) == 0
    assert [m["proposer/failed"] for m in metrics] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert len(eng.buffer.all()) == 0 and not eng.in_flight


def test_lexical_end_to_end_penalises_the_hack():
    # the whole batch (8 groups x 4): 2 of each group's 4 replies carry the hack; the default 2 a
    # group gives pairs that show it in at most 1 in 16 permutations each, no evidence at fdr 0.05
    cfg = PenaltiesConfig(enabled=True, every=1, view_groups=8, view_per_group=4)
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


def test_lexical_defaults_read_whole_groups_and_find_the_hack():
    # PenaltiesConfig's view defaults: the lexical proposer reads whole groups (16 x 2 found nothing here)
    eng = build_penalty_term(PenaltiesConfig(enabled=True, every=1), domain="toy", seed=3)

    async def main():
        async with anyio.create_task_group() as tg:
            b0 = hacked_batch(0)
            await score(eng, b0)
            eng.observe(b0, tg)
        await score(eng, hacked_batch(1))

    anyio.run(main)
    assert [p.title for p in eng.buffer.active()] == ['Replies open with "Zounds,"']


def test_view_defaults_are_the_proposers_own():
    chat = {"engine": "scripted", "path": "tests.nowhere:replies"}
    lexical, llm = PenaltiesConfig(every=4), PenaltiesConfig.model_validate({"every": 4, "proposer": {"engine": "llm", "chat": chat}})
    assert lexical.view_shape() == (64, 64, 4)  # whole groups of every batch since the previous proposal
    assert llm.view_shape() == (16, 2, 1)  # the LLM's prompt: 16 groups x 2 of the proposal's batch
    set_ = PenaltiesConfig(view_groups=8, view_per_group=3, view_steps=2, proposer={"engine": "llm", "chat": chat})
    assert set_.view_shape() == (8, 3, 2)
    assert PenaltiesConfig(view_steps="None").view_steps is None  # `--set penalties.view_steps=None`
    assert term(FakeProposer(), RegexJudge(), every=3).recent.maxlen == 3


def test_state_dict_round_trip_keeps_pending_proposal():
    eng = term(FakeProposer(), RegexJudge(), every=1)
    eng.buffer.add(candidate("Old", r"\bold\b"), step=0)
    eng.pending = [ProposalResult(step=4, accepted=candidate())]
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
    assert "The task the assistant is doing: stories" in eng.judge.messages("r", [])[0].content
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
                    r.turns = [Message("assistant", r.replies[0])]
                eng.observe(batch, tg)
                await _until(lambda: not eng.in_flight)
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


def _reference_term(state=None):
    """A penalty term pooling its first 2 batches as the reference, resumed from `state` if given."""
    prop = FakeProposer()
    eng = term(prop, RegexJudge(), every=3, view_steps=2, view_per_group=4, reference_steps=2)
    if state is not None:
        eng.load_state_dict(json.loads(json.dumps(state)))
    return prop, eng


def test_reference_steps_pools_the_runs_first_batches_and_survives_a_resume():
    prop, eng = _reference_term()
    _propose_all(eng, range(4))
    first, later = prop.views[0], prop.views[1]
    assert first.reference == first.samples  # at step 0 only the first batch exists
    assert len(later.reference) == 24 and sorted({s.text[-7:-1] for s in later.reference}) == ["step 0", "step 1"]
    # resumed after the reference is complete: it is not extended by later batches
    fresh_prop, fresh = _reference_term(eng.state_dict())
    _propose_all(fresh, [4, 5, 6])
    assert fresh_prop.views[-1].reference == later.reference
    # resumed half-way (one batch in): the next batch completes it, as in the run that did not stop
    _, half = _reference_term()
    _propose_all(half, [0])
    resumed_prop, resumed = _reference_term(half.state_dict())
    _propose_all(resumed, [1, 2, 3])
    assert resumed_prop.views[-1].reference == later.reference


# --- nothing the proposer accepted is lost (issue 21) ---------------------------------------------

class GatedProposer:
    """Proposes `cands[i]` on its i-th call once `gates[i]` is set; records each call's view."""

    def __init__(self, *cands):
        self.cands = list(cands)
        self.gates = [anyio.Event() for _ in cands]
        self.views = []

    async def propose(self, view):
        i = len(self.views)
        self.views.append(view)
        await self.gates[i].wait()
        return ProposalResult(step=view.step, accepted=self.cands[i], candidates=1)


async def _until(pred):
    """Wait for `pred()` (set by background tasks of this process); the bound only guards a hang."""
    with anyio.fail_after(120):
        while not pred():
            await anyio.sleep(0.001)


def test_a_finished_proposal_is_never_overwritten_and_the_next_one_sees_it_as_active():
    first, second = candidate(), candidate("Says reply", r"(?i)\breply\b")
    prop = GatedProposer(first, second)

    async def main():
        eng = term(prop, RegexJudge(), every=5)
        async with anyio.create_task_group() as tg:
            for step in range(8):
                batch = hacked_batch(step)
                await score(eng, batch)
                if step == 5:  # the first proposal lands after this step's score applied nothing...
                    prop.gates[0].set()
                    await _until(lambda: not eng.in_flight)
                eng.observe(batch, tg)  # ...and the second starts before any score applies it
                if step == 5:
                    prop.gates[1].set()
                    await _until(lambda: not eng.in_flight)
        return eng

    eng = anyio.run(main)
    assert [v.step for v in prop.views] == [0, 5]
    assert [(p.id, p.title) for p in prop.views[1].active] == [("p001", first.title)]  # the queued one, as it will be
    assert [(p.id, p.title, p.created_step) for p in eng.buffer.all()] == \
        [("p001", first.title, 6), ("p002", second.title, 7)]
    assert eng.totals["proposer/accepted"] == 2 and eng.totals["penalties/adds"] == 2 and eng.pending == []


def test_queued_proposals_enter_one_per_step_and_survive_a_checkpoint():
    eng = term(FakeProposer(), RegexJudge())
    eng.pending = [ProposalResult(step=3, accepted=candidate()),
                   ProposalResult(step=4, accepted=candidate("Says reply", r"(?i)\breply\b"))]
    state = json.loads(json.dumps(eng.state_dict()))
    fresh = term(FakeProposer(), RegexJudge())
    fresh.load_state_dict(state)
    anyio.run(score, fresh, hacked_batch(5))
    assert [p.title for p in fresh.buffer.all()] == ["Opens with Zounds"] and fresh.metrics()["proposer/pending"] == 1
    anyio.run(score, fresh, hacked_batch(6))
    assert [p.created_step for p in fresh.buffer.all()] == [5, 6] and fresh.pending == []


def test_an_older_checkpoint_with_one_pending_candidate_still_loads():
    eng = term(FakeProposer(), RegexJudge())
    state = json.loads(json.dumps(eng.state_dict()))
    state.update(pending=candidate().to_dict(), pending_step=4)
    del state["in_flight"]
    eng.load_state_dict(state)
    assert [(r.step, r.accepted.title) for r in eng.pending] == [(4, "Opens with Zounds")]


def start_then_finish(proposer, **cfg):
    """Score and observe batch 0 (a proposal starts), then end the run at once (`finish`)."""
    async def main():
        eng = term(proposer, RegexJudge(), every=1, **cfg)
        async with anyio.create_task_group() as tg:
            batch = hacked_batch(0)
            await score(eng, batch)
            eng.observe(batch, tg)
            await eng.finish()
        return eng

    return anyio.run(main)


def test_by_default_the_run_end_waits_for_no_proposal_and_keeps_it_for_a_resume():
    eng = start_then_finish(GatedProposer(candidate()))  # never released: a wait would never end
    m = eng.metrics()
    assert m["proposer/cancelled"] == 1 and m["proposer/accepted"] == 0 and not eng.in_flight
    assert eng.state_dict()["in_flight"]["step"] == 0  # the last checkpoint keeps what it was asked


def test_with_a_finish_timeout_the_run_end_waits_for_a_proposal_in_flight():
    eng = start_then_finish(FakeProposer(candidate(), delay=0.2), finish_timeout=600)
    m = eng.metrics()
    assert m["proposer/accepted"] == 1 and m["proposer/pending"] == 1 and m["proposer/cancelled"] == 0
    assert eng.state_dict()["pending"][0]["candidate"]["title"] == "Opens with Zounds"


def test_a_proposal_past_the_finish_timeout_is_cancelled_counted_and_proposed_again_on_resume():
    prop = GatedProposer(candidate())  # never released
    eng = start_then_finish(prop, finish_timeout=0.05)
    assert eng.metrics()["proposer/cancelled"] == 1 and not eng.in_flight
    state = json.loads(json.dumps(eng.state_dict()))
    assert state["in_flight"]["step"] == 0

    again = FakeProposer(candidate())
    fresh = term(again, RegexJudge(), every=5)
    fresh.load_state_dict(state)

    async def resumed():
        async with anyio.create_task_group() as tg:
            batch = hacked_batch(1)
            await score(fresh, batch)
            fresh.observe(batch, tg)  # step 1 is off the schedule: the unfinished proposal runs anyway
        await score(fresh, hacked_batch(2))

    anyio.run(resumed)
    assert [v.step for v in again.views] == [0] and again.views[0].samples == prop.views[0].samples
    assert fresh.totals["proposer/restarted"] == 1 and fresh.buffer.get("p001").created_step == 2


def test_a_state_dict_taken_mid_proposal_keeps_its_view():
    prop = GatedProposer(candidate())

    async def main():
        eng = term(prop, RegexJudge(), every=1)
        async with anyio.create_task_group() as tg:
            batch = hacked_batch(0)
            await score(eng, batch)
            eng.observe(batch, tg)
            await _until(lambda: bool(prop.views))  # the proposal is running, held at its gate
            state = eng.state_dict()
            prop.gates[0].set()
        return state

    state = anyio.run(main)
    assert state["in_flight"]["step"] == 0 and len(state["in_flight"]["samples"]) == len(prop.views[0].samples)


# --- unsafe regexes and failure counters (issue 21) -----------------------------------------------

@pytest.mark.timeout(60)
def test_a_penalty_whose_regex_stalls_is_retired_and_counted():
    buf = PenaltyBuffer()
    buf.add(Candidate("Runs of a", "d", [], r"(a|aa)+$"), step=0)
    buf.add(candidate(), step=1)
    eng = term(FakeProposer(), RegexJudge(), buf)
    batch = hacked_batch(2)
    slow = batch.groups[0][2]
    slow.replies, slow.turns = ["a" * 60 + "!"], [Message("assistant", "a" * 60 + "!")]
    events = anyio.run(score, eng, batch)["penalties"]
    assert [p.id for p in buf.active()] == ["p002"]
    [retire] = [e for e in events if e["event"] == "retire"]
    assert retire["id"] == "p001" and retire["reason"] == "unusable_regex" and "too slow" in retire["why"]
    m = eng.metrics()
    assert m["judge/regex_timeouts"] == 1 and m["penalties/retires"] == 1
    assert batch.groups[0][0].info["judge_failed"] == ["p001"] and batch.groups[0][0].info["violations"] == 1


def test_proposer_failures_are_counted_by_stage_and_regex_timeouts_too():
    class Failing:
        async def propose(self, view):
            return ProposalResult(step=view.step, error="ProposalReplyError: no verdict for c2",
                                  failed_at="dedup", regex_timeouts=2, rejected={"slow_regex": 2})

    async def main():
        eng = term(Failing(), RegexJudge(), every=1)
        async with anyio.create_task_group() as tg:
            eng.observe(hacked_batch(0), tg)
        return eng

    m = anyio.run(main).metrics()
    assert m["proposer/failed"] == 1 and m["proposer/failed/dedup"] == 1
    assert m["proposer/regex_timeouts"] == 2 and m["proposer/rejected/slow_regex"] == 2


def test_a_zero_finish_timeout_cancels_the_proposal_in_flight_at_once():
    eng = start_then_finish(GatedProposer(candidate()), finish_timeout=0)  # before the proposal task ever ran
    assert eng.totals["proposer/cancelled"] == 1 and eng.state_dict()["in_flight"]["step"] == 0


# --- failures are never silent (issue 12) ---------------------------------------------------------

def llm_penalty_term(answer, **judge_cfg):
    """A term whose one semantic penalty (p001) is judged by `answer(reply text)`, one attempt per call."""
    def chat(msgs):
        return answer(msgs[1].content.split("<reply-", 1)[1])

    buf = PenaltyBuffer()
    buf.add(Candidate("Flatters", "Praises the question.", []), step=0)
    jc = JudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"}, retries=1, **judge_cfg)
    return PenaltyTerm(PenaltiesConfig(enabled=True, judge=jc), FakeProposer(), Judge(ScriptedChatModel(chat), jc), buf)


def test_a_failed_verdict_marks_the_rollout_unscored_never_clean():
    eng = llm_penalty_term(lambda reply: "not json at all" if "number 1" in reply else '{"p001": true}')
    batch = hacked_batch(step=3, n_groups=2)
    anyio.run(score, eng, batch)
    for g in batch.groups:
        for r in g:
            bad = "number 1" in r.replies[0]
            assert r.info["judge_failed"] == (["p001"] if bad else [])
            assert r.info.get("unscored") == (["penalties"] if bad else None)
            assert r.info["violations"] == (0 if bad else 1)
    m = eng.metrics()
    assert (m["judge/verdicts"], m["judge/failed_verdicts"], m["judge/failure_rate"]) == (8, 4, 0.5)
    assert m["judge/verdicts_total"] == 8 and m["judge/failed_verdicts_total"] == 4


def test_judge_failing_more_than_the_rate_over_the_window_stops_the_run():
    answers = iter(["{}"] * 8 + ['{"p001": true}'] * 24)  # step 0: every verdict fails; then none
    eng = llm_penalty_term(lambda reply: next(answers), failure_window=2, max_failure_rate=0.4, reasks=0)  # a call per answer
    reasons = []
    for step in range(4):
        anyio.run(score, eng, hacked_batch(step, n_groups=2))
        reasons.append(eng.stop_reason())
    # windows of 2 judged steps: [100%] not full yet, [100%, 0%] = 50% > 40%, then 0%: go on
    assert reasons[0] is None and reasons[2] is None and reasons[3] is None
    assert reasons[1].startswith("the judge failed 8 of 16 verdicts (50%) over the last 2 judged steps")
    assert "max_failure_rate=0.4" in reasons[1] and "last error:" in reasons[1]


def test_proposer_failing_proposal_after_proposal_stops_the_run():
    cfg = PenaltiesConfig(enabled=True, every=1, proposer={"max_failed_proposals": 3})
    eng = PenaltyTerm(cfg, FakeProposer(error=RuntimeError("HTTP 401 invalid key")), RegexJudge())
    reasons = drive(eng, 5, lambda e: e.stop_reason())
    assert reasons[:2] == [None, None]
    assert reasons[2:] == ["the proposer failed its last 3 proposals (penalties.proposer.max_failed_proposals=3); "
                           "last error: RuntimeError: HTTP 401 invalid key"] * 3
    m = eng.metrics()  # exact: no proposal started after the third failure, however many steps ran
    assert m["proposer/failed_total"] == 3 and m["proposer/finished_total"] == 3 and eng.totals["proposer/started"] == 3


def test_the_stop_rule_is_exact_when_failures_land_faster_than_the_stop_is_checked():
    cfg = PenaltiesConfig(enabled=True, every=1, proposer={"max_failed_proposals": 2})
    prop = FakeProposer(error=RuntimeError("HTTP 500"))
    eng = PenaltyTerm(cfg, prop, RegexJudge())

    async def main():  # every proposal fails before the next observe; stop_reason is read only at the end
        async with anyio.create_task_group() as tg:
            for step in range(5):
                batch = hacked_batch(step)
                await score(eng, batch)
                eng.observe(batch, tg)
                await _until(lambda: not eng.in_flight)

    anyio.run(main)
    assert len(prop.views) == 2
    assert eng.stop_reason().startswith("the proposer failed its last 2 proposals (penalties.proposer.max_failed")


def test_log_lines_name_the_steps_penalties_jsonl_names():
    """One step convention everywhere: the console's `penalty.add` and `proposer.accepted` lines say
    the step (and proposed_at) that penalties.jsonl says, not the batch number one lower."""
    from structlog.testing import capture_logs

    from dynalize.loop import step_labelled

    async def main():
        eng = term(FakeProposer(candidate()), RegexJudge(), every=5, sync=True)
        written = []
        async with anyio.create_task_group() as tg:
            for step in range(8):
                batch = hacked_batch(step)
                events = await score(eng, batch)
                written += [step_labelled(e, step) for e in events.get(eng.name, [])]
                eng.observe(batch, tg)
        return written

    with capture_logs() as logs:
        written = anyio.run(main)
    added = [(e["step"], e["proposed_at"]) for e in written if e.get("event") == "add"]
    lines = [(e["step"], e["proposed_at"]) for e in logs if e["event"] == "penalty.add"]
    assert added and lines == added
    accepted = [e["step"] for e in logs if e["event"] == "proposer.accepted"]
    assert accepted[: len(added)] == [proposed for _, proposed in added]
