"""Rubric criteria and the rubric reward, HealthBench's scoring.

An instance's rubric is a list of criteria k, each with a weight w_k (positive: desired;
negative: a pitfall) and tags. A judge returns a binary verdict s_k ∈ {0, 1} per criterion
("met": for a pitfall, that the reply shows it), or a graded level's value s_k ∈ [0, 1]
(`judge.levels`: ResearchQA's five levels). The reward of one reply is

    R = Σ_k w_k s_k / Σ_{k: w_k > 0} w_k                                  (rubric_score)

unclipped per example (pitfalls can make it negative), and a benchmark's overall score is the
mean over examples clipped to [0, 1] (benchmark_score). With a keep-mask m (Rubric Dropout),
both sums run over the kept criteria only: R̃ = Σ_k m_k w_k s_k / Σ_{k: w_k>0} m_k w_k.

Rubrics travel with their prompt as `Prompt.meta["rubric"]`: a list of plain dicts
(`Criterion.to_dict`), read back with `rubric_from_meta`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..judge.levels import Verdict, credit

META_KEY = "rubric"
"""The `Prompt.meta` key that holds a prompt's rubric."""


class RubricError(ValueError):
    """A rubric that cannot be scored (no criteria, duplicate ids, a weight that is not a number)."""


@dataclass(frozen=True)
class Criterion:
    """One rubric criterion. `regex`, when set, lets the judge decide it locally (no LLM);
    `data` holds whatever else a local decider reads (e.g. a Python predicate's parameters)."""

    id: str
    text: str
    weight: float
    tags: tuple[str, ...] = ()
    regex: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def positive(self) -> bool:
        return self.weight > 0

    @property
    def title(self) -> str:
        """How the criterion is listed to a judge (the same field penalties show)."""
        return self.text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text, "weight": self.weight, "tags": list(self.tags)}
        if self.regex:
            out["regex"] = self.regex
        if self.data:
            out["data"] = dict(self.data)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Criterion":
        weight = d.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise RubricError(f"criterion {d.get('id')!r}: weight must be a finite number, got {weight!r}")
        text = d.get("text")
        if not isinstance(text, str) or not text.strip():
            raise RubricError(f"criterion {d.get('id')!r}: text must be a non-empty string")
        tags = d.get("tags") or ()
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise RubricError(f"criterion {d.get('id')!r}: tags must be a list of strings")
        return cls(id=str(d["id"]), text=text.strip(), weight=float(weight), tags=tuple(tags),
                   regex=d.get("regex") or None, data=dict(d.get("data") or {}))


def check_rubric(criteria: Sequence[Criterion]) -> None:
    """Raise RubricError unless the rubric has unique ids and at least one positive criterion."""
    if not criteria:
        raise RubricError("a rubric needs at least one criterion")
    ids = [c.id for c in criteria]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise RubricError(f"criterion ids repeat within a rubric: {', '.join(dup)}")
    if not any(c.positive for c in criteria):
        raise RubricError("a rubric needs at least one positive-weight criterion (its score divides by their sum)")


def rubric_from_meta(meta: Mapping[str, Any]) -> list[Criterion] | None:
    """The rubric in a prompt's meta, checked; None when the prompt has none."""
    raw = meta.get(META_KEY)
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RubricError(f"meta[{META_KEY!r}] must be a list of criteria, got {type(raw).__name__}")
    criteria = [c if isinstance(c, Criterion) else Criterion.from_dict(c) for c in raw]
    check_rubric(criteria)
    return criteria


def rubric_score(criteria: Sequence[Criterion], met: Mapping[str, Verdict],
                 keep: Collection[str] | None = None, weights: Mapping[str, float] | None = None) -> float:
    """R = Σ w_k s_k / Σ_{w_k > 0} w_k over the criteria in `keep` (all when None).

    `weights` replaces the criteria's own weights (a reweighted training reward); a verdict earns
    `credit` (1/0, or a graded level's value); a criterion missing from `met` counts as not met. Raises RubricError when no kept criterion is positive.
    """
    num = den = 0.0
    for c in criteria:
        if keep is not None and c.id not in keep:
            continue
        w = c.weight if weights is None else weights.get(c.id, c.weight)
        if w > 0:
            den += w
        if met.get(c.id, False):
            num += w * credit(met[c.id])
    if den <= 0:
        raise RubricError("no kept criterion has a positive weight: the rubric score is undefined")
    return num / den


def masked_sum(weights: Sequence[float], met: Sequence[bool | int], keep: Sequence[bool | int]) -> float:
    """The un-normalised masked reward Σ_k m_k w_k s_k (Proposition 1 compares against it)."""
    return sum(w * bool(s) * bool(m) for w, s, m in zip(weights, met, keep, strict=True))


def benchmark_score(scores: Iterable[float]) -> float:
    """A benchmark's overall score: the mean of per-example scores, clipped to [0, 1]."""
    values = list(scores)
    if not values:
        raise RubricError("no examples to score")
    return min(1.0, max(0.0, statistics.fmean(values)))
