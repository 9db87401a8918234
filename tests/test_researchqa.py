"""ResearchQA graded and scored as realliyifei/ResearchQA compute_coverage.py does, on a fixture
in the official format with recorded grader replies (wrong counts, a label off the scale);
every number is computed by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from dynalize.backends.base import ChatModel
from dynalize.eval.researchqa import ResearchQASettings, load_items, run_researchqa
from dynalize.judge.levels import RESEARCHQA, credit
from dynalize.judge.researchqa import coverage_prompt, split_ratings, template
from dynalize.rubrics.criteria import Criterion, rubric_score

DATA = Path(__file__).parent / "fixtures" / "researchqa" / "test.json"

RECORDED = {
    # rq-1, 10 items: batch 1 (8) answers 7 lines first (asked again), then 8 with blank lines and spaces
    ("rq-1", 0): ["Completely\nMostly\nModerately\nBarely\nNot at all\nCompletely\nCompletely",
                  "  Completely\n\nMostly\nModerately \nBarely\nNot at all\nCompletely\nCompletely\nMostly\n"],
    ("rq-1", 1): ["Barely\nMostly"],
    ("rq-2", 0): ["Mostly\nBarely"] * 3,  # 2 ratings for 3 items, three times: skipped
    ("rq-3", 0): ["Completely\nSomewhat"],  # not one of the five: skipped (the official code raises)
    ("rq-4", 0): ["Mostly"],
}
ANSWERS = {"How do enhancers regulate gene expression at a distance?": "rq-1", "Why is the sky blue?": "rq-2",
           "What caused the fall of Constantinople?": "rq-3", "What is virtue ethics?": "rq-4"}


class RecordedGrader(ChatModel):
    def __init__(self, recorded=RECORDED, fail=()):
        self.queues = {k: list(v) for k, v in recorded.items()}
        self.requests = []
        self.fail = set(fail)

    async def chat(self, messages, **sampling):
        self.requests.append((messages, sampling))
        text = messages[-1].content
        rid = text.split("Response: answer to ", 1)[1].split("\n", 1)[0]
        batch = 1 if "point 9?" in text else 0
        if (rid, batch) in self.fail:
            raise ConnectionError("grader down")
        return self.queues[(rid, batch)].pop(0)


class Policy:
    async def sample(self, conversations, sampling):
        return [f"<think>x</think>answer to {ANSWERS[c[-1].content]}" for c in conversations]


def run(grader, records=None, s=None):
    return anyio.run(lambda: run_researchqa(Policy(), grader, load_items(DATA), s or ResearchQASettings(), records,
                                            show_progress=False))


def test_coverage_is_the_mean_normalised_rating_and_failing_batches_skip_their_item():
    res = run(RecordedGrader())
    by_id = {r["id"]: r for r in res.raw}
    # rq-1: (1 + .75 + .5 + .25 + 0 + 1 + 1 + .75 + .25 + .75) / 10
    assert by_id["rq-1"]["coverage"] == pytest.approx(6.25 / 10)
    assert by_id["rq-4"]["coverage"] == 0.75
    assert by_id["rq-2"]["status"] == "skipped" and by_id["rq-3"]["status"] == "skipped"
    assert res.score == pytest.approx((0.625 + 0.75) / 2)
    assert res.complete and res.counts["skipped"] == 2 and res.counts["count_mismatch"] == 1
    assert res.counts["unknown_labels"] == 1 and res.counts["grader_calls"] == 2 + 1 + 3 + 1 + 1
    assert res.criteria == {"Humanities": 0.75, "Science": pytest.approx(0.625)}
    assert any("2 of 4 items skipped" in w for w in res.warnings)
    assert by_id["rq-1"]["batches"][0]["grader_replies"] == RECORDED[("rq-1", 0)]


def test_the_request_is_the_official_prompt_in_batches_of_8_at_temperature_0():
    g = RecordedGrader()
    run(g)
    first = [m for m, _ in g.requests if "point 1?" in m[-1].content][0]
    assert len(first) == 1 and first[0].role == "user"
    questions = [f"Does the response discuss point {k}?" for k in range(1, 9)]
    assert first[0].content == template().replace("<<response>>", "answer to rq-1").replace(
        "<<questions>>", "\n".join(questions))
    assert first[0].content.endswith("Does the response discuss point 8?\n\nOutput:")
    assert first[0].content.startswith("Please judge the following questions based on the response below.\n")
    assert all(s == {"temperature": 0, "max_tokens": None} for _, s in g.requests)


def test_a_failed_call_is_not_a_skip_and_a_rerun_asks_only_the_failed_batch():
    res = run(RecordedGrader(fail={("rq-1", 1)}))
    rq1 = res.raw[0]
    assert rq1["status"] == "failed" and not res.complete and res.failed == 1
    assert res.score == 0.75  # over rq-4 alone; rq-1 is neither unmet nor skipped
    g = RecordedGrader({("rq-1", 1): ["Barely\nMostly"]})
    again = run(g, records=json.loads(json.dumps(res.raw)))
    assert len(g.requests) == 1 and again.complete and again.score == pytest.approx((0.625 + 0.75) / 2)


def test_parsing_and_the_scale_are_the_official_ones():
    assert split_ratings("\n Mostly \n\n Barely\n") == ["Mostly", "Barely"]
    assert [v for _, v in RESEARCHQA.levels] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert RESEARCHQA.value("mostly") is None and RESEARCHQA.value("Mostly.") is None  # exact, as the dict lookup
    assert coverage_prompt("a <<questions>> b", ["q"], "<<response>>|<<questions>>") == "a <<questions>> b|q"


def test_graded_verdicts_score_as_their_value():
    rubric = [Criterion("a", "x", 1.0), Criterion("b", "y", 1.0), Criterion("c", "z", -1.0)]
    assert rubric_score(rubric, {"a": 0.75, "b": 0.25, "c": False}) == 0.5
    assert rubric_score(rubric, {"a": True, "b": 0.5, "c": 0.5}) == 0.5
    assert credit(True) == 1.0 and credit(0.25) == 0.25 and credit(None) == 0.0
