"""What user code's scores must be: one finite number per item (or None where TRL allows it).

A reward function (`reward_funcs`, or `reward_model.engine: python`) returns what it likes; what
it returns is read once, here, strictly, so that nothing it returns can silently change what is
trained: a dict is not read as its keys, a string "1.0" is not a number, a number too large to
sum (10**400, ±1e308: the weighted sum, the group's mean and variance overflow) is refused. The
accepted values are Python and NumPy numbers (bools included: `x == y` is a common reward), 0-d
tensors, and a list, tuple, NumPy array or 1-d tensor of them. Anything else is one line naming
the function, the step and the first bad value (a ConfigError: exit 2).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError

MAX_SCORE = 1e30
"""The largest |score| taken: far past any reward scale, and small enough that a batch's weighted
sums, group means and variances (squares summed) stay finite in float64, and an advantage in the
learner's float32."""


def as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number (a 0-d array or tensor too), else None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past float's range (10**400)
        return math.inf if value > 0 else -math.inf


def checked_scores(raw: Any, n: int, where: str, *, allow_none: bool = True, items: str = "completions") -> list[Any]:
    """`raw` as `n` floats (None kept where `allow_none`), or ConfigError `"{where} ..."` in one line."""
    none = " (None where it does not apply)" if allow_none else ""
    if hasattr(raw, "tolist") and getattr(raw, "ndim", 1) == 1:  # a NumPy array or a 1-d tensor
        raw = raw.tolist()
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ConfigError(f"{where} must return a list of numbers{none}, got {type(raw).__name__}")
    if len(raw) != n:
        raise ConfigError(f"{where} returned {len(raw)} scores for {n} {items} (one per item)")
    out: list[Any] = []
    for i, value in enumerate(raw):
        if value is None and allow_none:
            out.append(None)
            continue
        x = as_number(value)
        if x is None:
            raise ConfigError(f"{where} returned {str(value)[:40]!r}, a {type(value).__name__}, not a number (item "
                              f"{i}; return numbers{none})")
        if not math.isfinite(x) or abs(x) > MAX_SCORE:
            shown = f"{x:.3g}" if math.isfinite(x) else str(value)[:40]
            raise ConfigError(f"{where} returned {shown}, not a finite number (item {i}; a score must lie within "
                              f"±{MAX_SCORE:.0e}{', or be None where it does not apply' if allow_none else ''})")
        out.append(x)
    return out
