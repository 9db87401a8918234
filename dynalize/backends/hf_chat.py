"""ChatModel on a local transformers causal LM, prompted through its tokenizer's chat template.

For offline runs and tests (a tiny model), or a small local judge. Generation runs in a
worker thread, one call at a time, so the event loop stays free.
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..types import Message, as_messages
from .base import ChatModel, EngineError

log = structlog.get_logger("dynalize.backends.hf_chat")

SAMPLING_KEYS = ("temperature", "top_p", "min_p", "max_tokens", "max_new_tokens", "seed", "json_schema")
"""Keys `chat` reads; json_schema is accepted and ignored (no constrained decoding here)."""


class HFChatModel(ChatModel):
    """A transformers causal LM as a chat model.

    Sampling keys: temperature (0 = greedy, the default), top_p, min_p, max_tokens (default 512),
    seed (sampling is then reproducible; the global torch RNG is left untouched).
    """

    supports_json_schema = False

    def __init__(self, path: str, *, device: str | None = None, dtype: str = "float32",
                 default_sampling: dict[str, Any] | None = None):
        self.path = path
        """The model directory."""
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        """Where the model runs; default cuda when available, else cpu."""
        self.default_sampling = dict(default_sampling or {})
        """Sampling keys used when a call does not give its own."""
        directory = path
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        if not self.tokenizer.chat_template:
            raise EngineError(f"{path}: the tokenizer has no chat template")
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self._limiter: anyio.CapacityLimiter | None = None  # one generation at a time

    def __repr__(self) -> str:
        return f"HFChatModel({self.path!r}, device={self.device!r})"

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        params = {k: v for k, v in {**self.default_sampling, **sampling}.items() if v is not None}
        unknown = sorted(set(params) - set(SAMPLING_KEYS))
        if unknown:
            raise TypeError(f"HFChatModel.chat: unknown sampling key(s) {', '.join(unknown)}")
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        msgs = [m.to_dict() for m in as_messages(messages)]
        return await anyio.to_thread.run_sync(self._generate, msgs, params, limiter=self._limiter)

    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> str:
        tok = self.tokenizer
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = tok(prompt, add_special_tokens=False, return_tensors="pt").to(self.device)
        temperature = float(params.get("temperature", 0.0))
        max_tokens = int(params.get("max_tokens", params.get("max_new_tokens", 512)))
        gen = GenerationConfig(
            max_new_tokens=max_tokens, do_sample=temperature > 0,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        if temperature > 0:
            gen.temperature = temperature
            gen.top_p = float(params.get("top_p", 1.0))
            if params.get("min_p"):
                gen.min_p = float(params["min_p"])
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if params.get("seed") is not None:
                torch.manual_seed(int(params["seed"]))
            out = self.model.generate(**enc, generation_config=gen)
        new = out[0, enc["input_ids"].shape[1]:]
        log.debug("hf_chat.generate", prompt_tokens=enc["input_ids"].shape[1], new_tokens=len(new))
        return tok.decode(new, skip_special_tokens=True)
