"""What every ChatModel gets: JSON replies with retries, a concurrency limit, and a scripted engine
for tests and offline runs. (Settings: `backends.config.ChatModelConfig`; the factory that
builds an engine from them: `dynalize.build.build_chat_model`.)

Usage:

    verdict = await chat_json(model, messages, schema={"type": "object", "required": ["hit"]})

    fake = ScriptedChatModel(['{"hit": true}'])   # tests: canned replies; fake.calls records inputs
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import json_repair
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from ..types import Message, as_messages
from .base import ChatModel, EngineError

log = structlog.get_logger("dynalize.backends.chat")

RETRY_PROMPT = (
    "Your previous reply could not be used: {problem}. "
    "Reply again with only the JSON value, no prose and no code fences."
)
"""The user turn `chat_json` adds before a retry, so a greedy model does not repeat itself."""

ECHO_CHARS = 2000
"""At most this much of a bad reply goes back to the model in the correction retry."""

REPAIR_MAX_CHARS = 16_000
"""Longer replies are not repaired (only read as they are, or the object between their first `{`
and last `}`): json-repair's cost grows faster than quadratically on some inputs (prose full of
braces: 0.6 s at 8 KB, 9.6 s at 32 KB, 90 s at 94 KB on one core), and a thread running it cannot
be stopped. A judge's verdicts are a few hundred characters; a proposer's answer a few KB."""


class ChatJSONError(EngineError):
    """A chat model gave no usable JSON within the allowed attempts; `raw` is its last reply."""

    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.raw = raw


# --- JSON replies ------------------------------------------------------------------------------

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "number": (int, float),
    "integer": (int,), "boolean": (bool,), "null": (type(None),),
}


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """A light check of `value` against `schema`: top-level type and required keys only.

    Returns what is wrong in a few words, or None when the value passes.
    """
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        ok = any(
            isinstance(value, _JSON_TYPES.get(n, (object,)))
            and not (isinstance(value, bool) and n in ("number", "integer"))
            for n in names
        )
        if not ok:
            return f"expected a JSON {' or '.join(names)}, got {type(value).__name__}"
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"missing required key(s) {', '.join(map(repr, missing))}"
    return None


def parse_json(text: str, schema: dict[str, Any] | None = None) -> Any:
    """The JSON value in a model's reply, repaired where needed (prose, code fences, trailing commas).

    Raises ValueError when nothing usable is found or the value fails `schema_problem`. Replies
    longer than `REPAIR_MAX_CHARS` are not repaired. CPU-bound: `chat_json` runs it in a thread.
    """
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError):
        value = _embedded_object(text or "")
        if value is None and len(text or "") > REPAIR_MAX_CHARS:
            raise ValueError(f"a reply of {len(text)} characters that is not valid JSON (too long to repair: "
                             f"over {REPAIR_MAX_CHARS})") from None
        try:
            value = value if value is not None else json_repair.loads(text or "")
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
    if value is None or value == "":
        raise ValueError("no JSON found")
    if schema is None:
        return value
    problem = schema_problem(value, schema)
    if problem and isinstance(value, list) and schema.get("type") == "object":
        # json_repair returns a list when the prose holds several objects: take the first that fits.
        fits = [v for v in value if isinstance(v, dict) and schema_problem(v, schema) is None]
        if fits:
            return fits[0]
    if problem:
        raise ValueError(problem)
    return value


def _embedded_object(text: str) -> Any:
    """The valid JSON object between the first `{` and the last `}` of `text` (prose around an
    answer), or None: a linear-time read before any repair."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start or (start == 0 and end == len(text) - 1):
        return None
    try:
        return json.loads(text[start:end + 1])
    except (json.JSONDecodeError, RecursionError):
        return None


def _parse_checked(raw: str, schema: dict[str, Any] | None, check: Callable[[Any], str | None] | None) -> Any:
    value = parse_json(raw, schema)
    if check is not None and (problem := check(value)):
        raise ValueError(problem)
    return value


class _BadJSON(Exception):
    def __init__(self, problem: str, raw: str):
        super().__init__(problem)
        self.raw = raw


async def chat_json(model: ChatModel, messages: list[Message], schema: dict[str, Any] | None = None, *,
                    retries: int = 3, check: Callable[[Any], str | None] | None = None, **sampling: Any) -> Any:
    """Ask `model` for JSON and return the parsed value.

    Passes `json_schema=schema` where the engine supports it. A reply that yields no usable JSON
    (or fails the light schema check, or `check(value)` names a problem) is retried, up to
    `retries` attempts in all, with the bad reply (its first `ECHO_CHARS` characters) and a short
    correction appended to the conversation; then `ChatJSONError` is raised. Parsing runs in a
    worker thread, never on the event loop. Engine errors (timeouts, HTTP failures) propagate:
    engines retry those themselves.
    """
    if retries < 1:
        raise ValueError(f"retries must be >= 1, got {retries}")
    base = as_messages(messages)
    if schema is not None and model.supports_json_schema:
        sampling["json_schema"] = schema
    convo = list(base)
    try:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(retries), reraise=True,
                                           retry=retry_if_exception_type(_BadJSON)):
            with attempt:
                raw = await model.chat(convo, **sampling)
                try:
                    # abandon_on_cancel: a caller's deadline (the judge's time budget) is not held up by a parse
                    return await anyio.to_thread.run_sync(_parse_checked, raw, schema, check, abandon_on_cancel=True)
                except ValueError as e:
                    n = attempt.retry_state.attempt_number
                    log.warning("chat_json.unusable", role=model.label, attempt=n, of=retries, problem=str(e),
                                reply_chars=len(raw))
                    echo = raw[:ECHO_CHARS] + (f"\n[... {len(raw) - ECHO_CHARS} more characters cut]"
                                               if len(raw) > ECHO_CHARS else "")
                    convo = [*base, Message("assistant", echo),
                             Message("user", RETRY_PROMPT.format(problem=e))]
                    raise _BadJSON(str(e), raw) from None
    except _BadJSON as e:
        raise ChatJSONError(f"no usable JSON after {retries} attempt(s): {e}", raw=e.raw) from None
    raise AssertionError("unreachable")  # pragma: no cover


# --- concurrency -------------------------------------------------------------------------------

class LimitedChatModel(ChatModel):
    """At most `max_concurrency` calls of `model` in flight at once; the others wait their turn.

    Wrap any engine: `LimitedChatModel(HFChatModel(...), 4)`. The OpenAI engine has its own limit
    (`max_concurrency`), so it needs no wrapper.
    """

    def __init__(self, model: ChatModel, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.model = model
        self.max_concurrency = max_concurrency
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop, on first use

    @property
    def supports_json_schema(self) -> bool:  # type: ignore[override]
        return self.model.supports_json_schema

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_concurrency)
        async with self._limiter:
            return await self.model.chat(messages, **sampling)

    async def close(self) -> None:
        await self.model.close()

    def __repr__(self) -> str:
        return f"LimitedChatModel({self.model!r}, max_concurrency={self.max_concurrency})"


# --- scripted engine ---------------------------------------------------------------------------

Reply = str | BaseException
ReplyFn = Callable[[list[Message]], str | Awaitable[str]]


class ScriptedChatModel(ChatModel):
    """A fake chat model for tests and offline runs.

    `replies` is either a list answered in order (an exception in the list is raised instead, to
    test failure paths; running out raises EngineError) or a function of the messages, sync or
    async. `calls` records the messages of every call, `sampling` the keyword arguments.
    """

    def __init__(self, replies: list[Reply] | ReplyFn, latency: float = 0.0, *,
                 supports_json_schema: bool = False):
        self.replies = replies
        self.latency = latency
        self.supports_json_schema = supports_json_schema
        self.calls: list[list[Message]] = []
        self.sampling: list[dict[str, Any]] = []

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        msgs = list(as_messages(messages))
        n = len(self.calls)
        self.calls.append(msgs)
        self.sampling.append(dict(sampling))
        if self.latency > 0:
            await anyio.sleep(self.latency)
        if callable(self.replies):
            out = self.replies(msgs)
            return await out if inspect.isawaitable(out) else out
        if n >= len(self.replies):
            raise EngineError(f"ScriptedChatModel: no reply left for call {n + 1} (script has {len(self.replies)})")
        reply = self.replies[n]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def __repr__(self) -> str:
        kind = "function" if callable(self.replies) else f"{len(self.replies)} replies"
        return f"ScriptedChatModel({kind}, calls={len(self.calls)})"
