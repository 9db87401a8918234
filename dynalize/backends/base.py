"""The engine interfaces. Engines implement these and know nothing of Dynalize.

- `Generator`: samples completions for token-id prompts and reports per-token logprobs.
- `ChatModel`: text in, text out; used for proposers, judges, user simulators, benchmark judges.
- `RewardModel`: scores texts or conversations.
- `Learner`: owns the trainable policy and its optimizer.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from ..types import Message, TrainSequence


class EngineError(RuntimeError):
    """An engine failed in a way that retrying will not fix."""


@dataclass
class SamplingParams:
    """How to sample: these settings and nothing else. Logprobs are reported under `temperature`
    only (before top-p/min-p). A model's own sampling defaults (its generation_config.json:
    repetition penalty, top-k, ...) are not applied: they would reshape the distribution sampled
    from, and the reported logprobs, like the learner's, would no longer be of it."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None


SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
                 "repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram_size",
                 "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "min_length",
                 "min_new_tokens", "exponential_decay_length_penalty", "forced_bos_token_id",
                 "forced_eos_token_id", "renormalize_logits")
"""generation_config.json keys that would shape the distribution sampled from (transformers' and vLLM's)."""


def unapplied_generation_settings(shipped: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings a model's generation config (as a dict) sets that generators do not
    apply (see SamplingParams), for a warning at start-up."""
    return {k: shipped[k] for k in SAMPLING_KEYS if shipped.get(k) is not None}


@dataclass
class Completion:
    """One sampled continuation of a prompt."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (end of sequence) or "length"


class Generator(abc.ABC):
    """Samples from a copy of the policy that the learner updates by version."""

    version: int = 0

    @abc.abstractmethod
    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt (repeat a prompt to get a group)."""

    @abc.abstractmethod
    async def update_weights(self, state: dict[str, Any], version: int) -> None:
        """Load the learner's weights (a name → tensor mapping) and mark them as `version`."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Free the engine's resources."""


class ChatModel(abc.ABC):
    """A chat LLM. `chat_json` (see dynalize.backends.chat) builds on `chat`."""

    @abc.abstractmethod
    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        """The assistant's reply to `messages`. Sampling keys: temperature, max_tokens, ..."""

    supports_json_schema: bool = False
    """True where `chat(..., json_schema=...)` constrains the output to the schema."""

    label: str | None = None
    """What the model is for in the run (e.g. `gold judge`), named in its warnings; set by its user."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Free the engine's resources."""


RMInput = str | list[Message]
"""What a reward model reads: raw text, or a conversation whose last message is the reply."""


class RewardModel(abc.ABC):
    """A scalar reward model (Bradley–Terry or a plain function).

    A `score` that also names a `prompts` parameter gets, aligned with `items`, the `Prompt` each
    item answers (its id, messages and `meta`: a per-prompt answer, say); one that does not is
    called with the items alone (see dynalize.hooks)."""

    @abc.abstractmethod
    async def score(self, items: list[RMInput]) -> list[float]:
        """One score per item, in order."""


class Learner(abc.ABC):
    """Owns the trainable policy, its optimizer and the loss."""

    version: int = 0

    @abc.abstractmethod
    def train_step(self, batch: list[TrainSequence]) -> dict[str, float]:
        """One optimizer step on `batch`; returns metrics (loss, grad_norm, masked fraction...)."""

    @abc.abstractmethod
    def policy_state(self) -> dict[str, Any]:
        """The policy's weights, for `Generator.update_weights`."""

    @abc.abstractmethod
    def save(self, directory: str) -> None:
        """Write policy (safetensors), optimizer and learner state under `directory`."""

    @abc.abstractmethod
    def load(self, directory: str) -> None:
        """Restore what `save` wrote."""
