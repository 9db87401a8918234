"""The noise control for Rubric Dropout: the fixed rubric's reward plus the variance dropout injects.

Observation 1 (docs/rubrics.md): with Bernoulli(1 − f) masks the masked advantage of rollout i,
Ã_i = Σ_k m_k w_k δ_ik (δ_ik = s_ik − the group's mean of s_k), has mean (1 − f) A_i and variance
f(1 − f) Σ_k w_k² δ_ik². Dropout is thus "a scaled step plus noise"; the reviewers asked whether the
noise alone does the same. This control keeps the full rubric (nothing dropped) and adds to each
rollout's reward R_i = Σ_k w_k s_ik / W (W = Σ_{w_k > 0} w_k) a zero-mean Gaussian draw ε_i with

    Var[ε_i] = f(1 − f) Σ_{k: w_k > 0} w_k² δ_ik² / W²

the same variance in the reward's own units (negative criteria are never dropped, so they add
no variance; the floor and protected sets are ignored, as in Observation 1). s_ik is the credit of
criterion k's verdict (1 / 0, or a graded level), the mean over the rollout's replies; rollouts
with a failed verdict get no noise and are left out of the group's means.

The draws of a group come from `random.Random` seeded with SHA256 of ("noise", instance id, step),
one standard normal per rollout in the group's order: the same group at the same step gets the
same noise in any process, in any batch order and on resume (like the keep-masks, from another
stream so the two never coincide).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence

from .criteria import Criterion, Verdict, credit


def noise_seed(instance_id: str, step: int) -> int:
    """The noise generator's seed: SHA256 of ("noise", instance id, step), JSON-encoded."""
    digest = hashlib.sha256(json.dumps(["noise", str(instance_id), int(step)]).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def dropout_std(criteria: Sequence[Criterion], rollouts: Sequence[Sequence[Mapping[str, Verdict]] | None],
                f: float, weights: Mapping[str, float] | None = None) -> list[float]:
    """Per rollout of one group, the standard deviation dropout at `f` injects into its reward:
    sqrt(f(1 − f) Σ_{w_k > 0} w_k² δ_k²) / W. `rollouts[i]` is rollout i's verdicts (one mapping per
    reply), or None when a verdict failed (its std is 0 and it is left out of the means)."""
    pos = [c for c in criteria if (weights or {}).get(c.id, c.weight) > 0]
    w = {c.id: (weights or {}).get(c.id, c.weight) for c in pos}
    total = sum(w.values())
    s = [None if r is None or not r else
         {c.id: math.fsum(credit(v[c.id]) if v.get(c.id, False) else 0.0 for v in r) / len(r) for c in pos}
         for r in rollouts]
    decided = [x for x in s if x is not None]
    if not decided or total <= 0 or f <= 0:
        return [0.0] * len(rollouts)
    mean = {k: math.fsum(x[k] for x in decided) / len(decided) for k in w}
    return [0.0 if x is None else
            math.sqrt(f * (1 - f) * math.fsum(w[k] ** 2 * (x[k] - mean[k]) ** 2 for k in w)) / total for x in s]


def group_noise(instance_id: str, step: int, stds: Sequence[float]) -> list[float]:
    """Zero-mean Gaussian noise for one group's rollouts, std `stds[i]` for rollout i, drawn from
    the group's own generator (`noise_seed`): one draw per rollout in order, whatever its std."""
    rng = random.Random(noise_seed(instance_id, step))
    return [sd * rng.gauss(0.0, 1.0) for sd in stds]
