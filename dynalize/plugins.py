"""Code a config names as `module:attr` (a task class, a reward function, a scripted reply list).

A config that names `module:attr` runs that module's code when the run starts, exactly as
importing a Python file would: only use configs whose modules you trust.

Python objects given to `dynalize.train` that no import path reaches (a lambda, a task instance,
data in memory) are held here for the run and named in its config as `object:<setting>`, e.g.
`reward_model.path: object:reward_model.path` (data with its rows' fingerprint:
`task.args.train_file: object:task.args.train_file@5f0c1a2b3d4e`). Nothing of them is saved with the run, so
`python -m dynalize.run --resume` refuses such a run with one line; `dynalize.train(...,
resume=RUN_DIR)` given the same objects again continues it.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import ConfigError


OBJECT_PREFIX = "object:"
"""A setting's value naming an object given to `dynalize.train` in this process."""

_GIVEN: dict[str, Any] = {}


def give_object(setting: str, obj: Any, tag: str = "") -> str:
    """Hold `obj` for this process's run under `object:<setting>` (the spec the config keeps),
    `@<tag>` appended when given (data carries its content's fingerprint, so a resume given
    other data changes the setting, and is refused)."""
    spec = OBJECT_PREFIX + setting + (f"@{tag}" if tag else "")
    _GIVEN[spec] = obj
    return spec


def forget_objects() -> None:
    """Drop every held object (each `dynalize.train` call starts with its own)."""
    _GIVEN.clear()


def is_given(spec: Any) -> bool:
    return isinstance(spec, str) and spec in _GIVEN


def given_object(spec: str, what: str = "") -> Any:
    """The object held under `spec`, or one line saying it was a Python object not saved with the run."""
    if spec not in _GIVEN:
        setting = spec.removeprefix(OBJECT_PREFIX).partition("@")[0]
        raise ConfigError(f"config error: {setting} was a Python object{f' ({what})' if what else ''} given to "
                          f"dynalize.train, and such objects are not saved with the run: continue it from Python, "
                          f"dynalize.train(config, resume=RUN_DIR) with the same objects, or give {setting} as an "
                          f"import path or file")
    return _GIVEN[spec]


def import_path(obj: Any) -> str | None:
    """`module:qualname` that imports back to `obj` itself (a module-level class or function of
    an importable module, not `__main__`), or None (a lambda, a local function, an instance)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or module == "__main__" or "<" in name:
        return None
    try:
        found = import_object(f"{module}:{name}", "object")
    except ConfigError:
        return None
    return f"{module}:{name}" if found is obj else None


def import_object(spec: str, what: str) -> Any:
    """The object `spec` ("package.module:attr", attr may be dotted) names.

    Raises ConfigError with one line naming `what` (e.g. "reward function") when `spec` is not of
    that form or cannot be imported.
    """
    if str(spec).startswith(OBJECT_PREFIX):
        return given_object(str(spec), what)
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
