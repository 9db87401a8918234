"""HealthBench's grading protocol (openai/simple-evals, healthbench_eval.py): one grader call per
rubric item, read as the official code reads it.

Per item the grader gets one user message, the official template (prompts/healthbench_grader.txt)
with the conversation rendered as `role: content` blocks joined by blank lines (the reply last,
as `assistant`) and the item as `[points] criterion`, after the grader's system message
("You are a helpful assistant."). Its reply is read as `parse_json_to_dict` does: the text
stripped, a leading "```json" and a trailing "```" removed, `json.loads`, anything that fails
is `{}`; the item is decided only when `criteria_met` is a JSON boolean (`true`/`false`: not
"true", not 1). Otherwise the same message is sent again: the official loop never stops, ours
stops after `attempts` calls and the item is *failed* (not unmet). Every reply is kept.

`HealthBenchJudge` runs this protocol inside the criteria judge (the rubric term's gold judge:
`rubric.gold_judge.protocol: healthbench`), so its caching, time budget and failure counting hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..backends.base import ChatModel
from ..errors import describe
from ..types import Message
from .prompting import load_verbatim
from .protocols import ProtocolJudge
from .verdicts import Checkable, Judgement

GRADER_SYSTEM = "You are a helpful assistant."
"""The grader's system message: OPENAI_SYSTEM_MESSAGE_API (sampler/chat_completion_sampler.py:9),
given to the grading sampler in simple_evals.py:254-258."""
GRADER_SAMPLING = {"temperature": 0.5, "max_tokens": 2048}
"""The grading sampler's: max_tokens=2048 (simple_evals.py:257), temperature the sampler's
default 0.5 (sampler/chat_completion_sampler.py:25)."""
GRADER_MODEL = "gpt-4.1-2025-04-14"
"""The official grader (simple_evals.py:255); ours is whatever --judge names."""
ATTEMPTS = 10
"""Grader calls per item before it counts as failed (the official loop, healthbench_eval.py:374,
has no bound)."""
_FENCES = re.compile(r"^```json\s*|\s*```$")


def template() -> str:
    return load_verbatim("healthbench_grader")


def render_conversation(messages: Sequence[Mapping[str, Any] | Message]) -> str:
    """The conversation as the grader reads it: `role: content` per message, joined by blank lines."""
    def pair(m: Mapping[str, Any] | Message) -> tuple[Any, Any]:
        return (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])

    return "\n\n".join(f"{role}: {content}" for role, content in map(pair, messages))


def format_points(points: float | int) -> str:
    """`points` as Python's f-string writes the number json.loads gave (5 → "5", 5.0 → "5.0")."""
    return f"{points}"


def rubric_item(points: float | int, criterion: str) -> str:
    """An item as RubricItem.__str__ writes it: `[points] criterion`."""
    return f"[{format_points(points)}] {criterion}"


def grader_prompt(conversation: str, item: str, tmpl: str | None = None) -> str:
    """The template with `<<conversation>>` replaced first, then `<<rubric_item>>` (as there)."""
    return (tmpl or template()).replace("<<conversation>>", conversation).replace("<<rubric_item>>", item)


def grader_messages(conversation: str, item: str) -> list[Message]:
    return [Message("system", GRADER_SYSTEM), Message("user", grader_prompt(conversation, item))]


def parse_reply(text: str) -> Any:
    """`parse_json_to_dict`: fences stripped, json.loads; a reply that is not JSON gives {}."""
    cleaned = _FENCES.sub("", text.strip())
    try:
        return json.loads(cleaned)
    except json.JSONDecodeError:
        return {}


def criteria_met(parsed: Any) -> bool | None:
    """The verdict when `criteria_met` is a JSON boolean, else None (the official code asks again).
    A JSON value that is not an object has no verdict (the official code would raise or re-ask)."""
    if isinstance(parsed, dict) and "criteria_met" in parsed:
        label = parsed["criteria_met"]
        if label is True or label is False:
            return label
    return None


@dataclass
class ItemGrade:
    """One rubric item's grading: its verdict (None: failed), every grader reply, the parsed last
    reply (its `explanation`), and the error that ended it, if any."""

    met: bool | None = None
    replies: list[str] = field(default_factory=list)
    parsed: Any = None
    error: str | None = None

    @property
    def explanation(self) -> str:
        p = self.parsed
        return p.get("explanation", "No explanation provided") if isinstance(p, dict) else "No explanation provided"


async def grade_item(chat: ChatModel, conversation: str, item: str, *, attempts: int = ATTEMPTS,
                     sampling: Mapping[str, Any] | None = None) -> ItemGrade:
    """Ask the grader about one item until `criteria_met` is a boolean, at most `attempts` calls.
    An engine error (after the engine's own retries) fails the item at once."""
    messages = grader_messages(conversation, item)
    out = ItemGrade()
    for _ in range(attempts):
        try:
            reply = await chat.chat(messages, **(sampling or {}))  # a None value is not sent
        except Exception as e:  # noqa: BLE001 - a failed call fails the item, counted, redone on a rerun
            out.error = describe(e)
            return out
        out.replies.append(reply)
        out.parsed = parse_reply(reply)
        out.met = criteria_met(out.parsed)
        if out.met is not None:
            return out
    out.error = f"no boolean criteria_met in {attempts} grader replies"
    return out


class HealthBenchJudge(ProtocolJudge):
    """The criteria judge asking HealthBench's way: one call per criterion of each reply. The
    conversation a reply answers is rendered `role: content` (system messages kept), the criterion
    as `[weight] text`; `chat`'s own sampling settings apply (configs set the official ones)."""

    default_attempts = ATTEMPTS

    def context_of(self, conversation: Sequence[Message]) -> str | None:
        return render_conversation(conversation) if self.cfg.context else None

    async def _call(self, key: tuple[str, str | None, Hashable], checks: list[Checkable],
                    ids: list[str]) -> Judgement:
        text, context, _ = key
        assert self.chat is not None
        reply = render_conversation([Message("assistant", text)])
        conversation = f"{context}\n\n{reply}" if context else reply
        grades: list[ItemGrade] = [ItemGrade() for _ in checks]

        async def one(k: int, c: Checkable) -> None:
            grades[k] = await grade_item(self.chat, conversation, rubric_item(_points(c), c.title),  # type: ignore[arg-type]
                                         attempts=self.attempts)

        async with anyio.create_task_group() as tg:
            for k, c in enumerate(checks):
                tg.start_soon(one, k, c)
        self.stats.calls += sum(len(g.replies) for g in grades)
        return self._settle(key, ids, [(g.met, g.error) for g in grades])


def _points(check: Checkable) -> float | int:
    """A criterion's weight as HealthBench data writes it (whole numbers without `.0`)."""
    w = float(getattr(check, "weight", 0.0))
    return int(w) if w.is_integer() else w
