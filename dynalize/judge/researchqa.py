"""ResearchQA's coverage protocol (realliyifei/ResearchQA, compute_coverage.py): rubric items
graded in batches on a five-level scale, read as the official code reads them.

A reply's rubric items go in batches of 8, in order; each batch is one user message, the
official prompt (prompts/researchqa_coverage.txt) with the answer and the batch's items, one per
line, at temperature 0 and without a system message. The reply is stripped, split on newlines,
each line stripped and empty lines dropped; when the number of lines is not the number of items
the batch is asked again, 3 calls in all, and then the item (the whole reply's rubric) is given
up, as the official code skips it. Each line must be one of the five labels exactly (Not at all,
Barely, Moderately, Mostly, Completely → 1..5 → (x − 1) / 4); the official code raises on any
other line (a KeyError that ends the run), ours gives that reply up too, counted (`unknown`).
A reply's coverage is the mean of its items' values.

`ResearchQAJudge` runs this inside the criteria judge (`rubric.gold_judge.protocol: researchqa`);
the verdict of a criterion is its level's value (levels.RESEARCHQA).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import ChatModel
from ..errors import describe
from ..types import Message
from .levels import RESEARCHQA, Verdict
from .prompting import load_verbatim
from .protocols import ProtocolJudge
from .verdicts import Checkable, Judgement

BATCH_SIZE = 8
"""Rubric items per call (compute_coverage.py:98 and :163)."""
TRIES = 3
"""Calls per batch while the count of ratings is wrong (compute_coverage.py:67, `@retry(tries=3)`)."""
GRADER_SAMPLING: dict[str, Any] = {"temperature": 0, "max_tokens": None}
"""call_gpt's only sampling setting (compute_coverage.py:23); no max_tokens (None: not sent, the
server's limit applies), no system message."""
GRADER_MODEL = "gpt-4.1-mini"
"""The official grader (compute_coverage.py:99 and :164); ours is whatever --judge names."""
_SLOTS = re.compile(r"<<(response|questions)>>")


def template() -> str:
    return load_verbatim("researchqa_coverage")


def coverage_prompt(response: str, questions: Sequence[str], tmpl: str | None = None) -> str:
    """build_prompt: the answer and the items (joined by newlines) put in at once, like an f-string
    (text in the answer that looks like a slot stays as it is)."""
    values = {"response": response, "questions": "\n".join(questions)}
    return _SLOTS.sub(lambda m: values[m.group(1)], tmpl or template())


def split_ratings(text: str) -> list[str]:
    """The reply's lines as process_batch_with_retry reads them: stripped, empty ones dropped."""
    return [line.strip() for line in text.strip().split("\n") if line.strip()]


@dataclass
class BatchGrade:
    """One batch's grading: the labels (None: not obtained), every grader reply, and why it
    ended without labels: `error` (a failed call: redone on a rerun) or `skipped` (the official
    outcomes that drop the item: the count kept mismatching, or a label outside the scale)."""

    labels: list[str] | None = None
    replies: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    def values(self) -> list[float] | None:
        """Each label's value, or None when a label is not on the scale."""
        if self.labels is None:
            return None
        vals = [RESEARCHQA.value(x) for x in self.labels]
        return None if any(v is None for v in vals) else vals  # type: ignore[misc]


async def grade_batch(chat: ChatModel, response: str, questions: Sequence[str], *, tries: int = TRIES,
                      sampling: Mapping[str, Any] | None = None) -> BatchGrade:
    """Ask for one rating per question, again while the count is wrong (at most `tries` calls).
    An engine error ends the batch at once (the official retry covers only the count)."""
    messages = [Message("user", coverage_prompt(response, questions))]
    send = dict(GRADER_SAMPLING if sampling is None else sampling)  # a None value is not sent
    out = BatchGrade()
    for _ in range(tries):
        try:
            reply = await chat.chat(messages, **send)
        except Exception as e:  # noqa: BLE001 - a failed call fails the batch, redone on a rerun
            out.error = describe(e)
            return out
        out.replies.append(reply)
        lines = split_ratings(reply)
        if len(lines) == len(questions):
            out.labels = lines
            if out.values() is None:
                bad = next(x for x in lines if RESEARCHQA.value(x) is None)
                out.skipped = f"rating {bad[:60]!r} is none of {', '.join(RESEARCHQA.labels)}"
            return out
    out.skipped = f"not {len(questions)} ratings in {tries} grader replies"
    return out


def batches(items: Sequence[Any], size: int = BATCH_SIZE) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class ResearchQAJudge(ProtocolJudge):
    """The criteria judge asking ResearchQA's way: a reply's criteria in batches of `batch_size`,
    each rated on the five levels; a batch that fails fails its criteria and, as the official
    code stops at it, the ones after. It shows the grader the reply only (no conversation)."""

    default_attempts = TRIES

    def __init__(self, *args: Any, batch_size: int = BATCH_SIZE, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.batch_size = batch_size

    def context_of(self, conversation: Sequence[Message]) -> str | None:
        return None

    async def _call(self, key: tuple[str, str | None, Hashable], checks: list[Checkable],
                    ids: list[str]) -> Judgement:
        text = key[0]
        assert self.chat is not None
        answers: list[tuple[Verdict | None, str | None]] = []
        stop: str | None = None
        for part in batches(list(checks), self.batch_size):
            if stop is None:
                g = await grade_batch(self.chat, text, [c.title for c in part], tries=self.attempts, sampling={})
                self.stats.calls += len(g.replies)
                vals = g.values()
                if vals is not None:
                    answers += [(v, None) for v in vals]
                    continue
                stop = g.error or g.skipped
            answers += [(None, stop)] * len(part)
        return self._settle(key, ids, answers)
