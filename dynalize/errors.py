"""Errors a user fixes by changing their input, and the one way a settings error becomes one line."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from .trl_names import trl_hint


class ConfigError(ValueError):
    """Bad config or input: the message is one readable line (the CLI prints it and exits 2)."""


class RunStopped(RuntimeError):
    """The run stopped itself for a documented reason (e.g. a judge that keeps failing), after a
    checkpoint: the message is one line saying why and how to continue (the CLI exits 3)."""


def describe(e: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception on one line, cut to `limit` characters."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(e: ValidationError, prefix: str = "config error", loc_prefix: str = "",
             model: type[BaseModel] | None = None) -> str:
    """`prefix: key.path: what is wrong` for the first error of a pydantic ValidationError; an unknown
    key that is a TRL GRPOConfig name says what it is in dynalize (dynalize.trl_names); another
    unknown key of `model` (the settings class validated) with a known one close to it says which."""
    errors = e.errors()
    err = errors[0]
    loc = loc_prefix + ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and (hint := trl_hint(str(err["loc"][-1]))):  # a TRL user's name
        msg += f": {hint}"
    elif err["type"] == "extra_forbidden" and model is not None and (near := close_key(model, err["loc"])):
        msg += f" (did you mean {near!r}?)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{prefix}: {loc}: {msg}{more}"


def close_key(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The field of the settings section at `loc[:-1]` under `model` closest to the unknown key
    `loc[-1]` (difflib, ratio ≥ 0.6), or None."""
    section: Any = model
    for part in loc[:-1]:
        field = section.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        section = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
        if section is None:
            return None
    names = list(section.model_fields)
    found = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return found[0] if found else None
