"""A benchmark's own chat models (judge, patient simulator): built from a spec on the command line,
with the protocol's defaults under it, every key checked, what is used recorded, and the endpoint
tried once before any generation starts.

A spec is a JSON object or a YAML/JSON file: a `ChatModelConfig` (`engine`, `model`, `base_url`,
`api_key_env`, `path`, `timeout`, `max_retries`, `max_concurrency`) plus sampling keys that go
with every call (`SAMPLING_KEYS`). The protocol supplies defaults for the sampling keys and the
timeout (each benchmark's module says which and why); a key in the spec replaces its default; a
sampling key set to null is not sent (the server's own default applies). A key the engine would
not use is refused with one line, so no value is silently ignored. `RoleModel.public` is what the
results record: the engine, the model and the sampling actually sent.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..backends.base import ChatModel
from ..backends.chat import LimitedChatModel
from ..backends.config import ChatModelConfig
from ..errors import ConfigError, one_line
from ..types import Message
from .common import BenchmarkError, read_chat_spec


class Sampling(BaseModel):
    """Sampling keys a benchmark's chat model sends with every call (None: left to the server)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, gt=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    reasoning_effort: str | None = None
    """OpenAI-style reasoning effort (`low`, `medium`, `high`), for endpoints that take it."""


SAMPLING_KEYS = tuple(Sampling.model_fields)
ENGINE_KEYS = {
    "openai": set(ChatModelConfig.model_fields) - {"engine", "path", *SAMPLING_KEYS},
    "hf": {"path"},
    "scripted": {"path", "max_concurrency"},
}
"""ChatModelConfig keys each engine uses (besides `engine`); any other one is refused."""
ENGINE_SAMPLING = {"openai": set(SAMPLING_KEYS), "hf": set(SAMPLING_KEYS) - {"reasoning_effort"},
                   "scripted": set(SAMPLING_KEYS)}
"""Sampling keys each engine applies."""
OPENAI_API_HOST = "api.openai.com"
"""The one host the official EQ-Bench client never sends min_p to (it rejects the key)."""
PROBE = [Message("user", "Reply with the word OK.")]
PROBE_MAX_TOKENS = 16


@dataclass
class RoleModel:
    """A chat model for one role of a benchmark and the sampling every call sends."""

    flag: str
    """The command-line flag it came from (`--judge`, `--patient`), for messages."""
    model: ChatModel
    sampling: dict[str, Any]
    """Sent with every call; a None value is not sent (the engine's or server's default applies)."""
    public: dict[str, Any]
    """What the results record: engine, model, endpoint, concurrency, timeout, sampling."""

    async def check(self) -> None:
        """One short call to an `openai` endpoint with the role's sampling (max_tokens aside), so an
        unreachable server or a refused key stops the evaluation before any generation."""
        if self.public.get("engine") != "openai":
            return
        try:
            await self.model.chat(PROBE, **{**self.sampling, "max_tokens": PROBE_MAX_TOKENS})
        except Exception as e:  # noqa: BLE001 - any failure here is reported as one line
            detail = " ".join(str(e).split())[:300]
            raise BenchmarkError(f"{self.flag}: {self.public.get('base_url')} did not answer a test request "
                                 f"({type(e).__name__}: {detail})") from None


def is_local_url(url: str | None) -> bool:
    """True for loopback and private-network hosts (`localhost`, 127.0.0.1, ::1, 10.x, 192.168.x, ...)."""
    host = urlsplit(url or "").hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_unspecified


def role_model(spec: str, flag: str, defaults: dict[str, Any], *, concurrency: int, timeout: float) -> RoleModel:
    """The chat model `spec` names for a role whose protocol defaults are `defaults` (sampling keys)
    and `timeout` (seconds per request, openai only). `concurrency` (the --concurrency flag) is the
    number of calls in flight unless the spec sets `max_concurrency`."""
    data = dict(read_chat_spec(spec, flag))
    engine = data.get("engine", ChatModelConfig.model_fields["engine"].default)
    if engine not in ENGINE_KEYS:
        raise BenchmarkError(f"{flag}: unknown engine {engine!r} (known: {', '.join(ENGINE_KEYS)})")
    given = {k: data.pop(k) for k in SAMPLING_KEYS if k in data}
    _refuse_unused(flag, engine, data, given)
    try:
        Sampling.model_validate(given)
    except ValidationError as e:
        raise BenchmarkError(one_line(e, prefix=flag)) from None
    sampling = {**defaults, **given}
    if engine == "openai":
        if "min_p" not in given and urlsplit(data.get("base_url") or "").hostname == OPENAI_API_HOST:
            sampling["min_p"] = None  # as the official EQ-Bench client: that API refuses min_p
        data.setdefault("timeout", timeout)
    limit = int(data.get("max_concurrency", concurrency))
    if engine != "hf":
        data["max_concurrency"] = limit
    model = _build(data, flag)
    public = {k: data[k] for k in ("engine", "model", "base_url", "path", "timeout") if data.get(k) is not None}
    public.update(engine=engine, max_concurrency=1 if engine == "hf" else limit, sampling=sampling)
    return RoleModel(flag, LimitedChatModel(model, limit), sampling, public)


def chat_model_from_spec(spec: str, flag: str, max_concurrency: int) -> ChatModel:
    """The chat model a plain `ChatModelConfig` spec names (no sampling keys beyond its own
    `temperature`, `max_tokens`), with at most `max_concurrency` calls in flight (the penalty audit's judge)."""
    return LimitedChatModel(_build(dict(read_chat_spec(spec, flag)), flag), max_concurrency)


def _build(data: dict[str, Any], flag: str) -> ChatModel:
    """`build_chat_model`, sending no key to a local endpoint unless one is named or set (no warning)."""
    from ..build import build_chat_model

    key_env = ChatModelConfig.model_fields["api_key_env"].default
    if data.get("engine", "openai") == "openai" and "api_key_env" not in data \
            and is_local_url(data.get("base_url")) and not os.environ.get(key_env or ""):
        data = {**data, "api_key_env": None}
    try:
        return build_chat_model(data)
    except (ConfigError, ValueError, ImportError, AttributeError) as e:
        raise BenchmarkError(f"{flag}: {e}") from None


def _refuse_unused(flag: str, engine: str, data: dict[str, Any], sampling: dict[str, Any]) -> None:
    known = set(ChatModelConfig.model_fields) - {"temperature", "max_tokens"}
    for key in data:
        if key == "engine" or key in ENGINE_KEYS[engine]:
            continue
        if key in known:
            raise BenchmarkError(f"{flag}: {key} has no effect with the {engine} engine (remove it)")
        raise BenchmarkError(f"{flag}: unknown key {key!r} (known: {', '.join(sorted(known | set(SAMPLING_KEYS)))})")
    for key in sampling:
        if key not in ENGINE_SAMPLING[engine]:
            raise BenchmarkError(f"{flag}: {key} is not applied by the {engine} engine (remove it)")
