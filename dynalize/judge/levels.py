"""Graded verdicts: a criterion answered with one of an ordered set of levels, each with a value.

Beside yes/no, a judge can rate how far a reply meets a criterion on a scale (ResearchQA's five
levels, Not at all … Completely). A verdict is then the level's value in [0, 1]; `credit` reads
either kind as the share of the criterion's weight a reply earns (True → 1, False → 0), which is
what scoring (`rubrics.criteria.rubric_score`), met rates and reports sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Verdict = bool | float
"""A criterion's verdict: met or not, or a graded level's value in [0, 1]."""


def credit(verdict: Verdict | None) -> float:
    """The share of a criterion's weight a verdict earns: 1/0 for yes/no, the value of a level."""
    if verdict is None:
        return 0.0
    return float(verdict)


@dataclass(frozen=True)
class Scale:
    """An ordered set of levels (lowest first), each a label the judge answers with and its value."""

    name: str
    levels: tuple[tuple[str, float], ...]

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.levels]

    def value(self, label: str) -> float | None:
        """The value of `label` as the judge wrote it (exact, as the benchmark matches), or None."""
        return self._values.get(label)

    def label(self, value: float) -> str | None:
        """The label whose value is `value` (for reports), or None."""
        return next((lab for lab, v in self.levels if v == value), None)

    @property
    def _values(self) -> Mapping[str, float]:
        return dict(self.levels)


def ranked_scale(name: str, labels: tuple[str, ...]) -> Scale:
    """Labels ranked 1..n, each valued (rank − 1) / (n − 1): ResearchQA's normalisation for n = 5."""
    n = len(labels)
    return Scale(name, tuple((label, (rank - 1) / (n - 1)) for rank, label in enumerate(labels, 1)))


RESEARCHQA = ranked_scale("researchqa", ("Not at all", "Barely", "Moderately", "Mostly", "Completely"))
"""ResearchQA's coverage scale (compute_coverage.py, convert_text_to_score and normalize_5scale)."""
