"""Engines on plain transformers: a Generator and a RewardModel, on CPU or one GPU.

Model calls run in a worker thread (torch releases the GIL), so the event loop stays free for
the other parts of the pipeline, and under a lock, so a weight update never lands mid-batch.
"""

from __future__ import annotations

from typing import Any

import anyio
import structlog
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, GenerationConfig

from ..types import Message
from .base import Completion, Generator, RewardModel, RMInput, SamplingParams, unapplied_generation_settings

log = structlog.get_logger("dynalize.backends.hf")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(path: str, **kwargs: Any):
    """The tokenizer of a model directory."""
    return AutoTokenizer.from_pretrained(path, **kwargs)


class HFGenerator(Generator):
    """Samples with `model.generate` from a private copy of the policy (a model directory)."""

    def __init__(self, path: str, dtype: str = "float32", batch_size: int = 64, device: str | None = None):
        self.device = device or default_device()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(self.device).eval()
        self.batch_size = batch_size
        self.eos_ids = self._stop_ids()
        self._neutral_generation_config(path)
        self._lock = anyio.Lock()
        self.version = 0

    def _stop_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = self.model.generation_config.eos_token_id
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        return sorted(i for i in ids if i is not None)

    def _neutral_generation_config(self, path: str) -> None:
        """Replace the model's generation config by one that names tokens only. `generate` fills
        every setting not passed in a call from it, so e.g. a shipped `repetition_penalty` would
        reshape the distribution sampled from while the reported logprobs are softmax(logits / T)."""
        shipped = self.model.generation_config
        ignored = unapplied_generation_settings(shipped.to_dict())
        if ignored:
            log.warning("hf.generation_config_not_applied", path=path, settings=ignored,
                        detail="sampling uses the run's temperature / top_p / min_p only")
        self.model.generation_config = GenerationConfig(
            bos_token_id=shipped.bos_token_id, eos_token_id=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id)

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        async with self._lock:
            return await anyio.to_thread.run_sync(self._generate_all, prompts, sampling)

    async def update_weights(self, state: dict[str, Any], version: int) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._load_state, state)
            self.version = version

    @torch.no_grad()
    def _load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state, strict=False)

    def _generate_all(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out: list[Completion] = []
        for i in range(0, len(prompts), self.batch_size):
            out.extend(self._generate_batch(prompts[i : i + self.batch_size], sampling))
        return out

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            min_p=sampling.min_p or None,
            top_k=0,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_logits=True,
        )
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / sampling.temperature
        logprobs = torch.gather(logits.log_softmax(-1), -1, new.unsqueeze(-1)).squeeze(-1)
        return [self._completion(row, lp) for row, lp in zip(new.tolist(), logprobs.tolist())]

    def _completion(self, row: list[int], logprobs: list[float]) -> Completion:
        end = next((i + 1 for i, t in enumerate(row) if t in self.eos_ids), None)
        ids = row[:end] if end else row
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, logprobs[: len(ids)], text, "stop" if end else "length")


def encode_rm_input(tokenizer: Any, item: RMInput, max_length: int) -> list[int]:
    """The token ids a reward model reads for one item: a string as raw text (special tokens
    added, truncated from the right), a conversation through the tokenizer's chat template
    (truncated from the left, so the reply is kept). Training (`dynalize.rm.train`) encodes
    with this same function, so an RM trains on exactly what it later scores."""
    if isinstance(item, str):
        return tokenizer(item, add_special_tokens=True)["input_ids"][:max_length]
    msgs = [m.to_dict() if isinstance(m, Message) else m for m in item]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]


class HFRewardModel(RewardModel):
    """A sequence classifier with one output (`num_labels=1`), batched.

    A string item is scored as raw text (no template), truncated from the right; a conversation
    goes through the RM tokenizer's chat template, truncated from the left (the reply is kept).
    """

    def __init__(self, path: str, batch_size: int = 16, max_length: int = 2048, dtype: str = "float32",
                 device: str | None = None):
        self.device = device or default_device()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[dtype])
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self.max_length = max_length
        self._lock = anyio.Lock()

    async def score(self, items: list[RMInput]) -> list[float]:
        encoded = [encode_rm_input(self.tokenizer, x, self.max_length) for x in items]
        async with self._lock:
            return await anyio.to_thread.run_sync(self._score_ids, encoded)

    @torch.no_grad()
    def _score_ids(self, encoded: list[list[int]]) -> list[float]:
        scores: list[float] = []
        for i in range(0, len(encoded), self.batch_size):
            chunk = encoded[i : i + self.batch_size]
            enc = self.tokenizer.pad({"input_ids": chunk}, padding=True, return_tensors="pt").to(self.device)
            scores.extend(self.model(**enc).logits[:, 0].float().tolist())
        return scores
