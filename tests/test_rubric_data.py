"""Rubric data: HealthBench, RaR and mapped (RubricHub / ResearchQA) rows become prompts whose meta
carries their rubric; bad rows stop with one line naming file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynalize.rubrics.criteria import rubric_from_meta
from dynalize.tasks.base import build_task
from dynalize.tasks.data import DataError
from dynalize.tasks.rubric import FieldMap, load_rubric_prompts

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data"
RQA_FIELDS = FieldMap(prompt="query", id="id", rubric="rubric_items", text=["item"], weight="importance",
                      weight_map={"essential": 5, "important": 3, "optional": 1, "pitfall": -3}, tags=None,
                      tag_fields=["kind"])


def test_healthbench_rows_keep_conversation_weights_tags_and_ids():
    prompts = load_rubric_prompts(str(DATA / "rubric_healthbench_sample.jsonl"), "healthbench")
    p = prompts[1]
    assert p.id == "hb-s02" and [m.role for m in p.messages] == ["system", "user"]
    crit = rubric_from_meta(p.meta)
    assert crit[0].id == "hb-s02#1" and crit[0].weight == 5 and "axis:accuracy" in crit[0].tags
    assert [c.weight for c in crit] == [5, 4, 8, -5, -9]
    assert [m.role for m in prompts[4].messages] == ["user", "assistant", "user"]  # multi-turn context


def test_rar_rows_take_the_description_and_its_category():
    prompts = load_rubric_prompts(str(DATA / "rubric_rar_sample.jsonl"), "rar")
    crit = rubric_from_meta(prompts[0].meta)
    assert prompts[0].id.startswith("r-") and prompts[0].messages[0].content == "Why does ice float on water?"
    assert crit[0].text.startswith("Essential Criteria: States that ice")
    assert crit[0].tags == ("category:essential",) and crit[3].tags == ("category:pitfall",)
    assert crit[3].weight == -2


def test_mapped_rows_read_labelled_weights_and_tag_fields():
    prompts = load_rubric_prompts(str(DATA / "rubric_researchqa_sample.jsonl"), "mapped", RQA_FIELDS)
    crit = rubric_from_meta(prompts[0].meta)
    assert [c.weight for c in crit] == [5, 5, 3, 1, -3]
    assert crit[3].tags == ("kind:citation",)


def test_train_and_eval_files_may_have_different_formats():
    task = build_task("rubric", {"train_file": str(DATA / "rubric_rar_sample.jsonl"), "format": "rar",
                                 "eval_file": str(DATA / "rubric_healthbench_sample.jsonl"),
                                 "eval_format": "healthbench"}, seed=0)
    assert len(task.prompts("train")) == 4 and len(task.prompts("eval")) == 6
    assert task.prompts("eval")[0].id == "hb-s01"


def _write(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


GOOD = {"prompt_id": "a", "prompt": [{"role": "user", "content": "hi"}],
        "rubrics": [{"criterion": "Greets back.", "points": 3, "tags": []}]}


@pytest.mark.parametrize(("change", "message"), [
    ({"rubrics": None}, "field 'rubrics' must be a non-empty list"),
    ({"rubrics": [{"criterion": "x", "points": "lots"}]}, "rubrics[0]: weight 'lots' is not a number"),
    ({"rubrics": [{"points": 3}]}, "rubrics[0]: missing field 'criterion'"),
    ({"rubrics": [{"criterion": "x", "points": -3}]}, "at least one positive-weight criterion"),
    ({"rubrics": [{"criterion": "x", "points": 3, "tags": "axis:x"}]}, None),
    ({"rubrics": [{"criterion": "x", "points": 3, "tags": [1]}]}, "'tags' must be a list of strings"),
    ({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, "last message must be from the user"),
])
def test_bad_rows_are_one_line_data_errors(tmp_path, change, message):
    path = _write(tmp_path, [GOOD, {**GOOD, "prompt_id": "b", **change}])
    if message is None:  # a single tag string is read as one tag
        assert rubric_from_meta(load_rubric_prompts(path, "healthbench")[1].meta)[0].tags == ("axis:x",)
        return
    with pytest.raises(DataError) as e:
        load_rubric_prompts(path, "healthbench")
    assert str(e.value).startswith(f"data error: {path} line 2: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_repeated_instance_id_and_an_unknown_weight_label_are_errors(tmp_path):
    with pytest.raises(DataError, match="instance id 'a' repeats"):
        load_rubric_prompts(_write(tmp_path, [GOOD, GOOD]), "healthbench")
    row = {"id": "q", "query": "Q?", "rubric_items": [{"item": "x", "importance": "vital"}]}
    with pytest.raises(DataError, match=r"weight 'vital' is not a number \(labels in weight_map"):
        load_rubric_prompts(_write(tmp_path, [row]), "mapped", RQA_FIELDS)


def test_csv_rows_with_rubric_as_json_text(tmp_path):
    import pandas as pd

    path = tmp_path / "rows.csv"
    pd.DataFrame([{"question": "Why?", "rubric": json.dumps([{"title": "t", "description": "Because.", "weight": 2}])}]
                 ).to_csv(path, index=False)
    p = load_rubric_prompts(str(path), "rar")[0]
    assert rubric_from_meta(p.meta)[0].text == "Because."


def test_mapped_format_needs_a_field_map():
    from dynalize.errors import ConfigError

    with pytest.raises(ConfigError, match="needs fields"):
        build_task("rubric", {"train_file": str(DATA / "rubric_researchqa_sample.jsonl"), "format": "mapped"}, seed=0)
