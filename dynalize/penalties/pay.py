"""What one violation of a live penalty costs: λ (the method's rule, `weight="fixed"`), or λ plus
what the reward measurably pays for the pattern (`weight="pay"`).

Why "pay": a penalty of λ removes a shortcut only when the shortcut pays less than λ. A reward
that pays 0.6 to 1.04 for a word keeps the word under a penalty of 0.5: a penalised reply with
it still earns more than one without (docs/from_trl.md, measured). The pay of a pattern is
measured where it is paid, on the steps the penalty judges: within each group (the same prompt),
the mean reward before penalties of the replies that trigger it minus that of the rest, pooled
over the groups of the latest `window` steps that had both. Each violation then costs
`λ + max(0, pay)`: the pattern's net worth to the policy is −λ whatever the reward paid for it,
as a pattern the reward does not pay costs λ under the fixed rule. Until a step measured it (the
step the penalty enters; a pattern in every reply or in none of a group) the cost is λ.

The trade-off: a penalty on a pattern the reward pays for good reasons (a false penalty) also
cancels that legitimate pay, where the fixed rule takes only λ from it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from ..types import Penalty

def group_gaps(groups: Iterable[Sequence[tuple[float, bool | None]]]) -> list[float]:
    """Per group with both kinds: mean reward of the replies that trigger the penalty minus the
    mean of the rest. Each item is (reward before penalties, verdict); a verdict of None (the judge
    gave none) is left out."""
    gaps = []
    for g in groups:
        hit = [r for r, v in g if v is True]
        rest = [r for r, v in g if v is False]
        if hit and rest:
            gaps.append(statistics.fmean(hit) - statistics.fmean(rest))
    return gaps


def record_pay(penalty: Penalty, step: int, gaps: list[float], window: int) -> None:
    """Keep one step's group gaps (their count and sum) on the penalty, the latest `window`
    measured steps; a step without any is not a measurement and changes nothing."""
    if not gaps:
        return
    penalty.pay = [m for m in penalty.pay if m[0] != step] + [[step, len(gaps), sum(gaps)]]
    penalty.pay = penalty.pay[-window:]


def measured_pay(penalty: Penalty) -> float | None:
    """The mean within-group gap over the kept steps' groups; None before any measurement."""
    n = sum(m[1] for m in penalty.pay)
    return sum(m[2] for m in penalty.pay) / n if n else None


def violation_cost(penalty: Penalty, lam: float, rule: str) -> float:
    """What one violation of `penalty` takes from the reward: λ, or λ + max(0, measured pay)."""
    if rule == "fixed":
        return lam
    pay = measured_pay(penalty)
    return lam + max(0.0, pay or 0.0)
