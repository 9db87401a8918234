"""The rubric term: HealthBench scoring of judged replies, one keep-mask per group, the full-rubric
reward logged next to the masked one, POW3R-style weights, the one judge's call accounting, and
the proxy/gold measurement with the reviewers' anchor check."""

from __future__ import annotations

import json
import re

import anyio
import pytest

from dynalize.backends.chat import ScriptedChatModel
from dynalize.judge.judge import RUBRIC_PROMPT, Judge
from dynalize.rewards import RubricTerm, score_batch
from dynalize.rewards.rubric import rubric_key
from dynalize.rubrics.config import RubricConfig, RubricJudgeConfig
from dynalize.rubrics.criteria import Criterion, rubric_score
from dynalize.types import Batch, Message, Rollout

RUBRIC = [Criterion("a", "Mentions apples", 5), Criterion("b", "Mentions bread", 3),
          Criterion("c", "Mentions cheese", 2), Criterion("d", "Mentions dates", 2),
          Criterion("e", "Mentions eggs", 1), Criterion("x", "Is rude", -4, ("safety",))]


def mentions(reply: str, criterion: Criterion, context: str | None) -> bool:
    """A rule-based judge: a criterion is met when the reply has its last word."""
    return criterion.text.split()[-1].lower() in reply.lower()


def rollout(group: int, replies: list[str] | str, rubric=RUBRIC, prompt_id: str | None = None) -> Rollout:
    replies = [replies] if isinstance(replies, str) else replies
    turns = []
    for k, r in enumerate(replies):
        if k:
            turns.append(Message("user", "and?"))
        turns.append(Message("assistant", r))
    return Rollout(prompt_id=prompt_id or f"q{group}", group=group, prompt_ids=[1], completion_ids=[2],
                   logprobs=[0.0], loss_mask=[1], replies=replies, policy_version=0,
                   messages=[Message("user", "Say food.")], meta={"rubric": [c.to_dict() for c in rubric]},
                   turns=turns)


TEXTS = ["apples and bread", "cheese, rude", "dates eggs apples", "nothing at all"]


def batch(step: int = 3, n_groups: int = 6) -> Batch:
    return Batch(step, [[rollout(g, t) for t in TEXTS] for g in range(n_groups)])


def make_term(judge=None, gold=None, steps: int = 100, **cfg) -> RubricTerm:
    return RubricTerm(RubricConfig(enabled=True, **cfg), judge or Judge(predicate=mentions, prompt=RUBRIC_PROMPT),
                      gold, steps=steps)


def test_fixed_rubric_reward_is_healthbench_score_of_the_verdicts():
    term = make_term(coef=2.0)
    b = batch()
    anyio.run(score_batch, [term], b)
    for r in b.rollouts:
        met = {c.id: mentions(r.replies[0], c, None) for c in RUBRIC}
        assert r.scores["rubric"] == pytest.approx(2.0 * rubric_score(RUBRIC, met))
        assert r.info["rubric_full"] == pytest.approx(rubric_score(RUBRIC, met)) and r.info["rubric_dropped"] == []
    m = term.metrics()
    assert m["rubric/full"] == pytest.approx(m["rubric/masked"]) and m["rubric/kept_frac"] == 1.0
    assert m["rubric/f"] == 0.0 and m["rubric/met/a"] == 0.5 and m["rubric/met/tag:safety"] == 0.25


def test_one_mask_per_group_reward_over_kept_criteria_full_reward_still_logged():
    term = make_term(dropout={"f": 0.5, "min_keep": 2})
    b = batch(n_groups=12)
    anyio.run(score_batch, [term], b)
    masks = set()
    for g in b.groups:
        dropped = {tuple(r.info["rubric_dropped"]) for r in g}
        assert len(dropped) == 1  # every rollout of the group shares the mask
        kept = {c.id for c in RUBRIC} - set(dropped.pop())
        masks.add(frozenset(kept))
        assert "x" in kept and sum(c.weight > 0 and c.id in kept for c in RUBRIC) >= 2
        for r in g:
            met = r.info["rubric_verdicts"][0]
            assert set(met) == {c.id for c in RUBRIC}  # the judge saw the whole rubric
            assert r.scores["rubric"] == pytest.approx(rubric_score(RUBRIC, met, keep=kept))
            assert r.info["rubric_full"] == pytest.approx(rubric_score(RUBRIC, met))
    assert len(masks) > 1
    m = term.metrics()
    assert 0 < m["rubric/kept_frac"] < 1 and m["rubric/f"] == 0.5 and "rubric/full" in m
    # the same instance at the same step, scored again by a fresh term in another order: same masks
    again = batch(n_groups=12)
    again.groups.reverse()
    anyio.run(score_batch, [make_term(dropout={"f": 0.5, "min_keep": 2})], again)
    assert {g[0].prompt_id: g[0].info["rubric_dropped"] for g in b.groups} == \
        {g[0].prompt_id: g[0].info["rubric_dropped"] for g in again.groups}


def llm_judge(calls: list[list[str]]):
    """A scripted LLM judge answering from the listed criteria: met when the reply has the criterion's last word."""
    def reply(messages):
        user = messages[1].content
        listed = re.findall(r"^- (c\d+): (.*)$", user, flags=re.M)
        text = user.split("<reply-")[1].split(">", 1)[1].split("</reply-")[0]
        calls.append([t for _, t in listed])
        return json.dumps({k: t.split()[-1].lower() in text.lower() for k, t in listed})
    return Judge(ScriptedChatModel(reply), RubricJudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"}),
                 prompt=RUBRIC_PROMPT)


def test_dropout_adds_no_judge_calls_and_asks_the_same_questions():
    fixed_calls: list[list[str]] = []
    drop_calls: list[list[str]] = []
    fixed, drop = make_term(llm_judge(fixed_calls)), make_term(llm_judge(drop_calls), dropout={"f": 0.5})
    b1, b2 = batch(), batch()
    anyio.run(score_batch, [fixed], b1)
    anyio.run(score_batch, [drop], b2)
    assert len(fixed_calls) == len(drop_calls) == len(b1.rollouts)
    assert sorted(map(tuple, fixed_calls)) == sorted(map(tuple, drop_calls))  # the full rubric each time
    assert [r.info["rubric_verdicts"] for r in b1.rollouts] == [r.info["rubric_verdicts"] for r in b2.rollouts]
    assert fixed.metrics()["rubric_judge/calls"] == drop.metrics()["rubric_judge/calls"] == len(b1.rollouts)


def test_judge_dropped_false_asks_only_kept_criteria_and_logs_no_full_reward():
    calls: list[list[str]] = []
    term = make_term(llm_judge(calls), dropout={"f": 0.5, "min_keep": 2}, judge_dropped=False)
    b = batch()
    anyio.run(score_batch, [term], b)
    by_group = {}
    for g in b.groups:
        kept = [c.text for c in RUBRIC if c.id not in g[0].info["rubric_dropped"]]
        by_group[tuple(sorted(kept))] = True
        assert all(r.info["rubric_full"] is None for r in g)
    assert {tuple(sorted(c)) for c in calls} <= set(by_group)
    assert "rubric/full" not in term.metrics()


def test_multi_turn_rollout_scores_the_mean_over_its_replies():
    term = make_term()
    r = rollout(0, ["apples", "bread and cheese"])
    b = Batch(0, [[r, rollout(0, "nothing")]])
    anyio.run(score_batch, [term], b)
    first = rubric_score(RUBRIC, {"a": True})
    second = rubric_score(RUBRIC, {"b": True, "c": True})
    assert r.scores["rubric"] == pytest.approx((first + second) / 2)
    assert len(r.info["rubric_verdicts"]) == 2


def test_failed_verdicts_are_counted_and_never_silent():
    def flaky(reply, criterion, context):
        if criterion.id == "c":
            raise RuntimeError("checker broke")
        return mentions(reply, criterion, context)

    term = make_term(Judge(predicate=flaky, prompt=RUBRIC_PROMPT))
    b = batch(n_groups=2)
    anyio.run(score_batch, [term], b)
    m = term.metrics()
    assert m["rubric/failed_verdicts"] == len(b.rollouts) and m["rubric_judge/failures"] == len(b.rollouts)
    assert all(r.info["rubric_failed"] == ["c"] and r.info["rubric_full"] is None for r in b.rollouts)
    assert m["rubric/failed_verdicts_total"] == len(b.rollouts)


def test_pow3r_port_reweights_within_the_group_and_the_full_form_lags_and_checkpoints():
    port = make_term(reweight={"method": "pow3r_port"})
    b = batch(n_groups=1)
    anyio.run(score_batch, [port], b)
    fixed = batch(n_groups=1)
    anyio.run(score_batch, [make_term()], fixed)
    assert [r.scores["rubric"] for r in b.rollouts] != pytest.approx([r.scores["rubric"] for r in fixed.rollouts])
    assert port.metrics()["rubric/weight_shift"] > 0
    full = make_term(reweight={"method": "pow3r", "category_prefix": None})
    first = batch(n_groups=1)
    anyio.run(score_batch, [full], first)
    assert [r.scores["rubric"] for r in first.rollouts] == pytest.approx([r.scores["rubric"] for r in fixed.rollouts])
    state = json.loads(json.dumps(full.state_dict()))
    second = batch(step=4, n_groups=1)
    anyio.run(score_batch, [full], second)
    resumed = make_term(reweight={"method": "pow3r", "category_prefix": None})
    resumed.load_state_dict(state)
    again = batch(step=4, n_groups=1)
    anyio.run(score_batch, [resumed], again)
    assert [r.scores["rubric"] for r in again.rollouts] == [r.scores["rubric"] for r in second.rollouts]
    assert [r.scores["rubric"] for r in second.rollouts] != pytest.approx([r.scores["rubric"] for r in fixed.rollouts])


def test_pow3r_with_judge_dropped_false_never_reads_unasked_criteria_as_unmet():
    term = make_term(dropout={"f": 0.5, "min_keep": 2}, judge_dropped=False,
                     reweight={"method": "pow3r", "category_prefix": None})
    everything = "apples bread cheese dates eggs"
    for step in range(6):  # every asked criterion splits every group evenly: no factor may move
        anyio.run(score_batch, [term], Batch(step, [[rollout(g, t) for t in (everything, "no", everything, "no")]
                                                    for g in range(3)]))
    factors = [v for d in term.reweighter.smoothed.values() for v in d.values()]
    assert factors and factors == pytest.approx([1.0] * len(factors))


def test_pow3r_port_with_min_factor_0_scores_groups_whose_kept_criteria_are_saturated():
    term = make_term(dropout={"f": 0.5, "min_keep": 1}, reweight={"method": "pow3r_port", "min_factor": 0.0})
    step = next(s for s in range(100) if len(term.mask(RUBRIC, "q0", s).kept) < len(RUBRIC))
    kept = term.mask(RUBRIC, "q0", step).kept
    words = {c.id: c.text.split()[-1] for c in RUBRIC if c.weight > 0}
    all_kept = " ".join(w for k, w in words.items() if k in kept)
    everything = " ".join(words.values())
    b = Batch(step, [[rollout(0, t) for t in (all_kept, everything, all_kept, everything)]])
    anyio.run(score_batch, [term], b)  # kept ones saturated (factor 0), dropped ones split
    assert [r.scores["rubric"] for r in b.rollouts] == [1.0] * 4  # human weights over the kept criteria


def test_evaluation_grades_with_proxy_and_gold_and_rechecks_anchor_replies():
    lenient = Judge(predicate=lambda r, c, x: c.id == "a" or mentions(r, c, x), prompt=RUBRIC_PROMPT)
    seen: list[str] = []
    drift = {"on": False}

    def gold_fn(reply, criterion, context):
        seen.append(reply)
        return mentions(reply, criterion, context) != (drift["on"] and criterion.id == "e")

    term = make_term(lenient, Judge(predicate=gold_fn, prompt=RUBRIC_PROMPT), eval_anchors=3)
    b = batch(n_groups=2)
    out = anyio.run(term.evaluate, b)
    assert out["rubric/proxy"] > out["rubric/gold"] and out["rubric/gap"] == pytest.approx(out["rubric/proxy"] - out["rubric/gold"])
    assert out["rubric/overclaim"] == pytest.approx(2 / 8)  # per group: "a" credited on 2 replies without apples, of 8 claims
    assert out["rubric/anchor_flips"] == 0.0 and len(term.anchors) == 3 and out["rubric/anchors"] == 3
    r = b.rollouts[1]
    assert r.info["proxy_verdicts"][0]["a"] is True and r.info["gold_verdicts"][0]["a"] is False
    new = Batch(10, [[rollout(g, "bread only") for _ in range(4)] for g in range(2)])
    seen.clear()
    drift["on"] = True  # a gold judge that changed its mind about "e" on identical text
    out2 = anyio.run(term.evaluate, new)
    anchor_texts = {a["text"] for a in term.anchors}
    assert sum(t in anchor_texts for t in seen) == 3 * len(RUBRIC)  # each anchor re-graded once
    assert out2["rubric/anchor_flips"] == pytest.approx(1 / len(RUBRIC))
    restored = make_term(lenient, Judge(predicate=gold_fn, prompt=RUBRIC_PROMPT), eval_anchors=3)
    restored.load_state_dict(json.loads(json.dumps(term.state_dict())))
    assert restored.anchors == term.anchors


def test_anchors_are_interleaved_with_new_replies():
    from dynalize.rewards.rubric import _interleave

    assert _interleave([1, 2, 3], ["a"]) == [1, "a", 2, 3] and _interleave([1], ["a", "b"]) == [1, "a", "b"]


def test_the_cache_key_changes_with_the_rubric():
    assert rubric_key(RUBRIC) != rubric_key(RUBRIC[:-1])
    assert rubric_key(RUBRIC) == rubric_key([Criterion.from_dict(c.to_dict()) for c in RUBRIC])
