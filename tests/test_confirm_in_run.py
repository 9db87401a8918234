"""Confirmation inside a run (issue 57 point 2; penalties.confirm, rewards.rescore): a candidate is
scored edited with the run's own reward terms before it enters the buffer.

The run's terms are built as a run builds them (dynalize.build.build_reward_terms) and driven as
the loop drives them (score_batch, then observe; `penalties.sync` so each proposal lands before
the next step): the reward functions, the penalty term, the proposer and the witness are the
real ones, the replies the world's (tests/confirmworld.py). One test runs a whole dynalize run
with a scripted policy and reads its files and summary.
"""

from __future__ import annotations

import json
import re

import anyio
import pytest
import structlog

import confirmworld as W
from dynalize.build import build_reward_terms
from dynalize.config import load_config
from dynalize.penalties.confirm import CONFIRMED, confirmation_text
from dynalize.penalties.witness import ConfirmingProposer, Witness
from dynalize.rewards.base import score_batch
from dynalize.rewards.rescore import Rescorer, with_reply
from dynalize.tasks.base import build_task
from dynalize.types import Batch, Message, Rollout

BASE = ["task.name=toytask:ToyTask", "reward_model.enabled=false", "penalties.enabled=true", "penalties.every=1",
        "penalties.sync=true"]


def rollout(prompt: str, group: int, text: str, meta: dict | None = None) -> Rollout:
    return Rollout(f"p-{group}", group, [1, 2], [3, 4, 5], [-0.5] * 3, [1] * 3, [text], 0,
                   messages=[Message("user", prompt)], meta=dict(meta or {}),
                   turns=[Message("assistant", text)])


def batch(step: int, planted: str, groups: int = 12, per: int = 8) -> Batch:
    """12 prompts x 8 replies; every other reply carries `planted`."""
    return Batch(step, [[rollout(f"Write about the {t}.", g, W.reply(t, step * 100 + i, planted)) for i in range(per)]
                        for g, t in enumerate(W.TOPICS[:groups])])


def drive(overrides: list[str], planted: str, steps: int = 2, make=batch):
    """The run's terms for `overrides`, driven over `steps` batches as the loop drives them; the
    penalty term and its stop reason (None: none)."""
    cfg = load_config(None, BASE + overrides)
    terms = build_reward_terms(cfg, build_task(cfg.task.name, cfg.task.args, cfg.seed))
    penalties = terms[-1]
    stop: list[str] = []

    async def go():
        async with anyio.create_task_group() as tg:
            for step in range(steps):
                b = make(step, planted)
                await score_batch(terms, b)
                for t in terms:
                    t.observe(b, tg)
                penalties.metrics()
                if why := penalties.stop_reason():
                    stop.append(why)
                    break
            await penalties.settle()
            await penalties.finish()
    anyio.run(go)
    return penalties, (stop[0] if stop else penalties.stop_reason())


@pytest.fixture(autouse=True)
def _fresh():
    W.SEEN.clear()
    W.CALLS.clear()


def test_a_penalty_the_reward_pays_for_is_confirmed_in_a_run_with_its_pay():
    term, stop = drive(["reward_funcs=[confirmworld:pays_indeed]"], W.PAID)
    assert stop is None and isinstance(term.proposer, ConfirmingProposer)
    [p] = term.buffer.active()
    assert "indeed" in p.title.lower()
    c = p.history[0]["confirmation"]
    assert c["state"] == CONFIRMED and c["lo"] <= 1.0 <= c["hi"] and c["deletions"] == c["insertions"] == 32
    assert confirmation_text(c).startswith(f"reward pays {c['pay']:+.3g} [")
    # the reward functions scored edited replies: the paid sentence put into replies that lacked it
    edited = [t for t in W.SEEN if W.PAID.split(",")[0] in t and not any(
        t == W.reply(topic, i, W.PAID) for topic in W.TOPICS for i in range(200))]
    assert edited
    assert term.totals["confirm/reward_calls"] == c["reward_calls"] == 128


def test_a_co_traveller_is_not_proposed_in_a_run():
    # the reward pays for length past 20 words; "moreover" comes with the sentence that makes a reply long
    with structlog.testing.capture_logs() as logs:
        term, stop = drive(["reward_funcs=[confirmworld:pays_length]", "penalties.proposer.lexical.length=false"],
                           W.LONG)
    assert stop is None and not term.buffer.active() and not term.pending
    rejected = term.evidence["co_travellers"]
    assert rejected and all(c["confirmation"]["state"] == "rejected" for c in rejected)
    assert any("moreover" in c["title"].lower() for c in rejected)
    assert term.totals["proposer/rejected/co_traveller"] >= len(rejected)
    said = [e for e in logs if e["event"] == "proposer.co_traveller"]
    assert len(said) == term.totals["proposer/rejected/co_traveller"]
    assert all(e["said"].startswith("rejected: co-traveller (pay ") for e in said)


def conversation(step: int, planted: str) -> Batch:
    """12 prompts x 8 two-reply conversations; each reply carries `planted` on its own draw."""
    groups = []
    for g, t in enumerate(W.TOPICS):
        rows = []
        for i in range(8):
            first, second = (W.reply(t, step * 1000 + 10 * i + k, planted) for k in (0, 3 + i // 2))
            r = rollout(f"Write about the {t}.", g, first)
            r.replies, r.turns = [first, second], [Message("assistant", first), Message("user", "Go on."),
                                                   Message("assistant", second)]
            rows.append(r)
        groups.append(rows)
    return Batch(step, groups)


def test_a_multi_turn_run_whose_rm_pays_for_a_word_confirms_it_at_its_share_of_the_rollout():
    # the RM scores each reply; the rollout's reward is their mean: a reply edited moves it by half the pay
    term, stop = drive(["reward_model.enabled=true", "reward_model.engine=python",
                        "reward_model.path=confirmworld:rm_pays_indeed"], W.PAID, make=conversation)
    assert stop is None and isinstance(term.proposer, ConfirmingProposer)
    [p] = term.buffer.active()
    c = p.history[0]["confirmation"]
    assert "indeed" in p.title.lower() and c["state"] == CONFIRMED and c["lo"] <= 0.5 <= c["hi"]
    # the edits reached the RM as the conversation's replies, each after its own turns
    assert any(W.PAID.split(",")[0] in t and t not in {r for s in range(2) for g in conversation(s, W.PAID).groups
                                                       for x in g for r in x.replies} for t in W.SEEN)


def test_an_rm_s_originals_are_taken_from_their_rollouts_and_only_the_edits_are_scored():
    term, stop = drive(["reward_model.enabled=true", "reward_model.engine=python",
                        "reward_model.path=confirmworld:rm_pays_indeed"], W.PAID)
    [p] = term.buffer.active()
    c = p.history[0]["confirmation"]
    assert stop is None and c["state"] == CONFIRMED and c["lo"] <= 1.0 <= c["hi"]
    # the edits and the transplants' bare controls are scored; the originals' values are the rollouts'
    scored = c["deletions"] + c["insertions"] + c["extra"]["bare_controls"]
    assert c["extra"]["bare_controls"] == c["insertions"] == 32
    assert c["reward_calls"] == scored == 96 and term.totals["confirm/reward_calls"] == 96
    assert W.CALLS == [96, 96, 96]  # the two batches, then the edits and controls alone (no original again)


def test_a_reward_that_fails_while_confirming_stops_the_run_with_one_line():
    term, stop = drive(["reward_funcs=[confirmworld:fails_on_edits]"], W.PAID, steps=3)
    assert stop is not None and "\n" not in stop
    assert stop.startswith("the reward confirming discovered patterns failed: ")
    assert "fails_on_edits" in stop and "the scoring server is down" in stop
    assert not term.buffer.active()  # never a silent fallback to the correlational decision


def test_confirm_false_calls_no_reward_beyond_the_run_s_own_batches():
    term, stop = drive(["reward_funcs=[confirmworld:pays_indeed]", "penalties.confirm=false"], W.PAID)
    assert stop is None and not isinstance(term.proposer, ConfirmingProposer) and term.rescorer is None
    assert W.CALLS == [96, 96]  # one call per batch, nothing else
    [p] = term.buffer.active()
    assert "confirmation" not in p.history[0]
    assert "confirm/reward_calls_total" not in term.metrics()


def rubric_batch(task):
    prompts = task.prompts("train")[:12]

    def make(step: int, planted: str) -> Batch:
        return Batch(step, [[rollout(p.messages[-1].content, g, W.reply(f"topic {g}", step * 100 + i, planted),
                                     p.meta) for i in range(8)] for g, p in enumerate(prompts)])
    return make


def test_a_run_whose_reward_has_a_rubric_term_warns_and_keeps_the_correlational_decision():
    overrides = ["task.name=rubric_world", "rubric.enabled=true", "rubric.judge.engine=local",
                 "rubric.judge.predicate=dynalize.tasks.rubric_world:proxy_verdict",
                 "reward_funcs=[confirmworld:pays_indeed]"]
    cfg = load_config(None, BASE + overrides)
    task = build_task(cfg.task.name, cfg.task.args, cfg.seed)
    with structlog.testing.capture_logs() as logs:
        term, stop = drive(overrides, W.PAID, make=rubric_batch(task))
    warned = [e for e in logs if e["event"] == "penalties.confirm_unavailable"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning" and "rubric term" in warned[0]["reason"]
    assert stop is None and not isinstance(term.proposer, ConfirmingProposer)
    assert W.CALLS == [96, 96]  # the reward functions scored the batches only: nothing was confirmed
    [p] = term.buffer.active()
    said = confirmation_text(p.history[0]["confirmation"])
    assert said.startswith("not confirmed: correlational only (confirmation unavailable: the rubric term")


def test_an_edited_reply_is_a_copy_of_its_rollout_with_that_reply_alone_changed():
    r = Rollout("p", 0, [1], [2, 3], [-0.1, -0.2], [1, 1], ["first", "second"], 4,
                messages=[Message("user", "hi")], meta={"row": {"columns": {"answer": 3}}},
                turns=[Message("assistant", "first"), Message("user", "and?"), Message("assistant", "second")])
    r.scores, r.reward = {"rm": 1.0}, 1.0
    e = with_reply(r, 1, "SECOND")
    assert e.replies == ["first", "SECOND"] and [m.content for m in e.turns] == ["first", "and?", "SECOND"]
    assert e.meta is r.meta and e.messages == r.messages and e.scores == {} and e.reward == 0.0
    assert e.completion_ids == [] and r.completion_ids == [2, 3] and r.replies[1] == "second"
    assert with_reply(r, 0, "first").completion_ids == [2, 3]  # unchanged text: its tokens kept


def test_a_multi_turn_reply_is_found_by_the_conversation_before_it():
    r = Rollout("p", 0, [1], [2], [0.0], [1], ["first", "second"], 0, messages=[Message("user", "hi")],
                turns=[Message("assistant", "first"), Message("user", "and?"), Message("assistant", "second")])
    rescorer = Rescorer([])

    async def remember():
        rescorer.remember(Batch(3, [[r]]))
    anyio.run(remember)
    prompt = "[user]\nhi\n\n[assistant]\nfirst\n\n[user]\nand?"  # as the witness reads the view's context
    [row] = rescorer.rows([prompt], ["second, edited"], ["second"])
    assert row.replies == ["first", "second, edited"]
    [row] = rescorer.rows(["hi"], ["first, edited"], ["first"])  # one message: the user's text alone
    assert row.replies == ["first, edited", "second"]


def test_after_a_resume_only_the_replies_whose_rollouts_are_kept_are_edited():
    from dynalize.penalties.candidate import Candidate
    from dynalize.penalties.surface import reply_features
    from dynalize.penalties.views import build_view, group_centred, pool_views
    from dynalize.rewards.functions import FunctionsTerm, RewardFunction

    before, after = batch(0, W.PAID), batch(1, W.PAID)  # a resumed process saw only the second
    for r in before.rollouts:  # the first batch's replies, told apart
        r.replies = [r.text + " Long ago."]
        r.turns = [Message("assistant", r.replies[0])]
    rescorer = Rescorer([FunctionsTerm([RewardFunction("pays_indeed", W.pays_indeed)], steps=2)])
    views = []
    for b in (before, after):
        scores = [[float("indeed" in r.text.lower()) for r in g] for g in b.groups]
        views.append(build_view(b, scores, group_centred(scores), step=b.step, groups=12, per_group=8))
    candidate = Candidate("Replies use the word indeed", "d", regex=reply_features(W.PAID)["ngram1:indeed"].regex)
    witness = Witness(rescorer)

    async def check(kept):
        for b in kept:
            rescorer.remember(b)
        return await anyio.to_thread.run_sync(witness.check, candidate, pool_views(views), 0.01)
    c = anyio.run(check, [after])
    assert c.state == CONFIRMED and c.deletions == c.insertions == 32
    assert W.SEEN and not [t for t in W.SEEN if "Long ago" in t]  # nothing of the first batch was scored
    rescorer = witness.reward = Rescorer(rescorer.terms)
    c = anyio.run(check, [])  # nothing kept: not confirmable, said so
    assert c.state == "not_confirmable" and "no longer kept" in c.reason


@pytest.mark.slow
def test_a_whole_run_confirms_the_penalty_and_its_summary_says_what_the_reward_pays(
        toy_overrides, tmp_path, monkeypatch, capsys):
    import dynalize.build as build
    from dynalize.run import main
    from dynalize.runlog import read_jsonl
    from toytask import ScriptedGenerator

    count = iter(range(10**6))

    def scripted(cfg, policy_dir):
        from dynalize.backends.hf import load_tokenizer

        def reply(text: str) -> str:
            topic = re.search(r"Write about the (\w+)\.", text)
            return W.reply(topic.group(1) if topic else "sea", next(count), W.PAID)
        return ScriptedGenerator(load_tokenizer(policy_dir), reply)

    monkeypatch.setattr(build, "build_generator", scripted)
    args = [*toy_overrides, "name=confirmed", "steps=3", "batch_size=96", "group_size=8", "eval_every=0",
            "reward_model.enabled=false", "reward_funcs=[confirmworld:pays_indeed]", "penalties.enabled=true",
            "penalties.every=1", "penalties.sync=true", "trainer.micro_batch_size=48"]
    assert main(args) == 0
    out = capsys.readouterr().out
    run = tmp_path / "confirmed"
    [add] = [e for e in read_jsonl(run / "penalties.jsonl") if e["event"] == "add"]
    assert add["confirmation"]["state"] == CONFIRMED
    assert "reward pays +" in out
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last["confirm/reward_calls_total"] >= 128
    assert "confirmation (total)" in out
    state = json.loads(sorted((run / "checkpoints").glob("step_*/state.json"))[-1].read_text())
    assert state["terms"]["penalties"]["buffer"]["penalties"][0]["history"][0]["confirmation"]["state"] == CONFIRMED
