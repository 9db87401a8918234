"""POW3R-style criterion reweighting: training weights from rollout-level contrast.

Human weights stay the objective (evaluation always scores with them); what changes is the
weight each positive criterion gets in the *training* reward. A criterion whose verdicts split a
group's rollouts teaches the policy something; one every rollout meets (saturated) or none meets
(unreachable) does not. Per criterion k of a group, with p_k the share of the group's replies
judged on it that meet it (a criterion the judge was not asked about has no contrast and keeps its
factor):

    contrast c_k = 4 p_k (1 − p_k)                       (1 at an even split, 0 when all or none)
    factor   φ_k = min_factor + (1 − min_factor) c_k
    w'_k     = w_k φ_k, rescaled so the positive weights keep their human total (with Rubric
               Dropout: the kept positive weights keep their kept human total; when every kept
               factor is 0, the kept criteria get their human weights)

Negative weights (pitfalls) are never reweighted, as Rubric Dropout never drops them.

Two forms:

- `PortReweighter`, the port the Rubric Dropout paper compared against: factors from the current
  group's own verdicts, unsmoothed and applied immediately (to that same group's reward), one
  rescaling over the scored (kept) criteria (no category balancing). Stateless.
- `Pow3rReweighter`, the fuller form: per (instance, criterion) an exponential moving average of
  φ over visits (`ema`); one-visit lag (a visit's reward uses the factors of the visits before it,
  human weights on the first visit; the current contrast enters afterwards); and within-category
  balancing: when criteria carry a category tag (`category_prefix`, e.g. HealthBench's `axis:`),
  each category's positive weights keep their human total, so shifting weight never moves it
  between categories. Its state (the averages) goes into checkpoints.

These follow the description of POW3R ("policy-aware rubric rewards": contrast-driven weights,
human weights and category balance kept as the objective); the exact constants are ours.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from ..judge.levels import credit
from .criteria import Criterion


def contrast(met: Sequence[Mapping[str, bool]], ids: Sequence[str]) -> dict[str, float]:
    """c_k = 4 p_k (1 − p_k) over the replies `met` (one verdict dict per reply, holding the
    criteria the judge was asked about). p_k is the mean credit (a graded verdict counts its
    level's value) over the replies with a verdict on k; a criterion no reply was asked about
    (dropped, with `judge_dropped: false`) has no contrast and is left out, never read as unmet."""
    out = {}
    for k in ids:
        verdicts = [credit(m[k]) for m in met if k in m]
        if verdicts:
            p = sum(verdicts) / len(verdicts)
            out[k] = 4.0 * p * (1.0 - p)
    return out


def category_of(c: Criterion, prefix: str | None) -> str:
    """The criterion's category: its first tag starting with `prefix` ("" when none or no prefix)."""
    if not prefix:
        return ""
    return next((t for t in c.tags if t.startswith(prefix)), "")


def reweigh(criteria: Sequence[Criterion], factors: Mapping[str, float], category_prefix: str | None = None,
            keep: Collection[str] | None = None) -> dict[str, float]:
    """Training weights: w_k φ_k for positive k, rescaled so each category's positive total (the
    whole rubric's, without categories) equals its human total; negative weights as they are.

    With `keep` (the criteria a Rubric Dropout mask kept: the ones the reward is scored on) the
    rescaling runs over the kept criteria only, so each category's kept total stays its human
    kept total, and kept criteria whose factors all vanish fall back to their human weights (a
    dropped criterion's factor never takes weight from the reward); dropped ones keep theirs."""
    out = {c.id: c.weight for c in criteria}
    groups: dict[str, list[Criterion]] = {}
    for c in criteria:
        if c.weight > 0 and (keep is None or c.id in keep):
            groups.setdefault(category_of(c, category_prefix), []).append(c)
    for members in groups.values():
        human = sum(c.weight for c in members)
        raw = {c.id: c.weight * max(0.0, factors.get(c.id, 1.0)) for c in members}
        total = sum(raw.values())
        for c in members:
            out[c.id] = raw[c.id] * human / total if total > 0 else c.weight
    return out


class Reweighter(Protocol):
    """Training weights for one group's rubric at one visit."""

    def weights(self, instance_id: str, criteria: Sequence[Criterion], met: Sequence[Mapping[str, bool]],
                keep: Collection[str] | None = None) -> dict[str, float]:
        """`met`: one verdict dict per decided reply (the criteria it was asked about); `keep`:
        the criteria the reward is scored on (all when None)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PortReweighter:
    """The Rubric Dropout paper's POW3R port: this group's contrast, applied at once, no categories."""

    def __init__(self, min_factor: float = 0.1):
        self.min_factor = min_factor

    def factors(self, criteria: Sequence[Criterion], met: Sequence[Mapping[str, bool]]) -> dict[str, float]:
        """φ_k of the positive criteria with a verdict in `met`."""
        c = contrast(met, [x.id for x in criteria if x.weight > 0])
        return {k: self.min_factor + (1.0 - self.min_factor) * v for k, v in c.items()}

    def weights(self, instance_id: str, criteria: Sequence[Criterion], met: Sequence[Mapping[str, bool]],
                keep: Collection[str] | None = None) -> dict[str, float]:
        return reweigh(criteria, self.factors(criteria, met), keep=keep)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Pow3rReweighter(PortReweighter):
    """The fuller form: EMA-smoothed factors per (instance, criterion), a one-visit lag, and
    within-category balancing."""

    def __init__(self, min_factor: float = 0.1, ema: float = 0.9, category_prefix: str | None = None):
        super().__init__(min_factor)
        self.ema = ema
        self.category_prefix = category_prefix
        self.smoothed: dict[str, dict[str, float]] = {}
        """instance id → criterion id → smoothed factor (1.0 before the first visit)."""

    def weights(self, instance_id: str, criteria: Sequence[Criterion], met: Sequence[Mapping[str, bool]],
                keep: Collection[str] | None = None) -> dict[str, float]:
        past = self.smoothed.setdefault(str(instance_id), {})
        out = reweigh(criteria, {c.id: past.get(c.id, 1.0) for c in criteria}, self.category_prefix, keep)
        for k, phi in self.factors(criteria, met).items():  # enters from the next visit on (asked ones only)
            past[k] = self.ema * past.get(k, 1.0) + (1.0 - self.ema) * phi
        return out

    def state_dict(self) -> dict[str, Any]:
        """The averages as they are: JSON keeps a float exactly, so a resume continues bit for bit."""
        return {"smoothed": {i: dict(d) for i, d in self.smoothed.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.smoothed = {str(i): {str(k): float(v) for k, v in d.items()}
                         for i, d in (state.get("smoothed") or {}).items()}
