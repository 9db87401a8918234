"""Rubric tasks: prompts that carry their own grading rubric (HealthBench, RaR, RubricHub, ResearchQA).

Each row becomes a `Prompt` whose `meta["rubric"]` lists its criteria (`dynalize.rubrics.criteria`);
the `rubric` reward term (config `rubric.enabled`) judges every reply against it, and at each
held-out evaluation grades the eval split on the full rubrics with the proxy and gold judges.
Three row formats (docs/data_formats.md):

- `healthbench`: `{"prompt": [{"role", "content"}, ...], "rubrics": [{"criterion", "points", "tags"}],
  "prompt_id"}` (the conversation ends with the user);
- `rar`: `{"question", "rubric": [{"title", "description", "weight"}]}` (Rubrics as Rewards);
- `mapped`: any other layout, named field by field in `fields` (RubricHub, ResearchQA, ...).

Train and eval files may have different formats (`eval_format`, `eval_fields`): the measurement
protocol trains on one distribution and evaluates out of it (RubricHub-Medical → HealthBench-Hard).
A criterion's id is `<instance id>#<position>` unless the data gives one (`fields.criterion_id`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ..rubrics.criteria import META_KEY, Criterion, RubricError, check_rubric
from ..types import Message, Prompt
from .base import Split, Task
from .counseling import parse_conversation
from .data import DataArgs, DataError, Row, load_splits, missing, read_rows, short_hash
from .text import length_metrics, split_reasoning_tags

Format = Literal["healthbench", "rar", "mapped"]


class FieldMap(BaseModel):
    """Where a `mapped` row keeps each part (field names of the row and of each rubric item)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = "prompt"
    """The user's request: a string (one user message) or a list of {role, content} messages."""
    system: str | None = None
    """A system prompt field added before a string prompt (None: none)."""
    id: str | None = None
    """The instance id field (None, or missing in a row: a hash of the prompt)."""
    rubric: str = "rubric"
    """The list of rubric items (a JSON string is parsed)."""
    text: list[str] = ["criterion"]
    """Item fields that make the criterion's text, joined with ": " (those present)."""
    weight: str = "points"
    """Item field holding the weight: a number, or a label looked up in `weight_map`."""
    weight_map: dict[str, float] = {}
    """Weights of labelled items, e.g. {"Essential": 5, "Important": 3, "Optional": 1, "Pitfall": -2}."""
    default_weight: float | None = None
    """Weight of an item without one (None: such an item is an error)."""
    tags: str | None = "tags"
    """Item field with a list of tags (None: no tags)."""
    tag_fields: list[str] = []
    """Item fields turned into tags `<field>:<value>` (e.g. a ResearchQA item's `type`)."""
    criterion_id: str | None = None
    """Item field with the criterion's own id (None: `<instance id>#<position>`)."""


HEALTHBENCH = FieldMap(prompt="prompt", id="prompt_id", rubric="rubrics", text=["criterion"], weight="points")
RAR = FieldMap(prompt="question", rubric="rubric", text=["description"], weight="weight", tags=None)
_RAR_CATEGORY = re.compile(r"^\s*(essential|important|optional|pitfall)\s+criteria\s*:\s*", re.IGNORECASE)


class RubricTaskArgs(DataArgs):
    """Settings of the rubric task (`task.args`)."""

    format: Format = "healthbench"
    """Row format of `train_file` (and of `eval_file` unless `eval_format` is set)."""
    fields: FieldMap | None = None
    """mapped: where each part is (required for `format: mapped`)."""
    eval_format: Format | None = None
    """Row format of `eval_file` (None: `format`)."""
    eval_fields: FieldMap | None = None
    """mapped: the field map of `eval_file` (None: `fields`)."""
    description: str = ("Answering a user's request; each answer is graded against a rubric of criteria "
                        "written for that request.")
    """The domain in one line (shown to judges and proposers)."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Delimiters of a reasoning block in replies (None = no reasoning): judges see the final reply."""

    @model_validator(mode="after")
    def _mapped_needs_fields(self) -> "RubricTaskArgs":
        if self.format == "mapped" and self.fields is None:
            raise ValueError("format 'mapped' needs fields (the field map)")
        if (self.eval_format or self.format) == "mapped" and (self.eval_fields or self.fields) is None:
            raise ValueError("eval_format 'mapped' needs eval_fields or fields")
        return self


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def _items(row: Row, field: str) -> list[Any]:
    raw = row.data.get(field)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise row.fail(f"field {field!r} is not a JSON list of rubric items") from None
    if hasattr(raw, "tolist"):  # parquet / datasets may hand back arrays
        raw = raw.tolist()
    if not isinstance(raw, list) or not raw:
        raise row.fail(f"field {field!r} must be a non-empty list of rubric items")
    return raw


def parse_criterion(row: Row, item: Any, k: int, fields: FieldMap, instance: str, fmt: Format) -> Criterion:
    """Rubric item `k` of `row` as a Criterion (DataError naming the row and item when it is bad)."""
    where = f"{fields.rubric}[{k}]"
    if not isinstance(item, dict):
        raise row.fail(f"{where} is not an object")
    parts = [str(item[f]).strip() for f in fields.text if not missing(item.get(f))]
    if not parts:
        raise row.fail(f"{where}: missing field {' / '.join(map(repr, fields.text))}")
    text = ": ".join(parts)
    tags: list[str] = []
    if fmt == "rar":
        found = _RAR_CATEGORY.match(text)
        if found:
            tags.append(f"category:{found.group(1).lower()}")
    raw_weight = item.get(fields.weight)
    if missing(raw_weight):
        if fields.default_weight is None:
            raise row.fail(f"{where}: missing field {fields.weight!r}")
        weight: float | None = fields.default_weight
    elif isinstance(raw_weight, str) and raw_weight.strip() in fields.weight_map:
        weight = fields.weight_map[raw_weight.strip()]
    else:  # a string ("5") is not read as a number: a quoted number is a data bug
        weight = None if isinstance(raw_weight, str) else _number(raw_weight)
    if weight is None:
        known = f" (labels in weight_map: {', '.join(fields.weight_map)})" if fields.weight_map else ""
        quoted = f" (field {fields.weight!r} holds a string: write the number unquoted)" \
            if isinstance(raw_weight, str) and _number(raw_weight) is not None else ""
        raise row.fail(f"{where}: weight {raw_weight!r} is not a number{known}{quoted}")
    if weight == 0:
        raise row.fail(f"{where}: weight (field {fields.weight!r}) is 0: a criterion worth nothing is neither desired nor "
                       f"a pitfall (give it points, or leave it out)")
    if fields.tags and item.get(fields.tags) is not None:
        raw_tags = item[fields.tags]
        if hasattr(raw_tags, "tolist"):
            raw_tags = raw_tags.tolist()
        if isinstance(raw_tags, str):
            raw_tags = [raw_tags]
        if not isinstance(raw_tags, list) or not all(isinstance(t, str) for t in raw_tags):
            raise row.fail(f"{where}: {fields.tags!r} must be a list of strings")
        tags += raw_tags
    tags += [f"{f}:{item[f]}" for f in fields.tag_fields if not missing(item.get(f))]
    cid = str(item[fields.criterion_id]) if fields.criterion_id and not missing(item.get(fields.criterion_id)) \
        else f"{instance}#{k + 1}"
    return Criterion(cid, text, weight, tuple(tags))


def parse_prompt_messages(row: Row, fields: FieldMap) -> list[Message]:
    """The conversation of a row: a message list, or a string as one user message (after `system`)."""
    raw = row.data.get(fields.prompt)
    if isinstance(raw, str) and not raw.lstrip().startswith("["):
        messages = [Message("user", raw.strip())]
        if fields.system and not missing(row.data.get(fields.system)):
            messages.insert(0, Message("system", str(row.data[fields.system])))
        return messages
    if hasattr(raw, "tolist"):
        row.data[fields.prompt] = raw.tolist()
    return parse_conversation(row, fields.prompt)


def parse_row(row: Row, fmt: Format, fields: FieldMap | None) -> Prompt:
    """One data row as a Prompt with its rubric in `meta`."""
    fm = fields if fmt == "mapped" and fields else HEALTHBENCH if fmt == "healthbench" else RAR if fmt == "rar" \
        else fields
    assert fm is not None
    if missing(row.data.get(fm.prompt)):
        raise row.fail(f"missing field {fm.prompt!r}")
    messages = parse_prompt_messages(row, fm)
    raw_id = row.data.get(fm.id) if fm.id else None
    instance = str(raw_id) if not missing(raw_id) else \
        "r-" + short_hash("\n".join(f"{m.role}: {m.content}" for m in messages))
    criteria = [parse_criterion(row, item, k, fm, instance, fmt) for k, item in enumerate(_items(row, fm.rubric))]
    try:
        check_rubric(criteria)
    except RubricError as e:
        raise row.fail(str(e)) from None
    return Prompt(instance, messages, meta={META_KEY: [c.to_dict() for c in criteria]})


def load_rubric_prompts(path: str, fmt: Format, fields: FieldMap | None = None) -> list[Prompt]:
    """Every row of a data file as a rubric Prompt; a repeated instance id is an error."""
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for row in read_rows(path):
        p = parse_row(row, fmt, fields)
        if p.id in seen:
            raise row.fail(f"instance id {p.id!r} repeats ({seen[p.id]})")
        seen[p.id] = row.where
        prompts.append(p)
    return prompts


class RubricTask(Task):
    """Answer a request; the rubric term grades the answer against the request's own rubric."""

    Args = RubricTaskArgs

    def __init__(self, args: RubricTaskArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: RubricTaskArgs = args
        self.description = args.description  # type: ignore[misc]  # per instance: the data's domain
        self._prompts = load_splits(args, self.load)

    def load(self, path: str) -> list[Prompt]:
        a = self.args
        if a.eval_file and path == a.eval_file:
            return load_rubric_prompts(path, a.eval_format or a.format, a.eval_fields or a.fields)
        return load_rubric_prompts(path, a.format, a.fields)

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._prompts[split])

    def split_reasoning(self, reply: str) -> tuple[str, str]:
        return split_reasoning_tags(reply, self.args.reasoning_tags)

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        """Reply lengths; the rubric term adds the proxy/gold measurement (`eval/rubric/...`)."""
        return length_metrics(replies)


__all__ = ["FieldMap", "RubricTask", "RubricTaskArgs", "load_rubric_prompts", "parse_row", "DataError"]
