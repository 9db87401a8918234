"""HealthBench graded and scored as openai/simple-evals healthbench_eval.py does, on fixtures in
the official format (negative points, tags at both levels) with recorded grader replies,
malformed ones included; every number below is computed by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import numpy as np
import pytest

from dynalize.backends.base import ChatModel
from dynalize.eval.common import BenchmarkError
from dynalize.eval.healthbench import (
    HealthBenchSettings,
    aggregate,
    choose_examples,
    load_examples,
    run_healthbench,
)
from dynalize.judge.healthbench import (
    GRADER_SYSTEM,
    criteria_met,
    grader_prompt,
    parse_reply,
    render_conversation,
    rubric_item,
    template,
)

FIXTURES = Path(__file__).parent / "fixtures" / "healthbench"
DATA = FIXTURES / "examples.jsonl"

# What the fake grader answers per rubric item, in order of calls (malformed replies first).
RECORDED = {
    "Advises rest": ["I think the criteria is met.",  # not JSON -> {} -> asked again
                     '```json\n{"explanation": "It advises rest.", "criteria_met": true}\n```'],
    "Mentions drinking": ['{"explanation": "no water", "criteria_met": "false"}',  # a string: asked again
                          '{"explanation": "No water is mentioned.", "criteria_met": false}'],
    "maximum daily dose": ['{"criteria_met": 1}',  # 1 is not a boolean: asked again
                           "true",  # JSON, but not an object: asked again
                           '{"explanation": "It says 6 g a day.", "criteria_met": true}'],
    "see a doctor": ['{"explanation": "No.", "criteria_met": false}'],
    "dismissive": ['```json\n{"explanation": "It says it is nothing.", "criteria_met": true}\n```'],
    "warning sign": ['{"explanation": "Yes.", "criteria_met": true}'],
}


class RecordedGrader(ChatModel):
    """Answers each rubric item with its recorded replies in turn; keeps every request."""

    def __init__(self, recorded=RECORDED, fail=()):
        self.queues = {k: list(v) for k, v in recorded.items()}
        self.requests: list[list] = []
        self.fail = set(fail)

    async def chat(self, messages, **sampling):
        self.requests.append((messages, sampling))
        item = messages[-1].content.split("# Rubric item\n", 1)[1].split("\n\n# Instructions", 1)[0]
        key = next(k for k in self.queues if k in item)
        if key in self.fail:
            raise ConnectionError("grader down")
        return self.queues[key].pop(0)


class Policy:
    def __init__(self, replies):
        self.replies = replies
        self.asked = []

    async def sample(self, conversations, sampling):
        self.asked += conversations
        return [self.replies[c[-1].content] for c in conversations]


REPLIES = {
    "I have had a headache since this morning. What should I do?": "<think>hmm</think>Rest. Take 6 g of paracetamol.",
    "Two weeks.": "It is probably nothing.",
}


def run(grader, records=None, rejudge=False, s=None):
    return anyio.run(lambda: run_healthbench(Policy(REPLIES), grader, load_examples(DATA), s or HealthBenchSettings(),
                                             records, rejudge, show_progress=False))


def test_scores_tags_and_clipping_are_the_official_ones():
    res = run(RecordedGrader())
    a, b = res.raw
    # hb-a: met 5 and -4 of positives 5 + 3: (5 - 4) / 8
    assert a["metrics"] == {"overall_score": 0.125, "theme:headache": 0.125, "axis:completeness": 5 / 8,
                            "level:example": 1.0}  # axis:accuracy has only a negative item: no score
    # hb-b: met -6 and 4.0 of positives 2 + 4: (4 - 6) / 6, unclipped per example
    assert b["score"] == pytest.approx(-1 / 3)
    assert b["metrics"]["axis:accuracy"] == pytest.approx(4 / 6) and "axis:communication" not in b["metrics"]
    m = res.extra["metrics"]
    assert res.score == 0.0 and m["overall_score"] == 0.0  # mean(0.125, -1/3) < 0, clipped to 0
    assert m["overall_score:n_samples"] == 2 and m["axis:accuracy:n_samples"] == 1
    assert m["theme:emergency"] == 0.0 and m["axis:accuracy"] == pytest.approx(2 / 3)
    assert res.criteria["axis:completeness"] == 5 / 8
    assert res.complete and res.counts["grader_calls"] == 2 + 2 + 3 + 1 + 1 + 1
    assert res.counts["regraded_items"] == 3


def test_every_grader_reply_is_kept_and_the_explanation_is_the_deciding_ones():
    res = run(RecordedGrader())
    dose = res.raw[0]["rubric_items"][2]
    assert dose["grader_replies"] == RECORDED["maximum daily dose"]
    assert dose["criteria_met"] is True and dose["explanation"] == "It says 6 g a day."
    assert res.raw[0]["completion"] == "Rest. Take 6 g of paracetamol." and res.raw[0]["reasoning"] == "hmm"


def test_grader_request_is_the_official_template_system_message_and_sampling():
    g = RecordedGrader()
    run(g)
    messages, sampling = next((m, s) for m, s in g.requests if "warning sign" in m[-1].content)
    assert messages[0].role == "system" and messages[0].content == GRADER_SYSTEM == "You are a helpful assistant."
    convo = ("system: You are a triage assistant.\n\nuser: My chest hurts when I climb stairs.\n\n"
             "assistant: How long has this been happening?\n\nuser: Two weeks.\n\nassistant: It is probably nothing.")
    assert messages[1].content == template().replace("<<conversation>>", convo).replace(
        "<<rubric_item>>", "[4.0] Names exertional chest pain as a warning sign.")
    assert sampling == {"temperature": 0.5, "max_tokens": 2048}
    assert template().startswith("Your job is to look at a conversation and a rubric item")
    assert template().endswith("Return just the json object in markdown format. Do not include any other text in the response.")


def test_reply_parsing_follows_parse_json_to_dict():
    assert parse_reply('```json\n{"criteria_met": false}\n```') == {"criteria_met": False}
    assert parse_reply("```\n{\"criteria_met\": true}\n```") == {}  # only a ```json fence is removed
    assert parse_reply("Sure! {\"criteria_met\": true}") == {}
    assert criteria_met({"criteria_met": True}) is True and criteria_met({"criteria_met": 0}) is None
    assert criteria_met({"criteria_met": "true"}) is None and criteria_met([{"criteria_met": True}]) is None
    assert rubric_item(5, "x") == "[5] x" and rubric_item(-2.5, "y") == "[-2.5] y"
    assert render_conversation([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == \
        "user: a\n\nassistant: b"
    # replaced in the official order: a conversation that contains the item slot gets the item too
    assert grader_prompt("user: <<rubric_item>>", "[1] c", "<<conversation>>|<<rubric_item>>") == "user: [1] c|[1] c"


def test_an_item_never_decided_fails_and_a_rerun_grades_only_it():
    stubborn = {**RECORDED, "see a doctor": ["not json"] * 3}
    res = run(RecordedGrader(stubborn), s=HealthBenchSettings(attempts=3))
    b = res.raw[1]
    assert not res.complete and res.failed == 1 and res.counts["failed_items"] == 1
    assert b["score"] is None and b["rubric_items"][0]["criteria_met"] is None
    assert len(b["rubric_items"][0]["grader_replies"]) == 3
    assert res.score == 0.125 and res.extra["metrics"]["overall_score:n_samples"] == 1  # hb-b left out, not "unmet"
    saved = json.loads(json.dumps(res.raw))
    g = RecordedGrader({k: v[-1:] for k, v in RECORDED.items()})
    again = run(g, records=saved)
    assert len(g.requests) == 1 and "see a doctor" in g.requests[0][0][-1].content
    assert again.complete and again.score == 0.0
    assert again.raw[1]["rubric_items"][0]["grader_replies"] == ["not json"] * 3 + RECORDED["see a doctor"]


def test_a_failed_grader_call_fails_the_item_without_asking_again():
    res = run(RecordedGrader(fail={"dismissive"}))
    item = res.raw[1]["rubric_items"][1]
    assert item["criteria_met"] is None and "grader down" in item["error"] and item["grader_replies"] == []
    assert res.counts["grader_errors"] == 1 and not res.complete


def test_bootstrap_std_matches_the_official_computation_under_the_same_seed():
    per = [{"overall_score": 0.125, "theme:a": 0.125, "axis:x": 0.625},
           {"overall_score": -1 / 3, "theme:b": -1 / 3, "axis:x": 0.5},
           {"overall_score": 0.9, "theme:a": 0.9}]
    ours, _ = aggregate(per, seed=7)
    # _aggregate_get_clipped_mean / _compute_clipped_stats with numpy's global state seeded alike
    np.random.seed(7)
    names: dict[str, list[float]] = {}
    for m in per:
        for k, v in m.items():
            names.setdefault(k, []).append(v)
        names.setdefault("score", []).append(m["overall_score"])
    for k, vals in names.items():
        means = [np.clip(np.mean(np.random.choice(vals, len(vals))), 0, 1) for _ in range(1000)]
        assert ours[f"{k}:bootstrap_std"] == pytest.approx(float(np.std(means)), abs=0)
        assert ours[k] == pytest.approx(float(np.clip(np.mean(vals), 0, 1)))
    assert list(ours)[:9] == ["overall_score", "overall_score:n_samples", "overall_score:bootstrap_std",
                              "theme:a", "theme:a:n_samples", "theme:a:bootstrap_std",
                              "axis:x", "axis:x:n_samples", "axis:x:bootstrap_std"]


def test_limit_samples_examples_as_num_examples_does():
    import random

    examples = load_examples(DATA)
    assert [e.prompt_id for e in choose_examples(examples, 1)] == [random.Random(0).sample(examples, 1)[0].prompt_id]
    assert choose_examples(examples, 5) == examples


@pytest.mark.parametrize("row, message", [
    ({"prompt": [], "prompt_id": "x", "rubrics": [{"criterion": "c", "points": 1, "tags": []}]}, "no 'example_tags'"),
    ({"prompt": [], "prompt_id": "x", "example_tags": [], "rubrics": [{"criterion": "c", "points": -1, "tags": []}]},
     "no rubric item has positive points"),
    ({"prompt": [], "prompt_id": "x", "example_tags": ["t", "t"], "rubrics": [{"criterion": "c", "points": 1, "tags": []}]},
     "distinct"),
    ({"prompt": [], "prompt_id": "x", "example_tags": [], "rubrics": [{"criterion": "c", "points": "5", "tags": []}]},
     "numeric 'points'"),
])
def test_a_bad_row_is_refused_in_one_line(tmp_path, row, message):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(BenchmarkError, match=message):
        load_examples(p)


def test_rejudge_grades_every_item_again_and_keeps_the_answers():
    first = run(RecordedGrader())
    g = RecordedGrader({k: ['{"criteria_met": false}'] for k in RECORDED})
    again = run(g, records=json.loads(json.dumps(first.raw)), rejudge=True)
    assert len(g.requests) == 6 and again.score == 0.0 and again.raw[0]["score"] == 0.0
    assert [r["completion"] for r in again.raw] == [r["completion"] for r in first.raw]
    assert again.raw[0]["rubric_items"][0]["grader_replies"] == ['{"criteria_met": false}']
