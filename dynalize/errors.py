"""Errors a user fixes by changing their input, and the one way a settings error becomes one line."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """Bad config or input: the message is one readable line (the CLI prints it and exits 2)."""


class RunStopped(RuntimeError):
    """The run stopped itself for a documented reason (e.g. a judge that keeps failing), after a
    checkpoint: the message is one line saying why and how to continue (the CLI exits 3)."""


def describe(e: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception on one line, cut to `limit` characters."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(e: ValidationError, prefix: str = "config error", loc_prefix: str = "") -> str:
    """`prefix: key.path: what is wrong` for the first error of a pydantic ValidationError."""
    errors = e.errors()
    err = errors[0]
    loc = loc_prefix + ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{prefix}: {loc}: {msg}{more}"
