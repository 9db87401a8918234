"""HealthBench (HealthBench, Hard, Consensus) on a policy checkpoint, graded and scored as
openai/simple-evals `healthbench_eval.py` does.

Data: the user's copy of the official JSONL (one example per line: `prompt` [{role, content}],
`prompt_id`, `rubrics` [{criterion, points, tags}], `example_tags`); nothing is downloaded. With
`limit` N (fewer than the file holds) the examples are `random.Random(0).sample(examples, N)`,
as the official `num_examples`.

Per example the policy answers the prompt (its reasoning block stripped: the grader sees the
answer, as an API returns it); each rubric item is graded by `judge.healthbench.grade_item` (one
call per item, the official template, re-asked until `criteria_met` is a boolean, at most
`attempts` calls); its metrics are those of `grade_sample`: `overall_score` = Σ points of met
items / Σ positive points (unclipped), each example tag the same score, each rubric-level tag
the score over its own items when they have a positive one. Aggregation is
`_aggregate_get_clipped_mean`: per metric name, over the examples that have it, the mean clipped
to [0, 1], `n_samples`, and `bootstrap_std` (1,000 resamples with replacement, each one's clipped
mean, their population std); `score` is the overall one. The resamples come from
numpy.random.RandomState(seed), drawn metric by metric in the official order, so seeding the
official code's global numpy state with the same seed gives the same stds.

An item the grader never decides is failed (the example unscored, left out of every mean): a
rerun grades only those items again. Every grader reply is kept in the raw records.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ..backends.base import ChatModel, SamplingParams
from ..judge.healthbench import ATTEMPTS, GRADER_SAMPLING, grade_item, render_conversation, rubric_item
from ..tasks.text import split_reasoning_tags
from ..types import Message
from .common import Benchmark, BenchmarkError, BenchResult, progress
from .heldout import saved_records
from .policy import PolicySampler

N_BOOTSTRAP = 1000
"""Resamples of the bootstrap std (healthbench_eval.py:222)."""
POLICY_MAX_TOKENS = 2048
"""The policy's reply length: the samplers simple_evals.py lists set max_tokens=2048 (e.g. :138)."""
POLICY_TEMPERATURE = 0.5
"""The policy's temperature: ChatCompletionSampler's default (sampler/chat_completion_sampler.py:25)."""
REASONING_TAGS = ("<think>", "</think>")


@dataclass
class Example:
    prompt_id: str
    prompt: list[dict[str, str]]
    rubrics: list[dict[str, Any]]
    example_tags: list[str]


def load_examples(path: str | Path) -> list[Example]:
    """The examples of an official HealthBench JSONL file, checked (one line naming what is wrong)."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"healthbench: --data {path} not found (the HealthBench JSONL file)")
    out, seen = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"healthbench: {path} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise BenchmarkError(f"{where}: not valid JSON") from None
        if not isinstance(row, dict):
            raise BenchmarkError(f"{where}: not a JSON object")
        for key in ("prompt", "prompt_id", "rubrics", "example_tags"):
            if key not in row:
                raise BenchmarkError(f"{where}: no {key!r} (the official rows have prompt, prompt_id, rubrics, "
                                     f"example_tags)")
        prompt, rubrics, tags = row["prompt"], row["rubrics"], row["example_tags"]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                   and isinstance(m.get("content"), str) for m in prompt):
            raise BenchmarkError(f"{where}: 'prompt' must be a list of {{role, content}} messages")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags) or len(set(tags)) != len(tags):
            raise BenchmarkError(f"{where}: 'example_tags' must be a list of distinct strings")
        if not isinstance(rubrics, list) or not rubrics:
            raise BenchmarkError(f"{where}: 'rubrics' must be a non-empty list")
        for k, r in enumerate(rubrics):
            pts = r.get("points") if isinstance(r, dict) else None
            if not isinstance(r, dict) or not isinstance(r.get("criterion"), str) or isinstance(pts, bool) \
                    or not isinstance(pts, int | float) or not math.isfinite(pts):
                raise BenchmarkError(f"{where}: rubrics[{k}] needs a 'criterion' string and numeric 'points'")
            rtags = r.get("tags")
            if not isinstance(rtags, list) or not all(isinstance(t, str) for t in rtags) or len(set(rtags)) != len(rtags):
                raise BenchmarkError(f"{where}: rubrics[{k}] 'tags' must be a list of distinct strings")
        if not any(r["points"] > 0 for r in rubrics):
            raise BenchmarkError(f"{where}: no rubric item has positive points (the score divides by their sum)")
        pid = str(row["prompt_id"])
        if pid in seen:
            raise BenchmarkError(f"{where}: prompt_id {pid!r} repeats")
        seen.add(pid)
        out.append(Example(pid, prompt, rubrics, tags))
    if not out:
        raise BenchmarkError(f"healthbench: {path} holds no examples")
    return out


def choose_examples(examples: list[Example], limit: int | None) -> list[Example]:
    """All examples, or `random.Random(0).sample(examples, limit)` (healthbench_eval.py:300, :346-350)."""
    if limit is not None and limit < len(examples):
        return random.Random(0).sample(examples, limit)
    return examples


# --- scoring, as grade_sample and _aggregate_get_clipped_mean --------------------------------

def calculate_score(items: Sequence[dict[str, Any]], met: Sequence[bool]) -> float | None:
    """Σ points of met items / Σ positive points; None when no item is positive."""
    possible = sum(r["points"] for r in items if r["points"] > 0)
    if possible == 0:
        return None
    return sum(r["points"] for r, m in zip(items, met, strict=True) if m) / possible


def example_metrics(rubrics: Sequence[dict[str, Any]], met: Sequence[bool], example_tags: Sequence[str]) -> dict[str, float]:
    """`overall_score`, then each example tag (the same score), then each rubric tag with a positive item."""
    overall = calculate_score(rubrics, met)
    assert overall is not None  # load_examples refuses rubrics without a positive item
    metrics = {"overall_score": overall, **{tag: overall for tag in example_tags}}
    by_tag: dict[str, list[tuple[dict[str, Any], bool]]] = defaultdict(list)
    for r, m in zip(rubrics, met):
        for tag in r["tags"]:
            by_tag[tag].append((r, m))
    for tag, pairs in by_tag.items():
        score = calculate_score([r for r, _ in pairs], [m for _, m in pairs])
        if score is not None:
            metrics[tag] = score
    return metrics


def clipped_mean(values: Sequence[float]) -> float:
    return float(np.clip(np.mean(values), 0, 1))


def aggregate(per_example: Sequence[dict[str, float]], seed: int = 0,
              n_boot: int = N_BOOTSTRAP) -> tuple[dict[str, float], list[float]]:
    """(official metrics: `<name>`, `<name>:n_samples`, `<name>:bootstrap_std` and `score`...,
    the overall score's clipped bootstrap means). Names in the official order: each example's
    metrics as they come, with `score` after the first example's."""
    values: dict[str, list[float]] = defaultdict(list)
    for m in per_example:
        for name, v in m.items():
            values[name].append(v)
        values["score"].append(m["overall_score"])
    rng = np.random.RandomState(seed)
    out: dict[str, float] = {}
    score_means: list[float] = []
    for name, vals in values.items():
        out[name] = clipped_mean(vals)
        out[f"{name}:n_samples"] = len(vals)
        means = [clipped_mean(list(rng.choice(vals, len(vals)))) for _ in range(n_boot)]
        out[f"{name}:bootstrap_std"] = float(np.std(means))
        if name == "score":
            score_means = means
    return out, score_means


# --- the protocol, end to end ------------------------------------------------------------------

@dataclass
class HealthBenchSettings:
    max_tokens: int = POLICY_MAX_TOKENS
    temperature: float = POLICY_TEMPERATURE
    attempts: int = ATTEMPTS
    judge_sampling: dict[str, Any] = field(default_factory=lambda: dict(GRADER_SAMPLING))
    limit: int | None = None
    seed: int = 0


def new_record(ex: Example) -> dict[str, Any]:
    return {"prompt_id": ex.prompt_id, "prompt": ex.prompt, "example_tags": ex.example_tags,
            "completion": None, "reasoning": None,
            "rubric_items": [{**r, "criteria_met": None, "explanation": None, "grader_replies": [], "error": None}
                             for r in ex.rubrics],
            "metrics": None, "score": None}


async def run_healthbench(policy: PolicySampler | None, judge: ChatModel, examples: list[Example],
                          s: HealthBenchSettings, records: list[dict[str, Any]] | None = None,
                          rejudge: bool = False, show_progress: bool = True) -> BenchResult:
    """Answer each example with `policy` and grade it; or pick up saved `records` (items without a
    verdict graded again; every item when `rejudge`)."""
    unknown: list[str] = []
    if records is None:
        saved = saved_records(policy, [e.prompt_id for e in examples], "healthbench")
        if saved is None:
            records = [new_record(ex) for ex in choose_examples(examples, s.limit)]
        else:  # a run's held-out replies: one example per saved sample
            by_id = {e.prompt_id: e for e in examples}
            found, unknown = saved
            records = [{**new_record(by_id[x.prompt_id]), "sample": x.sample, "prompt": x.prompt or by_id[x.prompt_id].prompt,
                        "completion": x.reply, "reasoning": x.reasoning} for x in found]
    if rejudge:
        for rec in records:
            for item in rec["rubric_items"]:
                item.update(criteria_met=None, explanation=None, grader_replies=[], error=None)
            rec.update(metrics=None, score=None)
    todo = [r for r in records if r.get("completion") is None]
    if todo:
        if policy is None:
            raise BenchmarkError("healthbench: examples to answer but no policy")
        sampling = SamplingParams(max_new_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed)
        texts = await policy.sample([[Message(m["role"], m["content"]) for m in r["prompt"]] for r in todo], sampling)
        for r, raw in zip(todo, texts):
            r["reasoning"], r["completion"] = split_reasoning_tags(raw, REASONING_TAGS)
    pending = [(r, item) for r in records for item in r["rubric_items"] if item["criteria_met"] is None]
    with progress(show_progress) as bar:
        task = bar.add_task("healthbench: grading rubric items", total=len(pending))

        async def one(rec: dict[str, Any], item: dict[str, Any]) -> None:
            convo = render_conversation([*rec["prompt"], {"role": "assistant", "content": rec["completion"]}])
            g = await grade_item(judge, convo, rubric_item(item["points"], item["criterion"]),
                                 attempts=s.attempts, sampling=s.judge_sampling)
            item["grader_replies"] = item["grader_replies"] + g.replies
            item.update(criteria_met=g.met, error=g.error,
                        explanation=g.explanation if g.met is not None else None)
            bar.advance(task)

        async with anyio.create_task_group() as tg:
            for rec, item in pending:
                tg.start_soon(one, rec, item)
    result = summarize(records, s)
    if unknown:  # the run's held-out set is not all measured: an error of the row, not a warning
        result.counts["not_in_data"] = len(unknown)
        result.warnings.append(f"{len(unknown)} held-out prompts of the run are not in the data file and were not "
                               f"graded (e.g. {unknown[0]!r})")
    return result


def summarize(records: list[dict[str, Any]], s: HealthBenchSettings) -> BenchResult:
    """The official metrics over the examples whose every item has a verdict; counts of the rest."""
    done = []
    for r in records:
        items = r["rubric_items"]
        if all(i["criteria_met"] is not None for i in items):
            r["metrics"] = example_metrics(items, [i["criteria_met"] for i in items], r["example_tags"])
            r["score"] = r["metrics"]["overall_score"]
            done.append(r)
        else:
            r["metrics"] = r["score"] = None
    items = [i for r in records for i in r["rubric_items"]]
    failed_items = sum(i["criteria_met"] is None for i in items)
    counts = {"examples": len(records), "scored": len(done), "failed_items": failed_items,
              "grader_calls": sum(len(i["grader_replies"]) for i in items),
              "regraded_items": sum(len(i["grader_replies"]) > 1 for i in items),
              "grader_errors": sum(bool(i["error"]) and not i["grader_replies"] for i in items)}
    if not done:
        return BenchResult(None, None, {}, counts, raw=records, failed=len(records) - len(done))
    metrics, means = aggregate([r["metrics"] for r in done], s.seed)
    score = metrics.pop("score")
    lo, hi = np.percentile(means, [2.5, 97.5])
    tags = {k: v for k, v in metrics.items() if k != "overall_score"
            and not k.endswith((":n_samples", ":bootstrap_std"))}
    return BenchResult(score=score, ci=(float(lo), float(hi)), criteria=tags, counts=counts, raw=records,
                       failed=len(records) - len(done),
                       extra={"bootstrap_std": metrics["overall_score:bootstrap_std"], "metrics": metrics})


class HealthBench(Benchmark):
    """HealthBench for the checkpoint driver."""

    def __init__(self, judge: ChatModel, examples: list[Example], settings: HealthBenchSettings, *,
                 record: dict[str, Any] | None = None, roles: tuple[Any, ...] = (), show_progress: bool = True):
        self.judge, self.examples, self.s = judge, examples, settings
        self.settings, self.roles, self.show_progress = record or {}, roles, show_progress

    async def run(self, policy: PolicySampler | None, records: list[dict[str, Any]] | None = None,
                  rejudge: bool = False) -> BenchResult:
        return await run_healthbench(policy, self.judge, self.examples, self.s, records, rejudge, self.show_progress)

    def needs_policy(self, records: list[dict[str, Any]]) -> bool:
        return any(r.get("completion") is None for r in records)


def from_args(args: Any, record: dict[str, Any]) -> HealthBench:
    """The benchmark as `python -m dynalize.eval --bench healthbench` sets it up."""
    from .models import role_model

    judge = role_model(args.judge, "--judge", GRADER_SAMPLING, concurrency=args.concurrency, timeout=JUDGE_TIMEOUT)
    s = HealthBenchSettings(max_tokens=args.max_tokens or POLICY_MAX_TOKENS,
                            temperature=POLICY_TEMPERATURE if args.temperature is None else args.temperature,
                            attempts=args.attempts or ATTEMPTS, judge_sampling=judge.sampling, limit=args.limit,
                            seed=args.seed)
    record.update(data=str(Path(args.data).resolve()), attempts=s.attempts, judge=judge.public)
    if not args.rejudge and not args.heldout:
        record.update(max_tokens=s.max_tokens, temperature=s.temperature)
    return HealthBench(judge.model, load_examples(args.data), s, record=record, roles=(judge,),
                       show_progress=not args.no_progress)


JUDGE_TIMEOUT = 300.0
"""Seconds per grader request (ours)."""
