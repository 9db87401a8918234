"""Settings of the chat-model engines, as data: no engine is imported here.

`dynalize.build.build_chat_model` turns a `ChatModelConfig` into an engine.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

CHAT_ENGINES = ("openai", "hf", "vllm", "scripted")
"""The chat engines `build_chat_model` knows."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

KEY_FORMATS = re.compile(
    r"sk-|(sk|pk|rk)_(live|test)_|(hf|gsk|gh[pousr]|github_pat|r8|npm|glpat|pypi|nvapi|pplx|xox[abprse])[-_][A-Za-z0-9_-]{16,}"
    r"|AIza[A-Za-z0-9_-]{16,}|(AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}|eyJ[A-Za-z0-9_-]{8,}")
"""The starts of known API key and token formats (OpenAI, Hugging Face, Groq, GitHub, Slack, GitLab,
PyPI, npm, Replicate, NVIDIA, Perplexity, Google, AWS access key ids, JWTs)."""


def _entropy(text: str) -> float:
    """Shannon entropy of `text` in bits per character."""
    return -sum(n / len(text) * math.log2(n / len(text)) for n in Counter(text).values())


def looks_like_key(value: str) -> bool:
    """Whether `value` looks like a credential rather than a variable name: a known key format, or
    a long random-looking part (a run of 16+ characters between underscores mixing cases or
    letters and digits with high entropy; variable names are words: OPENAI_API_KEY, MY_KEY_2)."""
    if KEY_FORMATS.match(value):
        return True
    if len(value) >= 24 and "_" not in value and any(c.isdigit() for c in value):
        return True
    for part in value.split("_"):
        mixed = (part.lower() != part and part.upper() != part) or (
            any(c.isdigit() for c in part) and any(c.isalpha() for c in part))
        if len(part) >= 16 and mixed and _entropy(part) >= 3.3:
            return True
    return len(value) >= 40 and _entropy(value) >= 4.0


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be the NAME of an environment variable (None if it can).

    A pasted key is refused without being repeated: anything but letters, digits and `_`, a
    leading digit, more than 64 characters, or what `looks_like_key`.
    """
    if not _ENV_NAME.fullmatch(name) or looks_like_key(name):
        return ("must be the NAME of an environment variable holding the key (letters, digits and _), "
                "not the key itself")
    return None


KEY_PARAMS = {"apikey", "key", "token", "accesstoken", "auth", "authorization", "password", "passwd", "pwd",
              "secret", "clientsecret", "sig", "signature", "code", "xapikey", "subscriptionkey", "session"}
"""Query-parameter names (lower case, `-` and `_` dropped) that carry a credential."""


def url_credential_problem(url: str) -> str | None:
    """Why `url` may not be an endpoint setting because it carries a key (None when it carries
    none): user info (`user:key@host`), a key-like query parameter (`?api-key=…`), or a query value
    or path segment in a known key format (`sk-…`, `hf_…`). The key itself is never repeated."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # not a URL at all: the engine's own checks report it
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return ("must not hold credentials (user info before @): put the key in the environment variable "
                "that api_key_env names")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower().replace("-", "").replace("_", "") in KEY_PARAMS or KEY_FORMATS.match(value):
            return (f"must not hold a key (query parameter {name[:40]!r}): put the key in the environment variable "
                    f"that api_key_env names")
    if any(KEY_FORMATS.match(p) for p in parts.path.split("/")):
        return "must not hold a key (in its path): put the key in the environment variable that api_key_env names"
    return None


class ChatModelConfig(BaseModel):
    """Which chat model to use for a role (proposer, judge, user simulator, benchmark judge)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              hide_input_in_errors=True)  # a pasted key is never echoed

    engine: str = "openai"
    """`openai` (any OpenAI-compatible endpoint), `hf` (local transformers model), `vllm` (local model on
    an in-process vLLM engine of its own: JSON-schema constrained answers, gpu_memory_utilization 0.3,
    max_model_len 4096 or the model's own limit if shorter; see docs/vllm.md), `scripted` (canned)."""
    model: str | None = None
    """openai: the model name sent with each request."""
    base_url: str | None = None
    """openai: endpoint root including `/v1`, e.g. `http://127.0.0.1:8000/v1`. Never a key in it (user
    info `user:key@`, a key-like query parameter such as `?api-key=`): refused, without being printed."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """openai: NAME of the environment variable holding the API key (None = no key); never the key
    (a value that looks like a key is refused, without being printed)."""
    path: str | None = None
    """hf, vllm: model directory or `tiny:<name>`. scripted: `module:attr`, a reply list or function."""
    timeout: float = Field(60.0, gt=0)
    """openai: deadline in seconds for a whole request, from sending it to the last byte of the
    reply (a slow trickle is cut too); then it is abandoned and retried."""
    max_retries: int = Field(5, ge=0)
    """openai: retries after a 429, 5xx, timeout, connection error, unreadable or oversized reply."""
    retry_wait: float = Field(0.5, gt=0)
    """openai: first backoff in seconds; doubles per retry (plus jitter), at most 60 s. A call
    holds no concurrency slot while it waits."""
    max_response_bytes: int = Field(1_048_576, gt=0)
    """openai: largest response body read (bytes); a longer one is abandoned as it streams in
    and retried. Chat replies are kilobytes: 1 MiB leaves room for long reasoning."""
    max_concurrency: int = Field(16, gt=0)
    """Requests in flight at once (hf generates one at a time regardless)."""
    requests_per_minute: float | None = Field(None, gt=0)
    """openai: at most this many requests started in any 60 s (a hosted API's RPM limit; None: no
    limit, only max_concurrency). A request past it waits; the wait holds no concurrency slot."""
    tokens_per_minute: float | None = Field(None, gt=0)
    """openai: requests wait while the tokens of the last 60 s (prompt + completion, from each reply's
    `usage`) reach this (a hosted API's TPM limit; None: no limit)."""
    temperature: float = Field(0.0, ge=0)
    """Default sampling temperature (0 = greedy); a call's own `temperature` wins."""
    max_tokens: int = Field(1024, gt=0)
    """Default longest reply in tokens; a call's own `max_tokens` wins."""

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and (problem := env_name_problem(v)):
            raise ValueError(problem)
        return v

    @field_validator("base_url")
    @classmethod
    def _no_key_in_url(cls, v: str | None) -> str | None:
        if v is not None and (problem := url_credential_problem(v)):
            raise ValueError(problem)  # the URL itself is never echoed
        return v

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in CHAT_ENGINES:
            raise ValueError(f"unknown chat engine {v!r}; known: {', '.join(CHAT_ENGINES)}")
        return v
