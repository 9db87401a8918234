"""A ChatModel on an in-process vLLM engine, with JSON-schema constrained decoding; it can share
the policy generator's engine. See docs/vllm.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..types import Message, as_messages
from .base import ChatModel, EngineError
from .vllm import CHAT_SAMPLING_KEYS, VLLMEngine, VLLMGenerator, _in_thread


@dataclass
class _ChatRequest:
    prompt_ids: list[int]
    params: dict[str, Any]
    done: bool = False
    result: str | None = None
    error: BaseException | None = None


class VLLMChatModel(ChatModel):
    """A vLLM engine as a chat model, with JSON-schema constrained decoding (`json_schema=...`).

    Prompts go through the tokenizer's chat template. Calls that arrive while the engine is busy are
    batched into one `generate`. Sampling keys: temperature (0 = greedy, the default), top_p, min_p,
    max_tokens (default 512), seed, json_schema. Pass `engine=` (a VLLMEngine or VLLMGenerator) to
    share an engine; else one is built from `path` with `engine_kwargs` (e.g.
    `structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True}`
    for compact JSON).
    """

    supports_json_schema = True

    def __init__(self, path: str | None = None, *, engine: VLLMEngine | VLLMGenerator | None = None,
                 dtype: str = "float32", gpu_memory_utilization: float = 0.3, max_model_len: int = 4096,
                 default_sampling: dict[str, Any] | None = None, max_batch: int = 256, **engine_kwargs: Any):
        if isinstance(engine, VLLMGenerator):
            engine = engine.engine
        if engine is None:
            if path is None:
                raise ValueError("VLLMChatModel needs a model path or an engine")
            engine = VLLMEngine(path, dtype, gpu_memory_utilization=gpu_memory_utilization,
                                max_model_len=max_model_len, **engine_kwargs)
        self.engine = engine
        self.path = path or engine.path
        self.tokenizer = engine.tokenizer
        if not self.tokenizer.chat_template:
            raise EngineError(f"{self.path}: the tokenizer has no chat template")
        self.default_sampling = dict(default_sampling or {})
        self.max_batch = max_batch
        self._queue: list[_ChatRequest] = []

    def __repr__(self) -> str:
        return f"VLLMChatModel({self.path!r})"

    async def chat(self, messages: list[Message], **sampling: Any) -> str:
        params = {k: v for k, v in {**self.default_sampling, **sampling}.items() if v is not None}
        unknown = sorted(set(params) - set(CHAT_SAMPLING_KEYS))
        if unknown:
            raise TypeError(f"VLLMChatModel.chat: unknown sampling key(s) {', '.join(unknown)}")
        msgs = [m.to_dict() for m in as_messages(messages)]
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        req = _ChatRequest(ids, params)
        self._queue.append(req)
        # Whoever gets the engine first serves every queued call: concurrent calls share one batch.
        while not req.done:
            async with self.engine.lock:
                if req.done:
                    break
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
                if self.engine.asleep:
                    await _in_thread(self.engine._wake_up)
                try:
                    texts = await _in_thread(self._generate_sync, batch)
                except BaseException as e:  # every caller in the batch sees the failure
                    for r in batch:
                        r.error, r.done = e, True
                else:
                    for r, t in zip(batch, texts):
                        r.result, r.done = t, True
        if req.error is not None:
            raise req.error
        return req.result or ""

    def _params(self, p: dict[str, Any]):
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        temperature = float(p.get("temperature", 0.0))
        kwargs: dict[str, Any] = {
            "temperature": temperature,
            "max_tokens": int(p.get("max_tokens", p.get("max_new_tokens", 512))),
            "seed": p.get("seed"),
            "stop_token_ids": list(self.engine.eos_ids),
        }
        if temperature > 0:
            kwargs["top_p"] = float(p.get("top_p", 1.0))
            kwargs["min_p"] = float(p.get("min_p", 0.0))
        if p.get("json_schema") is not None:
            kwargs["structured_outputs"] = StructuredOutputsParams(json=p["json_schema"])
        return VLLMSamplingParams(**kwargs)

    def _generate_sync(self, batch: list[_ChatRequest]) -> list[str]:
        from vllm.inputs import TokensPrompt

        outs = self.engine.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in batch],
                                        [self._params(r.params) for r in batch], use_tqdm=False)
        return [o.outputs[0].text for o in outs]

    async def close(self) -> None:
        self.engine.close()
