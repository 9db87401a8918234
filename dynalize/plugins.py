"""Code a config names as `module:attr` (a task class, a reward function, a scripted reply list).

A config that names `module:attr` runs that module's code when the run starts, exactly as
importing a Python file would: only use configs whose modules you trust.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import ConfigError


def import_object(spec: str, what: str) -> Any:
    """The object `spec` ("package.module:attr", attr may be dotted) names.

    Raises ConfigError with one line naming `what` (e.g. "reward function") when `spec` is not of
    that form or cannot be imported.
    """
    module, sep, attr = str(spec).partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise ConfigError(f"{what} must be 'module:attr', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot import {what} {spec!r}: {e}") from None
    return obj
