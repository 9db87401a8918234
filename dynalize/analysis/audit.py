"""Penalty audit: apply the penalties one run discovered to another run's replies.

The same judge as in training decides: penalties with a regex are matched locally; the others go
to an LLM judge (`dynalize.judge.judge.Judge`, one call per reply covering all of them) when
one is given, and are otherwise reported as undecided. The result: the share of replies that
trigger at least one penalty, the mean number triggered per reply, and each penalty's rate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..judge.judge import Judge
from ..judge.prompting import transcript
from ..runlog import read_jsonl
from ..types import Message, Penalty, as_messages, exchanges
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


def row_exchanges(row: dict[str, Any]) -> list[tuple[list[Message], str]]:
    """Each policy reply of one rollout line with the conversation before it (`types.exchanges`);
    a line without `turns` holds single-turn `replies`."""
    prompt = as_messages(row.get("prompt") or [])
    turns = as_messages(row.get("turns") or [{"role": "assistant", "content": r} for r in row.get("replies") or []])
    return exchanges(prompt, turns)


def replies_of(rows: list[dict[str, Any]]) -> tuple[list[str], list[str | None]]:
    """Every policy reply of the rollout lines, with the conversation up to it as context (as the
    judge saw it in training)."""
    texts: list[str] = []
    contexts: list[str | None] = []
    for row in rows:
        for conversation, reply in row_exchanges(row):
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
    judged = await judge.assess(texts, [live_copy(p) for p in penalties], buffer_version=0, contexts=contexts)
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


def judge_from_spec(spec: str | None, concurrency: int = 16, time_budget_s: float | None = 300.0) -> Judge:
    """The judge of an audit: regex penalties locally, the others by the LLM `spec` names (a
    chat-model spec: JSON or a YAML/JSON file, `--judge`); without one they stay undecided.
    `time_budget_s` bounds each `assess` call (None: every call waits out its retries)."""
    from ..judge.config import JudgeConfig
    from ..judge.judge import RegexJudge

    if not spec:
        return RegexJudge()
    from ..eval.common import BenchmarkError
    from ..eval.models import chat_model_from_spec

    try:
        return Judge(chat_model_from_spec(spec, "--judge", concurrency),
                     JudgeConfig(max_concurrency=concurrency, time_budget_s=time_budget_s))
    except BenchmarkError as e:
        raise ReportError(str(e)) from None


def live_copy(p: Penalty, pid: str | None = None) -> Penalty:
    """A copy marked active (retired penalties are audited too when asked for), optionally renamed."""
    return Penalty(id=pid or p.id, title=p.title, description=p.description, references=list(p.references),
                   regex=p.regex, created_step=p.created_step, active=True, detector=p.detector)


# --- matching one run's penalties to another's ---------------------------------------------------

@dataclass
class PenaltyMatch:
    """A penalty of the new run and the old run's penalty that fires on the most similar replies."""

    new: Penalty
    old: Penalty | None
    jaccard: float | None
    """|both| / |either| over the replies judged (None: neither fires on any)."""
    new_hits: int
    old_hits: int
    both: int
    same_regex: bool
    matched: bool

    def to_json(self) -> dict[str, Any]:
        return {"new": self.new.id, "new_title": self.new.title, "old": self.old.id if self.old else None,
                "old_title": self.old.title if self.old else None, "jaccard": self.jaccard,
                "new_hits": self.new_hits, "old_hits": self.old_hits, "both": self.both,
                "same_regex": self.same_regex, "matched": self.matched}


def _regex_key(regex: str | None) -> str | None:
    return " ".join(regex.split()) if regex else None


async def match_penalties(new: list[Penalty], old: list[Penalty], judge: Judge, texts: list[str],
                          contexts: list[str | None], threshold: float = 0.5) -> tuple[list[PenaltyMatch], int]:
    """Pair each new penalty with the old one whose verdicts on `texts` overlap most (Jaccard);
    it matches when both have the same regex or the overlap reaches `threshold`. All penalties
    are judged in one pass per text (regexes locally, the rest by `judge`'s LLM); a verdict that
    failed counts as not triggered and is returned as the number of undecided verdicts."""
    tagged = [live_copy(p, f"new:{p.id}") for p in new] + [live_copy(p, f"old:{p.id}") for p in old]
    judged = await judge.assess(texts, tagged, buffer_version=0, contexts=contexts) if texts else []
    hits: dict[str, set[int]] = {p.id: set() for p in tagged}
    for i, j in enumerate(judged):
        for pid, hit in j.verdicts.items():
            if hit and pid not in j.failed:
                hits[pid].add(i)
    out = []
    for p in new:
        a = hits[f"new:{p.id}"]
        best: tuple[float, bool, Penalty] | None = None
        for q in old:
            b = hits[f"old:{q.id}"]
            same = _regex_key(p.regex) is not None and _regex_key(p.regex) == _regex_key(q.regex)
            jac = len(a & b) / len(a | b) if a | b else (1.0 if same else 0.0)
            if best is None or (same, jac) > (best[1], best[0]):
                best = (jac, same, q)
        if best is None:
            out.append(PenaltyMatch(p, None, None, len(a), 0, 0, False, False))
            continue
        jac, same, q = best
        b = hits[f"old:{q.id}"]
        out.append(PenaltyMatch(p, q, jac if a | b else None, len(a), len(b), len(a & b), same,
                                same or (bool(a | b) and jac >= threshold)))
    return out, sum(len(j.failed) for j in judged)
