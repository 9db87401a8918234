"""Engines on plain transformers: a Generator and a RewardModel, on CPU or one GPU.

Model calls run in a worker thread (torch releases the GIL), so the event loop stays free for
the other parts of the pipeline, and under a lock, so a weight update never lands mid-batch.
The generator's calls all run on one thread of its own: CUDA graphs (the fast path) are
captured and replayed per thread.

Log-probabilities are read step by step (`SampledLogprobs`): memory grows with batch × new
tokens, not batch × new tokens × vocabulary.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import structlog
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, GenerationConfig
from transformers.generation import CompileConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper, TopPLogitsWarper

from ..types import Message
from .base import Completion, Generator, RewardModel, RMInput, SamplingParams, unapplied_generation_settings

log = structlog.get_logger("dynalize.backends.hf")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(path: str, **kwargs: Any):
    """The tokenizer of a model directory."""
    return AutoTokenizer.from_pretrained(path, **kwargs)


FAST_MODES = ("auto", "on", "off")
CACHE_LEN_STEP = 256
"""The fast path's static KV cache is sized up to a multiple of this, so that batches of
slightly different prompt widths reuse one cache size, and one compiled decoding step."""


class SampledLogprobs(LogitsProcessor):
    """Records log softmax(logits / T) of each sampled token, and keeps nothing else.

    Placed first among the processors, it sees the raw float32 logits of each step. The token
    sampled from step k is known at step k + 1 (the last column of `input_ids`), so one step's
    log-softmax is kept until then: memory is batch × vocabulary for one step plus batch × new
    tokens, whatever the length (`output_logits=True` kept every step's logits)."""

    def __init__(self, temperature: float, prompt_width: int, max_new_tokens: int, batch: int, device):
        self.temperature = temperature
        self.width = prompt_width
        self.values = torch.zeros(batch, max_new_tokens, dtype=torch.float32, device=device)
        self._pending: torch.Tensor | None = None  # the last step's log-softmax, until its token is known
        self._pending_at = -1

    def _settle(self, sequences: torch.Tensor) -> None:
        k = self._pending_at
        if self._pending is not None and sequences.shape[1] > self.width + k:
            self.values[:, k] = self._pending.gather(-1, sequences[:, self.width + k, None]).squeeze(-1)
        self._pending = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._settle(input_ids)
        self._pending_at = input_ids.shape[1] - self.width
        self._pending = (scores.float() / self.temperature).log_softmax(-1)
        return scores

    def result(self, sequences: torch.Tensor) -> torch.Tensor:
        """Per new token of `sequences` (prompt included), its log-probability."""
        self._settle(sequences)
        return self.values[:, : sequences.shape[1] - self.width]


def sampling_processors(sampling: SamplingParams) -> list[LogitsProcessor]:
    """The warpers `generate` builds for these settings, in its order (temperature, top-p, min-p)."""
    out: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        out.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(sampling.top_p))
    if sampling.min_p:
        out.append(MinPLogitsWarper(sampling.min_p))
    return out


class HFGenerator(Generator):
    """Samples with `model.generate` from a private copy of the policy (a model directory).

    `fast` (`generator.hf_fast`): "on" generates with a static KV cache, and on a GPU a
    compiled decoding step (torch.compile, mode "reduce-overhead": CUDA graphs); "auto" does
    so on CUDA only; "off" uses transformers' dynamic cache, eagerly. Tokens and logprobs are
    sampled the same way on both paths (the same processors and random draws). On a CPU the
    static cache is used without compiling (transformers compiles on accelerators only)."""

    def __init__(self, path: str, dtype: str = "float32", batch_size: int = 64, device: str | None = None,
                 fast: str = "auto"):
        if fast not in FAST_MODES:
            raise ValueError(f"hf_fast must be one of {', '.join(FAST_MODES)}, not {fast!r}")
        self.device = device or default_device()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(self.device).eval()
        self.batch_size = batch_size
        self.fast = fast == "on" or (fast == "auto" and torch.device(self.device).type == "cuda")
        self.compiles = torch.device(self.device).type != "cpu" and self.fast
        self.first_call_s: dict[tuple[int, int], float] = {}
        """Fast path: wall time of the first batch of each (batch, cache length) shape, compile included."""
        self.eos_ids = self._stop_ids()
        self._neutral_generation_config(path)
        self._lock = anyio.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generator")
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

    async def _on_thread(self, fn, *args):
        return await anyio.to_thread.run_sync(self._thread.submit(fn, *args).result)

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        async with self._lock:
            return await self._on_thread(self._generate_all, prompts, sampling)

    async def update_weights(self, state: dict[str, Any], version: int) -> None:
        async with self._lock:  # copied into the same tensors: a captured CUDA graph reads the new weights
            await self._on_thread(self._load_state, state)
            self.version = version

    async def close(self) -> None:
        self._thread.shutdown(wait=True)

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
        recorder = SampledLogprobs(sampling.temperature, width, sampling.max_new_tokens, len(prompts), self.device)
        start = time.perf_counter()
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            temperature=1.0, top_p=1.0, top_k=0, min_p=None,  # the warpers are passed in, after the recorder
            logits_processor=LogitsProcessorList([recorder, *sampling_processors(sampling)]),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=pad,
            **self._fast_settings(width + sampling.max_new_tokens),
        )
        logprobs = recorder.result(sequences)
        new = sequences[:, width:]
        self._note_first_call(len(prompts), time.perf_counter() - start)
        return [self._completion(row, lp) for row, lp in zip(new.tolist(), logprobs.tolist())]

    def _cache_len(self, length: int) -> int:
        return -(-length // CACHE_LEN_STEP) * CACHE_LEN_STEP

    def _fast_settings(self, length: int) -> dict[str, Any]:
        """`generate` keywords of the fast path: a static cache of a rounded-up length (the model
        keeps the longest seen, so one compiled step serves every later batch that fits)."""
        if not self.fast:
            return {}
        settings: dict[str, Any] = {"cache_implementation": "static", "max_cache_len": self._cache_len(length)}
        if self.compiles:
            settings["compile_config"] = CompileConfig(fullgraph=False, mode="reduce-overhead")
        return settings

    def _note_first_call(self, batch: int, seconds: float) -> None:
        if not self.fast:
            return
        key = (batch, getattr(self.model, "_previous_max_cache_length", 0))  # the cache `generate` sized
        if key not in self.first_call_s:
            self.first_call_s[key] = seconds
            log.info("hf.fast_first_batch", batch=batch, cache_len=key[1], seconds=round(seconds, 2),
                     compiled=self.compiles,
                     detail="includes compiling the decoding step; later batches of this shape reuse it")

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
