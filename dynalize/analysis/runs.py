"""Read a run directory back: metrics, evaluation rows and rollout files, as step-indexed series.

A *metric* names a column of one of a run's JSONL files:

    eqbench, mindeval        eval/<bench>.jsonl, column `score`
    mindeval@sonnet          eval/mindeval@sonnet.jsonl: the same generations judged again
                             (`python -m dynalize.eval --rejudge sonnet`), column `score`
    eval/task:gold           eval/task.jsonl (the task's held-out eval), column `gold`
    eval/mindeval:criteria.Assessment & Response   a nested column (dotted path)
    metrics:rm/mean          metrics.jsonl, column `rm/mean`

Rows are indexed by `step`, the training steps completed when the row was written (step 0: before
training; eval/task.jsonl rows of older runs: `version`); where a step appears twice (an
evaluation redone) the last row wins. Missing and non-numeric values are skipped. Held-out
evaluations off the run's own schedule (every `eval_every` steps and the last step, from its
config.yaml) are left out of series: a run extended with `--resume RUN steps=N` keeps the one made
at its old last step, which a run started with `steps=N` would not have made (`off_schedule`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..runlog import read_jsonl

BENCHES = ("eqbench", "mindeval")


class ReportError(ValueError):
    """A run or option the report cannot use; the message is one line."""


@dataclass(frozen=True)
class Metric:
    """A column of a run file: `source` is `metrics` or `eval/<name>`; `column` may be a dotted path."""

    source: str
    column: str

    @property
    def label(self) -> str:
        if self.source.startswith("eval/") and self.column == "score":
            return self.source.removeprefix("eval/")
        return f"{self.source}:{self.column}"

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.label).strip("_")


def parse_metric(text: str) -> Metric:
    """`eqbench`, `mindeval` (or `<bench>@<judge label>`), `eval/<name>:<column>` or `metrics:<column>`."""
    if text.partition("@")[0] in BENCHES and ":" not in text and "/" not in text:
        return Metric(f"eval/{text}", "score")
    source, sep, column = text.partition(":")
    if not sep or not column or not (source == "metrics" or source.startswith("eval/")):
        raise ReportError(f"--metric: expected eqbench, mindeval, eval/<file>:<column> or metrics:<column>, "
                          f"got {text!r}")
    return Metric(source, column)


def column_value(row: dict[str, Any], column: str) -> Any:
    """`row[column]`, or the nested value at a dotted path (`criteria.Coherent`)."""
    if column in row:
        return row[column]
    head, sep, rest = column.partition(".")
    if sep and isinstance(row.get(head), dict):
        return column_value(row[head], rest)
    return None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        return None
    return float(v)


class Run:
    """One run directory, read lazily."""

    def __init__(self, path: str | Path, name: str | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ReportError(f"{path} is not a run directory")
        self.name = name or self.path.name
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def file(self, source: str) -> Path:
        return self.path / ("metrics.jsonl" if source == "metrics" else f"{source}.jsonl")

    def rows(self, source: str) -> list[dict[str, Any]]:
        """Rows of a source by step, the last row of a repeated step winning."""
        if source not in self._rows:
            path = self.file(source)
            by_step: dict[int, dict[str, Any]] = {}
            for r in read_jsonl(path) if path.exists() else []:
                step = r.get("step", r.get("version"))
                if isinstance(step, int):
                    by_step[step] = r
            self._rows[source] = [by_step[s] for s in sorted(by_step)]
        return self._rows[source]

    def config(self) -> dict[str, Any]:
        """The run's config.yaml ({} without one)."""
        path = self.path / "config.yaml"
        return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}

    def off_schedule(self, metric: Metric) -> list[int]:
        """Steps of the metric's held-out evaluations (eval/task.jsonl, or eval/ columns of
        metrics.jsonl) that the run's schedule, step 0, every `eval_every` steps and the last step,
        does not make (steps count training steps completed, in every file)."""
        if not (metric.source == "eval/task" or metric.source == "metrics" and metric.column.startswith("eval/")):
            return []
        cfg = self.config()
        every, steps = cfg.get("eval_every"), cfg.get("steps")
        if not isinstance(every, int) or not isinstance(steps, int) or every <= 0:
            return []
        stamps = [r.get("step", r.get("version")) for r in self.rows(metric.source)
                  if _number(column_value(r, metric.column)) is not None]
        return [s for s in stamps if isinstance(s, int) and s % every and s != steps]

    def has(self, source: str) -> bool:
        return self.file(source).exists()

    def series(self, metric: Metric) -> list[tuple[int, float]]:
        """(step, value) of every row that has a number in the metric's column, held-out
        evaluations off the run's schedule left out (`off_schedule`)."""
        skip = set(self.off_schedule(metric))
        out = []
        for r in self.rows(metric.source):
            v = _number(column_value(r, metric.column))
            step = int(r.get("step", r.get("version")))
            if v is not None and step not in skip:
                out.append((step, v))
        return out

    def penalty_events(self) -> list[dict[str, Any]]:
        path = self.path / "penalties.jsonl"
        return read_jsonl(path) if path.exists() else []

    def rollout_files(self, kind: str = "step") -> list[tuple[int, Path]]:
        """(step, path) of `rollouts/<kind>_NNNNNN.jsonl` (kind `step`: training, `eval`: held-out)."""
        out = []
        for p in sorted((self.path / "rollouts").glob(f"{kind}_*.jsonl")):
            suffix = p.stem.removeprefix(f"{kind}_")
            if suffix.isdigit():
                out.append((int(suffix), p))
        return out

    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.rows("metrics") if isinstance(r.get("step"), int)]
        return max(steps) if steps else None


def default_metrics(runs: list[Run]) -> list[Metric]:
    """Every benchmark some run was evaluated on; without any, the task's held-out `gold`."""
    found = [parse_metric(b) for b in BENCHES if any(r.has(f"eval/{b}") for r in runs)]
    if found:
        return found
    task = [r for r in runs if r.has("eval/task")]
    if not task:
        raise ReportError("no run has eval/eqbench.jsonl, eval/mindeval.jsonl or eval/task.jsonl: "
                          "evaluate first (python -m dynalize.eval) or pass --metric metrics:<column>")
    columns = {k for r in task for row in r.rows("eval/task") for k in row if k != "version"}
    if "gold" in columns:
        return [Metric("eval/task", "gold")]
    raise ReportError(f"eval/task.jsonl has no `gold` column: pass --metric eval/task:<column> "
                      f"(columns: {', '.join(sorted(columns))})")


def judge_metrics(runs: list[Run], bench: str) -> list[Metric]:
    """The benchmark's score under each judge some run has: the evaluation's own judge first, then
    every `eval/<bench>@<label>.jsonl` (saved generations judged again), by label."""
    labels = sorted({p.stem.partition("@")[2] for r in runs for p in (r.path / "eval").glob(f"{bench}@*.jsonl")})
    return [parse_metric(bench)] + [parse_metric(f"{bench}@{label}") for label in labels if label]


def judge_name(runs: list[Run], metric: Metric) -> str:
    """A judge's column name: its label, with the model its rows record (`settings.judge.model`)."""
    label = metric.source.removeprefix("eval/").partition("@")[2]
    for r in runs:
        for row in r.rows(metric.source):
            judge = (row.get("settings") or {}).get("judge") or {}
            model = judge.get("model") or judge.get("path")
            if model:
                return f"{label} ({model})" if label else str(model)
    return label or "first judge"


def unique_names(paths: list[str]) -> list[str]:
    """Short names for runs: the directory name, or more of the path where names collide."""
    names = [Path(p).name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(Path(p)) for p in paths]
