"""ResearchQA on a policy checkpoint, graded and scored as realliyifei/ResearchQA
`compute_coverage.py` does.

Data: the user's copy of a ResearchQA split (`test.json`: a JSON array, as `load_researchqa_data`
reads it; JSON lines are read too), each item with `id`, `query` and `rubric`
[{rubric_item, type, ...}]; nothing is downloaded. The policy answers each query (one user
message; reasoning stripped). The official repository does not define how answers are generated:
these settings are ours (`--max-tokens`, `--temperature`).

Grading (`judge.researchqa`): an item's rubric in batches of 8, each one call of the official
prompt at temperature 0, re-asked while the count of ratings is wrong (3 calls in all); the
item's coverage is the mean of (x − 1) / 4 over its rubric items, the score the mean over items.
As the official code, an item whose batch keeps answering the wrong count is *skipped*: left out
of the mean, counted and warned about (the official run crashes on a label outside the five; we
skip that item too, counted as `unknown_labels`). A batch whose call fails (the endpoint) is
*failed*, not skipped: the checkpoint is incomplete and a rerun asks only the failed batches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..backends.base import ChatModel, SamplingParams
from ..judge.levels import RESEARCHQA
from ..judge.researchqa import BATCH_SIZE, GRADER_SAMPLING, TRIES, batches, grade_batch
from ..tasks.text import split_reasoning_tags
from ..types import Message
from .common import Benchmark, BenchmarkError, BenchResult, bootstrap_ci, progress
from .heldout import saved_records
from .policy import PolicySampler

REASONING_TAGS = ("<think>", "</think>")
POLICY_TEMPERATURE = 0.5
"""Ours (the official repository does not say how answers are generated): HealthBench's policy default."""


@dataclass
class Item:
    id: str
    query: str
    rubric: list[str]
    domain: str | None


def load_items(path: str | Path) -> list[Item]:
    """The items of a ResearchQA JSON (array) or JSON-lines file, checked (one line on a bad one)."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"researchqa: --data {path} not found (a ResearchQA split, e.g. test.json)")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise BenchmarkError(f"researchqa: {path} is neither a JSON array nor JSON lines") from None
    out, seen = [], set()
    for n, row in enumerate(rows, 1):
        where = f"researchqa: {path} item {n}"
        if not isinstance(row, dict) or not isinstance(row.get("query"), str) or "id" not in row:
            raise BenchmarkError(f"{where}: needs 'id' and a 'query' string")
        rubric = row.get("rubric")
        if not isinstance(rubric, list) or not rubric or not all(
                isinstance(r, dict) and isinstance(r.get("rubric_item"), str) for r in rubric):
            raise BenchmarkError(f"{where}: 'rubric' must be a non-empty list of {{rubric_item, type}} objects")
        iid = str(row["id"])
        if iid in seen:
            raise BenchmarkError(f"{where}: id {iid!r} repeats")
        seen.add(iid)
        out.append(Item(iid, row["query"], [r["rubric_item"] for r in rubric], row.get("general_domain")))
    if not out:
        raise BenchmarkError(f"researchqa: {path} holds no items")
    return out


def item_coverage(labels: Sequence[str]) -> float:
    """compute_coverage_score: the mean of (x − 1) / 4 over the item's ratings."""
    values = [RESEARCHQA.value(x) for x in labels]
    assert all(v is not None for v in values)
    return sum(values) / len(values)  # type: ignore[arg-type]


@dataclass
class ResearchQASettings:
    max_tokens: int = 2048
    temperature: float = POLICY_TEMPERATURE
    tries: int = TRIES
    batch_size: int = BATCH_SIZE
    judge_sampling: dict[str, Any] | None = None
    limit: int | None = None
    n_boot: int = 500
    seed: int = 0


def new_record(item: Item, batch_size: int) -> dict[str, Any]:
    return {"id": item.id, "query": item.query, "general_domain": item.domain, "answer": None, "reasoning": None,
            "batches": [{"questions": list(b), "labels": None, "grader_replies": [], "error": None, "skipped": None}
                        for b in batches(item.rubric, batch_size)],
            "status": "answered", "coverage": None}


async def run_researchqa(policy: PolicySampler | None, judge: ChatModel, items: list[Item], s: ResearchQASettings,
                         records: list[dict[str, Any]] | None = None, rejudge: bool = False,
                         show_progress: bool = True) -> BenchResult:
    """Answer each query with `policy` and grade it; or pick up saved `records` (failed batches
    graded again; every batch when `rejudge`)."""
    unknown: list[str] = []
    if records is None:
        saved = saved_records(policy, [it.id for it in items], "researchqa")
        if saved is None:
            records = [new_record(it, s.batch_size) for it in (items[: s.limit] if s.limit else items)]
        else:  # a run's held-out replies: one item per saved sample
            by_id = {it.id: it for it in items}
            found, unknown = saved
            records = [{**new_record(by_id[x.prompt_id], s.batch_size), "sample": x.sample, "answer": x.reply,
                        "reasoning": x.reasoning} for x in found]
    for rec in records:
        for b in rec["batches"]:
            if rejudge or b["error"]:
                b.update(labels=None, grader_replies=[], error=None, skipped=None)
    todo = [r for r in records if r.get("answer") is None]
    if todo:
        if policy is None:
            raise BenchmarkError("researchqa: queries to answer but no policy")
        sampling = SamplingParams(max_new_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed)
        texts = await policy.sample([[Message("user", r["query"])] for r in todo], sampling)
        for r, raw in zip(todo, texts):
            r["reasoning"], r["answer"] = split_reasoning_tags(raw, REASONING_TAGS)
    pending = [r for r in records if any(b["labels"] is None and not b["skipped"] for b in r["batches"])]
    sampling = GRADER_SAMPLING if s.judge_sampling is None else s.judge_sampling
    with progress(show_progress) as bar:
        task = bar.add_task("researchqa: grading", total=len(pending))

        async def one(rec: dict[str, Any]) -> None:
            for b in rec["batches"]:  # in order; the official code stops at the first batch that fails
                if b["labels"] is not None:
                    continue
                if b["skipped"]:
                    break
                g = await grade_batch(judge, rec["answer"], b["questions"], tries=s.tries, sampling=sampling)
                b.update(labels=g.labels, grader_replies=b["grader_replies"] + g.replies, error=g.error,
                         skipped=g.skipped)
                if g.error or g.skipped:
                    break
            bar.advance(task)

        async with anyio.create_task_group() as tg:
            for rec in pending:
                tg.start_soon(one, rec)
    result = summarize(records, s)
    if unknown:  # the run's held-out set is not all measured: an error of the row, not a warning
        result.counts["not_in_data"] = len(unknown)
        result.warnings.append(f"{len(unknown)} held-out prompts of the run are not in the data file and were not "
                               f"graded (e.g. {unknown[0]!r})")
    return result


def summarize(records: list[dict[str, Any]], s: ResearchQASettings) -> BenchResult:
    """Mean coverage over the items graded whole; skipped and failed items counted apart."""
    for r in records:
        bs = r["batches"]
        if any(b["error"] for b in bs):
            r["status"], r["coverage"] = "failed", None
        elif any(b["skipped"] for b in bs):
            r["status"], r["coverage"] = "skipped", None
        else:
            r["status"] = "scored"
            r["coverage"] = item_coverage([x for b in bs for x in b["labels"]])
    scored = [r for r in records if r["status"] == "scored"]
    per = [r["coverage"] for r in scored]
    bs = [b for r in records for b in r["batches"]]
    counts = {"items": len(records), "scored": len(scored),
              "skipped": sum(r["status"] == "skipped" for r in records),
              "unknown_labels": sum(bool(b["skipped"]) and b["labels"] is not None for b in bs),
              "count_mismatch": sum(bool(b["skipped"]) and b["labels"] is None for b in bs),
              "failed_batches": sum(bool(b["error"]) for b in bs),
              "grader_calls": sum(len(b["grader_replies"]) for b in bs),
              "reasked_batches": sum(len(b["grader_replies"]) > 1 for b in bs)}
    domains: dict[str, list[float]] = {}
    for r in scored:
        if r.get("general_domain"):
            domains.setdefault(str(r["general_domain"]), []).append(r["coverage"])
    warnings = []
    if counts["skipped"]:
        warnings.append(f"{counts['skipped']} of {len(records)} items skipped, as the official code skips them "
                        f"({counts['count_mismatch']} batches kept giving the wrong number of ratings, "
                        f"{counts['unknown_labels']} gave a rating outside the five): the score is over the rest")
    score = sum(per) / len(per) if per else None  # as there: a plain sum (fmean can differ in the last bit)
    return BenchResult(score=score, ci=bootstrap_ci(per, s.n_boot, seed=s.seed),
                       criteria={d: sum(v) / len(v) for d, v in sorted(domains.items())}, counts=counts, raw=records,
                       failed=sum(r["status"] == "failed" for r in records), warnings=warnings)


class ResearchQA(Benchmark):
    """ResearchQA for the checkpoint driver."""

    def __init__(self, judge: ChatModel, items: list[Item], settings: ResearchQASettings, *,
                 record: dict[str, Any] | None = None, roles: tuple[Any, ...] = (), show_progress: bool = True):
        self.judge, self.items, self.s = judge, items, settings
        self.settings, self.roles, self.show_progress = record or {}, roles, show_progress

    async def run(self, policy: PolicySampler | None, records: list[dict[str, Any]] | None = None,
                  rejudge: bool = False) -> BenchResult:
        return await run_researchqa(policy, self.judge, self.items, self.s, records, rejudge, self.show_progress)

    def needs_policy(self, records: list[dict[str, Any]]) -> bool:
        return any(r.get("answer") is None for r in records)


def from_args(args: Any, record: dict[str, Any]) -> ResearchQA:
    """The benchmark as `python -m dynalize.eval --bench researchqa` sets it up."""
    from pathlib import Path as _Path

    from .models import role_model

    judge = role_model(args.judge, "--judge", GRADER_SAMPLING, concurrency=args.concurrency, timeout=JUDGE_TIMEOUT)
    s = ResearchQASettings(max_tokens=args.max_tokens or 2048,
                           temperature=POLICY_TEMPERATURE if args.temperature is None else args.temperature,
                           tries=args.attempts or TRIES, batch_size=args.batch_size or BATCH_SIZE,
                           judge_sampling=judge.sampling, limit=args.limit, seed=args.seed)
    record.update(data=str(_Path(args.data).resolve()), tries=s.tries, batch_size=s.batch_size, judge=judge.public)
    if not args.rejudge and not args.heldout:
        record.update(max_tokens=s.max_tokens, temperature=s.temperature)
    return ResearchQA(judge.model, load_items(args.data), s, record=record, roles=(judge,),
                      show_progress=not args.no_progress)


JUDGE_TIMEOUT = 300.0
"""Seconds per grader request (ours)."""
