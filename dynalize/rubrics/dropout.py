"""Rubric Dropout: which criteria count in a group's reward this step.

The keep-mask of one group (all rollouts of one prompt in one step share it):

- every negative-weight criterion is kept, and so is every *protected* one (by id or tag);
  ids match exactly, tags case-insensitively (`category:Essential` protects RaR's criteria,
  whose category tags are lower-cased on load: `category:essential`);
- each other positive criterion k is dropped independently with probability r_k (the dropout
  fraction f, or its own rate: `rate_of`), so the mask is a product of Bernoulli(1 − r_k) draws:
  E[m_k] = 1 − f and Var[m_k] = f(1 − f), which Observation 1's variance rests on;
- then the floor: when fewer than `min_keep` positive criteria are kept (all of them when the
  rubric has fewer), dropped ones are restored, chosen at random, until the floor holds; a group
  where this happens counts as "floor binds".

The draws come from `random.Random` seeded with SHA256 of (instance id, step): the same
instance at the same step gets the same mask in any process, in any batch order, and on resume.
The fraction may be annealed over training (`fraction_at`): every rate is scaled by the same
factor f(step) / f.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .criteria import Criterion

Schedule = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class DropoutSpec:
    """What a keep-mask draw needs (settings: `rubrics.config.DropoutConfig`)."""

    f: float = 0.0
    """Probability that an unprotected positive criterion is dropped."""
    min_keep: int = 3
    """Positive criteria always kept (all of them when the rubric has fewer)."""
    protected_ids: frozenset[str] = frozenset()
    protected_tags: frozenset[str] = frozenset()
    tag_rates: Mapping[str, float] = field(default_factory=dict)
    """Drop rates by tag (a criterion with several such tags takes the lowest)."""
    id_rates: Mapping[str, float] = field(default_factory=dict)
    """Drop rates by criterion id (win over tag rates)."""

    def __post_init__(self) -> None:  # tags compare case-insensitively
        object.__setattr__(self, "protected_tags", frozenset(t.casefold() for t in self.protected_tags))
        object.__setattr__(self, "tag_rates", {t.casefold(): r for t, r in self.tag_rates.items()})

    def protected(self, c: Criterion) -> bool:
        return c.id in self.protected_ids or any(t.casefold() in self.protected_tags for t in c.tags)

    def rate_of(self, c: Criterion, scale: float = 1.0) -> float:
        """Drop probability of `c`: 0 for negative or protected criteria, else its id rate, its
        lowest tag rate, or f; times `scale` (the annealing factor)."""
        if c.weight <= 0 or self.protected(c):
            return 0.0
        if c.id in self.id_rates:
            rate = self.id_rates[c.id]
        else:
            tagged = [self.tag_rates[t.casefold()] for t in c.tags if t.casefold() in self.tag_rates]
            rate = min(tagged) if tagged else self.f
        return min(1.0, max(0.0, rate * scale))


@dataclass(frozen=True)
class Mask:
    """One group's keep-mask."""

    kept: frozenset[str]
    """Ids of the criteria that count (negative and protected ones always among them)."""
    positives: int
    """Positive criteria in the rubric."""
    kept_positives: int
    restored: int = 0
    """Dropped criteria the floor brought back (> 0: the floor binds)."""

    @property
    def kept_fraction(self) -> float:
        """Share of the positive criteria kept."""
        return self.kept_positives / self.positives if self.positives else 1.0

    @property
    def floor_binds(self) -> bool:
        return self.restored > 0


def mask_seed(instance_id: str, step: int) -> int:
    """The mask generator's seed: SHA256 of (instance id, step), JSON-encoded so no two pairs collide."""
    digest = hashlib.sha256(json.dumps([str(instance_id), int(step)]).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def keep_mask(criteria: Sequence[Criterion], spec: DropoutSpec, instance_id: str, step: int,
              scale: float = 1.0) -> Mask:
    """The keep-mask of `instance_id`'s group at `step` (see the module docstring)."""
    rng = random.Random(mask_seed(instance_id, step))
    positives = [c for c in criteria if c.weight > 0]
    kept = {c.id for c in criteria}
    dropped: list[str] = []
    for c in criteria:  # one draw per criterion in rubric order, whatever its rate
        u = rng.random()
        if u < spec.rate_of(c, scale):
            kept.discard(c.id)
            dropped.append(c.id)
    floor = min(spec.min_keep, len(positives))
    n_kept = len(positives) - len(dropped)
    restored = 0
    if n_kept < floor:
        back = rng.sample(dropped, floor - n_kept)
        kept.update(back)
        restored = len(back)
    return Mask(frozenset(kept), len(positives), n_kept + restored, restored)


def full_mask(criteria: Sequence[Criterion]) -> Mask:
    """The mask that keeps everything (evaluation, or f = 0)."""
    n = sum(c.weight > 0 for c in criteria)
    return Mask(frozenset(c.id for c in criteria), n, n)


def anneal_factor(step: int, schedule: Schedule = "constant", anneal_steps: int | None = None) -> float:
    """The factor every drop rate is scaled by at `step`: 1 throughout (`constant`), or decaying
    from 1 to 0 over `anneal_steps` steps, linearly or along a half cosine (0 from then on)."""
    if schedule == "constant":
        return 1.0
    if not anneal_steps or anneal_steps <= 0:
        raise ValueError(f"schedule {schedule!r} needs anneal_steps > 0")
    t = min(1.0, max(0.0, step / anneal_steps))
    if schedule == "linear":
        return 1.0 - t
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown schedule {schedule!r}")


def fraction_at(f: float, step: int, schedule: Schedule = "constant", anneal_steps: int | None = None) -> float:
    """The dropout fraction at `step`: f × `anneal_factor`."""
    return f * anneal_factor(step, schedule, anneal_steps)


def unmatched(protected_ids: Sequence[str], protected_tags: Sequence[str], id_rates: Mapping[str, float],
              tag_rates: Mapping[str, float], criteria: Sequence[Criterion]) -> str | None:
    """Why a dropout setting names a tag or id that no criterion of `criteria` (the training data's)
    carries, in one line with the closest ones there, or None: a protection that protects nothing
    is a silent no-op otherwise. Tags compare case-insensitively, ids exactly."""
    import difflib

    ids = {c.id for c in criteria}
    tags = {t.casefold(): t for c in criteria for t in c.tags}
    for name, wanted, known, fold in (("protected_ids", list(protected_ids), ids, False),
                                      ("id_rates", list(id_rates), ids, False),
                                      ("protected_tags", list(protected_tags), set(tags), True),
                                      ("tag_rates", list(tag_rates), set(tags), True)):
        for w in wanted:
            if (w.casefold() if fold else w) in known:
                continue
            what = "tag" if fold else "id"
            near = difflib.get_close_matches(w.casefold() if fold else w, sorted(known), n=3, cutoff=0.5)
            hint = f"; closest there: {', '.join(tags[n] if fold else n for n in near)}" if near else \
                (f"; tags there: {', '.join(sorted(tags.values())[:8])}" if fold and tags else "")
            how = " (tags match case-insensitively)" if fold else " (ids match exactly)"
            return (f"rubric.dropout.{name}: {what} {w!r} matches no criterion of the training data{how}"
                    f"{hint}")
    return None
