"""ChatModel for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted APIs).

Plain httpx, no `openai` package. Transient failures (429, 5xx, timeouts, dropped connections,
unreadable or oversized bodies) are retried with exponential backoff, honouring `Retry-After`;
other 4xx fail at once. `timeout` is a deadline for the whole request (a reply trickling in byte
by byte is cut too), the body is read as it streams in and abandoned past `max_response_bytes`,
and a call waiting out its backoff holds no concurrency slot. Optional requests-per-minute and
tokens-per-minute limits (ratelimit.py) pace calls to hosted APIs; each reply's `usage` is added
up in `usage` (what a run reports as its judges' token cost). The API key is read from an
environment variable whose NAME is configured; the key itself never reaches logs, reprs or
exception messages, nor does anything credential-shaped a server sends back (`secrets.mask_secrets`);
a `base_url` holding a key is refused.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from datetime import datetime, timezone
from typing import Any

import anyio
import httpx
import structlog
from tenacity import (AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential,
                      wait_random)

from ..types import Message, as_messages
from .base import ChatModel, EngineError
from .config import env_name_problem, url_credential_problem
from .ratelimit import RateLimiter
from .secrets import mask_secrets

log = structlog.get_logger("dynalize.backends.openai")


class _Secret:
    """Holds the API key; prints as *** so it cannot leak through repr, vars() or logs."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


class _Transient(Exception):
    """A failure worth retrying; `retry_after` is the server's requested wait in seconds."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


def _retry_after(resp: httpx.Response) -> float | None:
    """`Retry-After` in seconds (a number or an HTTP date), or None."""
    raw = resp.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _aliased(sampling: dict[str, Any]) -> dict[str, Any]:
    """`max_new_tokens` (the Generator's name) read as `max_tokens`."""
    out = dict(sampling)
    if "max_new_tokens" in out:
        value = out.pop("max_new_tokens")
        out.setdefault("max_tokens", value)
    return out


class OpenAIChatModel(ChatModel):
    """A chat model served over the OpenAI chat-completions API.

    Sampling keys: temperature, top_p, max_tokens (alias max_new_tokens), min_p (sent as an extra
    body field, as vLLM/SGLang accept), seed, json_schema (→ `response_format`, strict). Any other
    key goes into the request body as is (e.g. `stop`). A key set to None is left out.
    """

    supports_json_schema = True

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout: float = 60.0, max_retries: int = 5, max_concurrency: int = 16,
                 default_sampling: dict[str, Any] | None = None, retry_wait: float = 0.5,
                 max_wait: float = 60.0, max_response_bytes: int = 1_048_576,
                 requests_per_minute: float | None = None, tokens_per_minute: float | None = None,
                 rate_limiter: RateLimiter | None = None):
        if api_key_env and (problem := env_name_problem(api_key_env)):
            raise EngineError(f"api_key_env {problem}")  # the value itself is never echoed
        if problem := url_credential_problem(base_url):
            raise EngineError(f"base_url {problem}")
        self.base_url = base_url.rstrip("/")
        """Endpoint root including `/v1`; requests go to `<base_url>/chat/completions`."""
        self.model = model
        """Model name sent with each request."""
        self.api_key_env = api_key_env
        """NAME of the env var holding the key, sent as `Authorization: Bearer`; None = no key."""
        self.timeout = timeout
        """Deadline in seconds for one whole request, reply body included (then it is retried)."""
        self.max_retries = max_retries
        """Retries after the first attempt, for transient failures only."""
        self.max_concurrency = max_concurrency
        """Requests in flight at once; further calls wait. A call sleeping in backoff holds no slot."""
        self.default_sampling = dict(default_sampling or {})
        """Sampling keys used when a call does not give its own."""
        self.retry_wait = retry_wait
        """First backoff in seconds; doubles per retry (plus jitter), up to `max_wait`."""
        self.max_wait = max_wait
        """Longest wait between attempts, also the cap on a server's `Retry-After`."""
        self.max_response_bytes = max_response_bytes
        """Largest response body read; a longer one is abandoned mid-stream and retried."""
        self.rate = rate_limiter or (RateLimiter(requests_per_minute, tokens_per_minute)
                                     if requests_per_minute or tokens_per_minute else None)
        """Requests / tokens per minute for hosted APIs (None: only `max_concurrency` bounds calls)."""
        self.usage = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
        """Answered requests and the tokens their replies' `usage` reports, since the model was made."""
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            log.warning("openai.no_api_key", env=api_key_env, base_url=self.base_url)
        self._key = _Secret(key) if key else None
        self._client: httpx.AsyncClient | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._backoff = wait_exponential(multiplier=retry_wait, max=max_wait) + wait_random(0, retry_wait)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def __repr__(self) -> str:
        return (f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env!r})")

    def _scrub(self, text: str) -> str:
        """`text` with the API key and anything else credential-shaped masked (a server may echo
        the Authorization header back)."""
        return mask_secrets(text, self._key.value if self._key else None)

    def body(self, messages: list[Message], sampling: dict[str, Any]) -> dict[str, Any]:
        """The JSON request body for one call."""
        params = {k: v for k, v in {**_aliased(self.default_sampling), **_aliased(sampling)}.items()
                  if v is not None}
        schema = params.pop("json_schema", None)
        if schema is not None:
            params["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "response", "schema": schema, "strict": True}}
        return {"model": self.model, "messages": [m.to_dict() for m in as_messages(messages)], **params}

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        body = self.body(messages, sampling)
        if self._limiter is None:  # made in the event loop, on first use
            self._limiter = anyio.CapacityLimiter(self.max_concurrency)
        start = time.perf_counter()
        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.max_retries + 1), wait=self._wait, reraise=True,
                retry=retry_if_exception_type(_Transient), before_sleep=self._log_retry,
            ):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    if self.rate is not None:
                        await self.rate.acquire()
                    async with self._limiter:  # a slot per attempt: none is held through the backoff
                        text = await self._post(body)
        except _Transient as e:
            raise EngineError(self._scrub(
                f"chat request to {self.url} failed after {attempts} attempt(s): {e}")) from None
        log.debug("openai.chat", model=self.model, latency_s=round(time.perf_counter() - start, 3),
                  attempts=attempts, messages=len(body["messages"]), reply_chars=len(text))
        return text

    async def _post(self, body: dict[str, Any]) -> str:
        """One HTTP attempt within the deadline: the reply text, or _Transient / EngineError."""
        if self._client is None:
            n = self.max_concurrency
            self._client = httpx.AsyncClient(
                timeout=self.timeout, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        headers = {"Authorization": f"Bearer {self._key.value}"} if self._key else {}
        try:
            with anyio.fail_after(self.timeout):
                async with self._client.stream("POST", self.url, json=body, headers=headers) as resp:
                    status = resp.status_code
                    if status == 429 or status >= 500:
                        raise _Transient(f"HTTP {status}", retry_after=_retry_after(resp))
                    data = await self._read(resp)
        except (TimeoutError, httpx.TimeoutException):
            raise _Transient(f"no complete response within {self.timeout}s") from None
        except httpx.TransportError as e:
            raise _Transient(self._scrub(f"{type(e).__name__}: {e}")) from None
        if status >= 400:
            detail = self._scrub(" ".join(data.decode("utf-8", "replace").split()))[:300]  # scrub before cutting
            raise EngineError(f"chat request to {self.url} failed: HTTP {status}: {detail}")
        try:
            parsed = json.loads(data)
            content = parsed["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            raise _Transient(f"unreadable response body (HTTP {status})") from None
        self._count(parsed.get("usage"))
        if content is not None and not isinstance(content, str):
            raise _Transient(f"unreadable response body (HTTP {status}): content is not text")
        return content or ""

    def _count(self, usage: Any) -> None:
        """Add a reply's `usage` (prompt_tokens, completion_tokens; a server may send none)."""
        self.usage["requests"] += 1
        spent = 0
        if isinstance(usage, dict):
            for key in ("prompt_tokens", "completion_tokens"):
                n = usage.get(key)
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    self.usage[key] += n
                    spent += n
        if self.rate is not None:
            self.rate.spent(spent)

    async def _read(self, resp: httpx.Response) -> bytes:
        """The response body, abandoned (as a transient failure) past `max_response_bytes`."""
        limit = self.max_response_bytes
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _Transient(f"reply of {int(declared)} bytes is over max_response_bytes={limit}")
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise _Transient(f"reply over max_response_bytes={limit}")
            chunks.append(chunk)
        return b"".join(chunks)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Transient) and exc.retry_after is not None:
            return min(exc.retry_after, self.max_wait)
        return self._backoff(state)

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("openai.retry", role=self.label, model=self.model, attempt=state.attempt_number,
                    of=self.max_retries + 1, reason=str(exc),
                    wait_s=round(state.next_action.sleep, 3) if state.next_action else None)

    async def close(self) -> None:
        """Close the HTTP connection pool (a later call opens a new one)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
