"""What both benchmark protocols share: a result record, the bootstrap CI, chat-model specs from
the command line, and a progress bar."""

from __future__ import annotations

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

from ..backends.base import ChatModel
from ..backends.chat import LimitedChatModel


class BenchmarkError(ValueError):
    """A benchmark checkout, profile or option is unusable; the message is one line."""


@dataclass
class BenchResult:
    """One checkpoint's benchmark outcome.

    `score` is on the benchmark's reporting scale (EQ-Bench 0–100, MindEval 1–6), `ci` its bootstrap
    95% interval over items, `criteria` the mean per criterion, `counts` every item that was
    dropped, defaulted or failed, and `raw` one record per item (prompts, replies, judge text).
    """

    score: float | None
    ci: tuple[float, float] | None
    criteria: dict[str, float]
    counts: dict[str, int]
    raw: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The summary part of an `eval/<bench>.jsonl` line."""
        return {"score": self.score, "ci_low": self.ci[0] if self.ci else None,
                "ci_high": self.ci[1] if self.ci else None, "criteria": self.criteria, "counts": self.counts}


def bootstrap_ci(values: Sequence[float], n_boot: int = 500, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap of the mean of `values`, resampling items with replacement.

    Index arithmetic as in EQ-Bench's `bootstrap_benchmark_stability_creative`: the sorted
    bootstrap means at int((1−c)/2·B) and int((1+c)/2·B)−1. None when there are no values.
    """
    if not values:
        return None
    rng = random.Random(seed)
    k = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=k)) for _ in range(n_boot))
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


def chat_model_from_spec(spec: str, flag: str, max_concurrency: int) -> ChatModel:
    """Build the chat model `spec` names, with at most `max_concurrency` calls in flight."""
    from ..build import build_chat_model

    try:
        model = build_chat_model(read_chat_spec(spec, flag))
    except BenchmarkError:
        raise
    except (ValueError, ImportError, AttributeError) as e:
        raise BenchmarkError(f"{flag}: {e}") from None
    return LimitedChatModel(model, max_concurrency)


def progress(enabled: bool = True) -> Progress:
    """The rich progress bar of long evaluation work."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), disable=not enabled, transient=False)
