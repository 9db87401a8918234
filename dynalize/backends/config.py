"""Settings of the chat-model engines, as data: no engine is imported here.

`dynalize.build.build_chat_model` turns a `ChatModelConfig` into an engine.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

CHAT_ENGINES = ("openai", "hf", "vllm", "scripted")
"""The chat engines `build_chat_model` knows."""


class ChatModelConfig(BaseModel):
    """Which chat model to use for a role (proposer, judge, user simulator, benchmark judge)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    engine: str = "openai"
    """`openai` (any OpenAI-compatible endpoint), `hf` (local transformers model), `vllm` (local model on
    an in-process vLLM engine of its own: JSON-schema constrained answers, gpu_memory_utilization 0.3,
    max_model_len 4096 or the model's own limit if shorter; see docs/vllm.md), `scripted` (canned)."""
    model: str | None = None
    """openai: the model name sent with each request."""
    base_url: str | None = None
    """openai: endpoint root including `/v1`, e.g. `http://127.0.0.1:8000/v1`."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """openai: NAME of the environment variable holding the API key (None = no key); never the key."""
    path: str | None = None
    """hf, vllm: model directory or `tiny:<name>`. scripted: `module:attr`, a reply list or function."""
    timeout: float = Field(60.0, gt=0)
    """openai: seconds before a request is abandoned (and retried)."""
    max_retries: int = Field(5, ge=0)
    """openai: retries after a 429, 5xx, timeout or connection error."""
    max_concurrency: int = Field(16, gt=0)
    """Requests in flight at once (hf generates one at a time regardless)."""
    temperature: float = Field(0.0, ge=0)
    """Default sampling temperature (0 = greedy); a call's own `temperature` wins."""
    max_tokens: int = Field(1024, gt=0)
    """Default longest reply in tokens; a call's own `max_tokens` wins."""

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in CHAT_ENGINES:
            raise ValueError(f"unknown chat engine {v!r}; known: {', '.join(CHAT_ENGINES)}")
        return v
