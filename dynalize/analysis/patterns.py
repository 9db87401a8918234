"""Pattern prevalence over training: the share of replies that start with a word, or contain one.

Measured per rollout file (`rollouts/step_NNNNNN.jsonl`, or `eval_NNNNNN.jsonl`) over every policy
reply (each reply of a multi-turn rollout counts) and, separately, over the reasoning traces
(`reasoning`, aligned with the replies; empty traces are left out of that share). Matching is
case-insensitive on whole words: "starts with Okay" ignores leading spaces, quotes, asterisks and
brackets; "contains galactic" does not match "intergalactic".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.progress import Progress

from ..runlog import read_jsonl
from .runs import Run

_LEAD = r"[\s\"'“”‘’*_#>(\[-]*"
FIELDS = ("reply", "reasoning")


@dataclass(frozen=True)
class Pattern:
    kind: str  # "starts" or "contains"
    word: str

    @property
    def label(self) -> str:
        return f'starts with "{self.word}"' if self.kind == "starts" else f'contains "{self.word}"'

    def regex(self) -> re.Pattern[str]:
        w = rf"(?<!\w){re.escape(self.word)}(?!\w)"
        return re.compile(rf"\A{_LEAD}{w}" if self.kind == "starts" else w, re.IGNORECASE)


def patterns(starts_with: list[str] | None = None, contains: list[str] | None = None) -> list[Pattern]:
    return [Pattern("starts", w) for w in starts_with or []] + [Pattern("contains", w) for w in contains or []]


@dataclass
class Prevalence:
    """One point: the share of texts in `field` of step `step` matching `pattern`, of `n` texts."""

    run: str
    step: int
    field: str
    pattern: str
    share: float
    n: int


def texts_of(row: dict) -> dict[str, list[str]]:
    """The replies and the non-empty reasoning traces of one rollout line."""
    return {"reply": [r for r in row.get("replies") or [] if isinstance(r, str)],
            "reasoning": [r for r in row.get("reasoning") or [] if isinstance(r, str) and r.strip()]}


def prevalence(run: Run, pats: list[Pattern], kind: str = "step", bar: Progress | None = None) -> list[Prevalence]:
    """Prevalence of each pattern in each rollout file of `run`, in replies and reasoning traces."""
    compiled = [(p, p.regex()) for p in pats]
    files = run.rollout_files(kind)
    task = bar.add_task(f"patterns: {run.name}", total=len(files)) if bar else None
    out = []
    for step, path in files:
        texts: dict[str, list[str]] = {f: [] for f in FIELDS}
        for row in read_jsonl(path):
            for f, items in texts_of(row).items():
                texts[f].extend(items)
        for f in FIELDS:
            if not texts[f]:
                continue
            for p, rx in compiled:
                hits = sum(1 for t in texts[f] if rx.search(t))
                out.append(Prevalence(run.name, step, f, p.label, hits / len(texts[f]), len(texts[f])))
        if bar is not None and task is not None:
            bar.advance(task)
    return out
