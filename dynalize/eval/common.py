"""What both benchmark protocols share: the interface the checkpoint driver runs, a result record,
the bootstrap CI, reading a chat-model spec from the command line, and a progress bar."""

from __future__ import annotations

import abc
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class BenchmarkError(ValueError):
    """A benchmark checkout, profile or option is unusable; the message is one line."""


@dataclass
class BenchResult:
    """One checkpoint's benchmark outcome.

    `score` is on the benchmark's reporting scale (EQ-Bench 0–100, MindEval 1–6), `ci` its bootstrap
    95% interval over items, `criteria` the mean per criterion, `counts` every item that was
    dropped, defaulted or failed, and `raw` one record per item (prompts, replies, judge text).
    `failed` counts the items whose judgement (or conversation) failed: they are done again on a
    rerun, and until then the checkpoint is not complete. `extra` holds further summary fields
    (the benchmark's own scales), `warnings` what the user must see.
    """

    score: float | None
    ci: tuple[float, float] | None
    criteria: dict[str, float]
    counts: dict[str, int]
    raw: list[dict[str, Any]] = field(default_factory=list)
    failed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.failed == 0

    def row(self) -> dict[str, Any]:
        """The summary part of an `eval/<bench>.jsonl` line."""
        return {"score": self.score, "ci_low": self.ci[0] if self.ci else None,
                "ci_high": self.ci[1] if self.ci else None, **self.extra, "criteria": self.criteria,
                "counts": self.counts, "complete": self.complete, "failed": self.failed, "warnings": self.warnings}


class Benchmark(abc.ABC):
    """A benchmark protocol as the checkpoint driver runs it.

    `run(policy)` generates every item with the policy, judges each and scores the checkpoint.
    `run(policy, records)` picks up the saved raw records of an earlier run instead: items whose
    judgement failed are judged again (every judged item when `rejudge`, e.g. with another judge),
    and items that must be generated again (`needs_policy`) are generated with `policy`.
    """

    settings: dict[str, Any]
    """The protocol's settings and its chat models' identities and sampling, recorded with each row."""
    roles: tuple[Any, ...] = ()
    """Its chat models as `eval.models.RoleModel`s, whose endpoints `check` tries."""

    @abc.abstractmethod
    async def run(self, policy: Any, records: list[dict[str, Any]] | None = None,
                  rejudge: bool = False) -> BenchResult:
        """One checkpoint's result; `policy` may be None when records need no generation."""

    def needs_policy(self, records: list[dict[str, Any]]) -> bool:
        """Whether picking up `records` generates anything (the policy must then be loaded)."""
        return False

    async def check(self) -> None:
        """Try the chat models' endpoints once, before any generation (BenchmarkError if one fails)."""
        for role in self.roles:
            await role.check()


def bootstrap_ci(values: Sequence[float | None], n_boot: int = 500, confidence: float = 0.95,
                 seed: int = 0, digits: int | None = None) -> tuple[float, float] | None:
    """Percentile bootstrap of the mean of `values`, resampling items with replacement.

    As EQ-Bench's `bootstrap_benchmark_stability_creative`: the sorted bootstrap means at indices
    int((1−c)/2·B) and int((1+c)/2·B)−1; an item that is None is resampled but adds nothing to a
    mean (a piece judged without a usable score), a resample without any number counts 0, and
    `digits` rounds each resample's mean first (EQ-Bench rounds to 2). None when no item has a number.
    """
    if not any(v is not None for v in values):
        return None
    rng = random.Random(seed)
    k = len(values)

    def mean(sample: list[float | None]) -> float:
        numbers = [v for v in sample if v is not None]
        m = statistics.fmean(numbers) if numbers else 0.0
        return m if digits is None else round(m, digits)

    means = sorted(mean(rng.choices(values, k=k)) for _ in range(n_boot))
    lo = max(0, int((1 - confidence) / 2 * n_boot))
    hi = min(n_boot - 1, int((1 + confidence) / 2 * n_boot) - 1)
    return means[lo], means[hi]


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def read_chat_spec(spec: str, flag: str = "--judge") -> dict[str, Any]:
    """A chat-model config from a JSON object on the command line or a YAML/JSON file path."""
    text = spec.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{flag}: not valid JSON ({e.msg} at column {e.colno})") from None
    else:
        path = Path(spec)
        if not path.is_file():
            raise BenchmarkError(f"{flag}: {spec!r} is neither a JSON object nor an existing YAML/JSON file")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise BenchmarkError(f"{flag}: {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BenchmarkError(f"{flag}: expected a mapping such as {{\"engine\": \"openai\", \"base_url\": ..., "
                             f"\"model\": ...}}")
    return data


def progress(enabled: bool = True) -> Progress:
    """The rich progress bar of long evaluation work."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), disable=not enabled, transient=False)
