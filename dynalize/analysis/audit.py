"""Penalty audit: apply the penalties one run discovered to another run's replies.

The same judge as in training decides: penalties with a regex are matched locally; the others go
to an LLM judge (`dynalize.penalties.judge.Judge`, one call per reply covering all of them) when
one is given, and are otherwise reported as undecided. The result: the share of replies that
trigger at least one penalty, the mean number triggered per reply, and each penalty's rate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..penalties.judge import Judge
from ..penalties.prompting import transcript
from ..runlog import read_jsonl
from ..types import Penalty, as_messages, exchanges
from .runs import ReportError, Run


@dataclass
class AuditResult:
    """How often `penalties` fire on `target`'s replies at `step`."""

    source: str
    target: str
    step: int
    kind: str
    n_replies: int
    share_any: float
    mean_count: float
    per_penalty: dict[str, dict[str, Any]] = field(default_factory=dict)
    undecided: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def replies_of(rows: list[dict[str, Any]]) -> tuple[list[str], list[str | None]]:
    """Every policy reply of the rollout lines, with the conversation up to it as context (as the
    judge saw it in training)."""
    texts: list[str] = []
    contexts: list[str | None] = []
    for row in rows:
        prompt = as_messages(row.get("prompt") or [])
        turns = as_messages(row.get("turns") or [{"role": "assistant", "content": r}
                                                 for r in row.get("replies") or []])
        for conversation, reply in exchanges(prompt, turns):
            texts.append(reply)
            contexts.append(transcript(conversation))
    return texts, contexts


def rollout_rows(run: Run, step: int | None, kind: str = "step") -> tuple[int, list[dict[str, Any]]]:
    """(step, lines) of `run`'s rollout file at `step` (default: its last)."""
    files = dict(run.rollout_files(kind))
    if not files:
        raise ReportError(f"{run.path} has no rollouts/{kind}_*.jsonl files")
    if step is None:
        step = max(files)
    if step not in files:
        near = sorted(files, key=lambda s: abs(s - step))[:3]
        raise ReportError(f"{run.path} has no rollouts/{kind}_{step:06d}.jsonl (nearest steps: "
                          f"{', '.join(map(str, sorted(near)))})")
    return step, read_jsonl(files[step])


async def audit(penalties: list[Penalty], source: str, target: Run, judge: Judge, step: int | None = None,
                kind: str = "step") -> AuditResult:
    """Judge every reply of `target` at `step` against `penalties` (all at once, one pass per reply)."""
    step, rows = rollout_rows(target, step, kind)
    texts, contexts = replies_of(rows)
    judged = await judge.assess(texts, [_live(p) for p in penalties], buffer_version=0, contexts=contexts)
    counts = [sum(v and pid not in j.failed for pid, v in j.verdicts.items()) for j in judged]
    per = {}
    for p in penalties:
        decided = [j for j in judged if p.id not in j.failed]
        hits = sum(j.verdicts.get(p.id, False) for j in decided)
        per[p.id] = {"title": p.title, "regex": p.regex, "triggered": hits, "decided": len(decided),
                     "rate": hits / len(decided) if decided else None}
    return AuditResult(
        source=source, target=target.name, step=step, kind=kind, n_replies=len(texts),
        share_any=statistics.fmean(c >= 1 for c in counts) if counts else 0.0,
        mean_count=statistics.fmean(counts) if counts else 0.0, per_penalty=per,
        undecided=sum(len(j.failed) for j in judged))


def _live(p: Penalty) -> Penalty:
    """A copy marked active (retired penalties are audited too when asked for)."""
    return Penalty(id=p.id, title=p.title, description=p.description, references=list(p.references),
                   regex=p.regex, created_step=p.created_step, active=True)
