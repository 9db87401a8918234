"""What a judge checks and what it answers: checks (penalties, rubric criteria), verdicts read
from a model's JSON (true/false and its spellings), the answer's schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..backends.chat import parse_json
from .levels import Verdict

_TRUE = {"true", "yes", "y", "1", "triggered"}
_FALSE = {"false", "no", "n", "0", "not triggered"}


class Checkable(Protocol):
    """What a judge checks: a penalty or a rubric criterion (an id, maybe a regex)."""

    id: str
    regex: str | None


Predicate = Callable[[str, Any, str | None], bool]
"""A local decider: (reply, check, conversation transcript or None) -> met / triggered."""


@dataclass
class Judgement:
    """Verdicts for one text (every penalty id present) and the ids the judge failed to decide.
    A verdict is True/False, or a graded level's value in [0, 1] (`levels`, rubric criteria only)."""

    verdicts: dict[str, Verdict]
    failed: set[str] = field(default_factory=set)


def as_bool(value: Any) -> bool | None:
    """A verdict from a JSON value (true/false, "yes"/"no", 1/0), or None if it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        return True if v in _TRUE else False if v in _FALSE else None
    return None


def parse_verdicts(raw: Any, ids: Sequence[str]) -> tuple[dict[str, bool], set[str]]:
    """(verdicts for `ids`, ids without a usable verdict). Unknown keys are ignored."""
    if isinstance(raw, dict) and isinstance(raw.get("verdicts"), dict) and not set(ids) & set(raw):
        raw = raw["verdicts"]
    if not isinstance(raw, dict):
        raw = {}
    verdicts, failed = {}, set()
    for pid in ids:
        v = as_bool(raw.get(pid))
        if v is None:
            failed.add(pid)
        verdicts[pid] = bool(v)
    return verdicts, failed


def verdict_problem(raw: Any, ids: Sequence[str]) -> str | None:
    """Why an answer lacks a true/false verdict for some id (a cut or garbled answer), or None."""
    failed = parse_verdicts(raw, ids)[1]
    return f"no true/false verdict for {', '.join(sorted(failed))}" if failed else None


def salvage(raw: str) -> Any:
    """The JSON in a reply that failed the schema check (e.g. some ids missing), or None."""
    try:
        return parse_json(raw)
    except ValueError:
        return None


def verdict_schema(ids: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of an answer: one boolean per penalty id, nothing else."""
    return {"type": "object", "properties": {i: {"type": "boolean"} for i in ids},
            "required": list(ids), "additionalProperties": False}
