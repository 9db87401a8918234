"""The rubric term's judges running a benchmark's protocol (`rubric.gold_judge.protocol`): the
HealthBench protocol asks once per criterion with the official template and its gold is the
HealthBench score; the ResearchQA protocol asks in batches of 8 and its graded verdicts score as
their level's value; what each protocol costs (requests, characters) is logged per evaluation."""

from __future__ import annotations

import json
import re

import anyio
import pytest

from dynalize.backends.chat import ScriptedChatModel
from dynalize.build import build_criteria_judge
from dynalize.judge.healthbench import HealthBenchJudge, template
from dynalize.judge.judge import RUBRIC_PROMPT, Judge
from dynalize.judge.researchqa import ResearchQAJudge
from dynalize.rewards import RubricTerm
from dynalize.rubrics.config import RubricConfig, RubricJudgeConfig
from dynalize.rubrics.criteria import Criterion
from dynalize.types import Batch, Message, Rollout
from test_rubric_term import RUBRIC

BATCHED = RubricJudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"})


def hb_grader(messages):
    """Met when the reply (the last `assistant:` block) holds the criterion's last word."""
    user = messages[-1].content
    item = user.split("# Rubric item\n", 1)[1].split("\n\n# Instructions", 1)[0]
    reply = user.split("# Conversation\n", 1)[1].split("\n\n# Rubric item", 1)[0].rsplit("assistant: ", 1)[1]
    word = item.split()[-1].lower()
    return json.dumps({"explanation": "-", "criteria_met": word in reply.lower()})


def batched_grader(messages):
    user = messages[-1].content
    keys = re.findall(r"^- (c\d+): (.*)$", user, flags=re.M)
    reply = user.split("<reply-")[2].split(">", 1)[1].split("</reply-", 1)[0]
    return json.dumps({k: text.split()[-1].lower() in reply.lower() for k, text in keys})


def rollouts(texts):
    return Batch(5, [[Rollout(prompt_id="q0", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                              replies=[t], policy_version=0, messages=[Message("system", "Be brief."),
                                                                        Message("user", "Say food.")],
                              meta={"rubric": [c.to_dict() for c in RUBRIC]}, turns=[Message("assistant", t)])
                      for t in texts]])


def test_the_healthbench_protocol_asks_once_per_criterion_and_gold_is_the_healthbench_score():
    hb = ScriptedChatModel(hb_grader)
    gold = HealthBenchJudge(hb, RubricJudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"},
                                                  protocol="healthbench"))
    proxy = Judge(ScriptedChatModel(batched_grader), BATCHED, prompt=RUBRIC_PROMPT)
    term = RubricTerm(RubricConfig(enabled=True, eval_anchors=0), proxy, gold, steps=10)
    out = anyio.run(term.evaluate, rollouts(["apples and bread", "cheese, rude"]))
    # apples 5 + bread 3 of 13 positive; cheese 2 + rude -4 of 13: mean clipped
    assert out["rubric/gold"] == pytest.approx(((5 + 3) / 13 + max(-2 / 13, -2 / 13)) / 2)
    assert out["rubric/gold"] == out["rubric/proxy"]  # same decisions, two protocols
    assert len(hb.calls) == 2 * len(RUBRIC)
    assert out["rubric/gold_judge/requests_per_reply"] == len(RUBRIC)
    assert out["rubric/proxy_judge/requests_per_reply"] == 1
    assert out["rubric/gold_judge/prompt_chars_per_reply"] > 5 * out["rubric/proxy_judge/prompt_chars_per_reply"]
    first = hb.calls[0]
    assert first[0].content == "You are a helpful assistant."
    body = "system: Be brief.\n\nuser: Say food.\n\nassistant: apples and bread"
    items = {f"[{int(c.weight)}] {c.text}" for c in RUBRIC}
    assert any(m[1].content == template().replace("<<conversation>>", body).replace("<<rubric_item>>", i)
               for m in hb.calls for i in items)


def test_the_researchqa_protocol_grades_in_batches_and_scores_levels():
    rubric = [Criterion(f"k{i}", f"Covers topic {i}", 1.0) for i in range(10)]
    labels = ["Completely", "Mostly", "Moderately", "Barely", "Not at all", "Completely", "Completely", "Mostly"]
    grader = ScriptedChatModel(lambda m: "\n".join(labels if "topic 0" in m[-1].content else ["Barely", "Mostly"]))
    judge = ResearchQAJudge(grader, RubricJudgeConfig(engine="llm", chat={"engine": "scripted", "path": "x:y"},
                                                      protocol="researchqa"))
    [j] = anyio.run(lambda: judge.assess(["an answer"], rubric, "v"))
    assert len(grader.calls) == 2 and not j.failed
    assert j.verdicts["k0"] == 1.0 and j.verdicts["k3"] == 0.25 and j.verdicts["k9"] == 0.75
    from dynalize.rubrics.criteria import rubric_score

    assert rubric_score(rubric, j.verdicts) == pytest.approx(6.25 / 10)


def test_a_protocol_verdict_never_decided_is_failed_not_unmet():
    grader = ScriptedChatModel(lambda m: "not json")
    judge = HealthBenchJudge(grader, BATCHED.model_copy(update={"protocol": "healthbench"}), attempts=2)
    [j] = anyio.run(lambda: judge.assess(["x"], RUBRIC[:2], "v"))
    assert j.failed == {"a", "b"} and len(grader.calls) == 4 and judge.stats.failures == 2
    assert "no boolean criteria_met in 2" in judge.last_error
    short = ScriptedChatModel(lambda m: "Mostly")  # one rating for two questions, every time
    rq = ResearchQAJudge(short, BATCHED.model_copy(update={"protocol": "researchqa"}))
    [j] = anyio.run(lambda: rq.assess(["x"], RUBRIC[:2], "v"))
    assert j.failed == {"a", "b"} and len(short.calls) == 3


def test_the_config_picks_the_protocol_and_refuses_it_without_an_llm():
    cfg = BATCHED.model_copy(update={"protocol": "researchqa", "attempts": 5})
    judge = build_criteria_judge(cfg, chat_factory=lambda c: ScriptedChatModel(["x"]))
    assert isinstance(judge, ResearchQAJudge) and judge.attempts == 5 and judge.batch_size == 8
    assert type(build_criteria_judge(BATCHED, chat_factory=lambda c: ScriptedChatModel(["x"]))) is Judge
    with pytest.raises(ValueError, match="needs engine 'llm'"):
        RubricJudgeConfig(protocol="healthbench")


def test_graded_verdicts_count_their_value_in_met_rates_overclaim_and_contrast():
    from dynalize.rubrics.protocol import Graded, measure
    from dynalize.rubrics.reweight import contrast

    rubric = [Criterion("a", "x", 2.0), Criterion("p", "pitfall", -1.0)]
    m = measure([Graded(rubric, {"a": 1.0, "p": 0.0}, {"a": 0.25, "p": 0.5})])
    assert m["gold"] == pytest.approx((2 * 0.25 - 0.5) / 2) and m["proxy"] == 1.0
    assert m["overclaim"] == pytest.approx(0.75)  # the proxy's 1.0 of credit, 0.75 of it not gold's
    assert m["missed_pitfalls"] == 1.0 and m["gold_met/a"] == 0.25
    assert contrast([{"a": 0.5}, {"a": 0.5}], ["a"]) == {"a": 1.0}  # p = 0.5, not "met" twice


def test_a_researchqa_proxy_trains_on_its_graded_coverage():
    rubric = [Criterion(f"k{i}", f"Covers topic {i}", 1.0) for i in range(3)]
    grader = ScriptedChatModel(lambda m: "Completely\nBarely\nNot at all" if "good" in m[-1].content
                               else "Barely\nBarely\nBarely")
    judge = ResearchQAJudge(grader, BATCHED.model_copy(update={"protocol": "researchqa"}))
    term = RubricTerm(RubricConfig(enabled=True), judge, None, steps=10)
    b = Batch(1, [[Rollout(prompt_id="q", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                           replies=[t], policy_version=0, messages=[Message("user", "Explain.")],
                           meta={"rubric": [c.to_dict() for c in rubric]}, turns=[Message("assistant", t)])
                   for t in ("a good answer", "a weak answer")]])
    scores = anyio.run(term.score, b)
    assert scores.values == [pytest.approx((1 + 0.25 + 0) / 3), pytest.approx(0.25)]
    assert scores.info[0]["rubric_verdicts"] == [{"k0": 1.0, "k1": 0.25, "k2": 0.0}]
    m = term.metrics()
    assert m["rubric/full"] == pytest.approx((1.25 / 3 + 0.25) / 2)
    assert m["rubric/met/k1"] == 0.25  # "Barely" on both replies: a quarter met, not met twice
