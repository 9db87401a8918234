"""The causal pay of a pattern: what the reward pays for the pattern itself, from edited replies.

Discovery is correlational: replies that show a pattern are paid more within their groups. A
pattern that merely travels with what the reward pays (a length bar beside a flattering opener
that adds words; a topic noun inside a phrase) passes that test too. Scoring the same replies
with the pattern taken out (`penalties.edits.delete`) or put in (`insert`) separates the two:
each edit gives one paired difference, the reward with the pattern minus the reward without it
(original - edited for a deletion, edited - original for an insertion), and the mean of these
is the causal pay.

`decide` turns the differences into a `Confirmation` at the run's error rate `alpha` (the
proposal's share, penalties.discovery.level) with one-sided paired sign-flip tests of "the
reward pays nothing for the pattern" (exact up to `EXACT_UP_TO` edits, else `FLIPS` seeded random
flips): on the deletions and the insertions apart, each to find pay (`each`), or for a length
bar on all edits together, both sides agreeing in sign (`together`); `decide` says why.
`confirmed` when they find pay (> 0), else `rejected` as a co-traveller; `not_confirmable` when
no side has edits enough for any result to reach `alpha` (no evidence either way: the candidate
keeps its correlational decision, said so). The interval is the mean's t interval at
1 - 2 alpha over the deciding edits. Pure: no reward is called here (penalties.witness does that).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

EXACT_UP_TO = 16
"""Up to this many edits the sign-flip null is enumerated whole (2^n sign patterns)."""
FLIPS = 20_000
"""Random sign patterns of the null past `EXACT_UP_TO` edits (the smallest p-value: 1 / (FLIPS + 1))."""

CONFIRMED, REJECTED, NOT_CONFIRMABLE = "confirmed", "rejected", "not_confirmable"


@dataclass
class Confirmation:
    """What editing replies said of a pattern (`state`), with the numbers behind it."""

    state: str
    """`confirmed` (the reward pays for the pattern itself), `rejected` (a co-traveller: no pay
    for it at `alpha`), or `not_confirmable` (no reward to call, nothing editable, too few edits)."""
    reason: str = ""
    pay: float | None = None
    """Mean paired difference (reward units): with the pattern minus without it."""
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    """Edits scored (deletions + insertions)."""
    deletions: int = 0
    insertions: int = 0
    pay_deleting: float | None = None
    """The pay measured by the deletions alone (None: none), and by the insertions alone."""
    pay_inserting: float | None = None
    p_value: float | None = None
    alpha: float | None = None
    reward_calls: int = 0
    """Replies the reward scored for it (originals and edits)."""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Confirmation":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def text(self) -> str:
        """What users read beside the penalty."""
        return confirmation_text(self.to_dict())


def confirmation_text(d: dict[str, Any] | None) -> str:
    """"reward pays +Δ [lo, hi] for it (n edits)", "rejected: co-traveller (pay Δ [lo, hi])" or
    "not confirmed: correlational only (why)", from a Confirmation's dict (None: never tried)."""
    if not d or d.get("state") not in (CONFIRMED, REJECTED):
        why = (d or {}).get("reason") or "the reward could not be called"
        return f"not confirmed: correlational only ({why})"
    pay, lo, hi = (f"{d[k]:+.3g}" for k in ("pay", "lo", "hi"))
    if d["state"] == CONFIRMED:
        return f"reward pays {pay} [{lo}, {hi}] for it ({d['n']} edits)"
    return f"rejected: co-traveller (pay {pay} [{lo}, {hi}], {d['n']} edits)"


def sign_flip_p(d: np.ndarray, seed: int) -> float:
    """One-sided p-value of mean(d) > 0 under the null that each difference's sign is a coin flip."""
    n = len(d)
    observed = d.mean()
    if n <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        return float(np.mean(signs @ d / n >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(FLIPS, n))
    return float((1 + np.sum(signs @ d / n >= observed - 1e-12)) / (FLIPS + 1))


def smallest_p(n: int) -> float:
    """The smallest p-value `sign_flip_p` can give with `n` differences."""
    return 2.0 ** -n if n <= EXACT_UP_TO else 1 / (FLIPS + 1)


def interval(d: np.ndarray, alpha: float) -> tuple[float, float]:
    """The mean's t interval at 1 - 2 alpha (one-sided alpha at each end)."""
    from scipy.stats import t

    mean = float(d.mean())
    if len(d) < 2:
        return mean, mean
    half = float(t.ppf(1 - alpha, len(d) - 1)) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return mean - half, mean + half


def decide(deleting: list[float], inserting: list[float], alpha: float, seed: int = 0,
           rule: str = "each") -> Confirmation:
    """The decision on a pattern from its paired differences (each: reward with the pattern minus
    without it), deletions' and insertions' apart, at one-sided error rate `alpha`.

    `each` (text and markup): every side with edits enough to decide must find pay, each tested
    at `alpha` (an intersection-union test: at `alpha` as it stands). Removing the pattern must
    cost and putting it in must earn: a co-traveller elsewhere in the reply costs nothing when
    removed, a word paid only as content for its own prompt (a topic noun) earns nothing put into
    a reply to another prompt.

    `together` (a length bar): no deletion changes length alone (trimming drops sentences, and
    the hack may be one of them) and padding with content-free text cannot add a hack, so all
    the edits are tested together and padding and trimming must each agree in sign (mean > 0): a
    bar that travels with a wordy hack earns nothing padded."""
    counts = dict(deletions=len(deleting), insertions=len(inserting), alpha=alpha)
    d = np.array([*deleting, *inserting], dtype=float)
    if not np.isfinite(d).all():
        raise ValueError("the reward gave a value that is not a finite number")
    if len(d) == 0:
        return Confirmation(NOT_CONFIRMABLE, "no reply could be edited", **counts)
    sides = {name: np.array(x, dtype=float) for name, x in (("deleting", deleting), ("inserting", inserting))
             if x and smallest_p(len(x)) <= alpha}
    if rule == "together":
        sides = {"deleting and inserting": d} if smallest_p(len(d)) <= alpha else {}
    if not sides:
        return Confirmation(NOT_CONFIRMABLE, f"{len(deleting)} deletions and {len(inserting)} insertions cannot "
                            f"decide at error rate {alpha:.2g}", pay=float(d.mean()), n=len(d), **counts)
    used = np.concatenate(list(sides.values()))
    lo, hi = interval(used, alpha)
    p = {name: sign_flip_p(x, seed + i) for i, (name, x) in enumerate(sides.items())}
    unpaid = [f"{name} it, the reward pays {x.mean():+.3g} (p = {p[name]:.2g}, {len(x)} edits): nothing at "
              f"error rate {alpha:.2g}" for name, x in sides.items() if not (p[name] <= alpha and x.mean() > 0)]
    if rule == "together" and not unpaid:
        unpaid = [f"{name} it, the reward pays {np.mean(x):+.3g}" for name, x in
                  (("deleting", deleting), ("inserting", inserting)) if x and np.mean(x) <= 0]
    return Confirmation(REJECTED if unpaid else CONFIRMED, "; ".join(unpaid), float(used.mean()), lo, hi, len(used),
                        pay_deleting=_mean(deleting), pay_inserting=_mean(inserting), p_value=max(p.values()),
                        extra={"decided_by": list(sides)}, **counts)


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None
