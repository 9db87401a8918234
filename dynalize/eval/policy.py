"""The policy under evaluation: a saved checkpoint that answers whole batches of conversations.

`load_policy(path, engine)` is the one place that picks a generation engine for evaluation:
`hf` (transformers, CPU or one GPU; its options, e.g. `fast`, as keywords: see HFGenerator) or
`vllm` (in-process engine). Adding an engine is one
branch here. Conversations go through the checkpoint's own chat template
(`dynalize.rollouts.prompt_token_ids`) and come back as raw text, reasoning included: each
protocol strips reasoning its own way.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import Generator, SamplingParams
from ..rollouts import prompt_token_ids
from ..types import Message

POLICY_ENGINES = ("hf", "vllm")


class PolicySampler:
    """Samples one reply per conversation from a Generator, in one batch."""

    def __init__(self, generator: Generator, tokenizer: Any):
        self.generator = generator
        self.tokenizer = tokenizer

    async def sample(self, conversations: list[list[Message]], sampling: SamplingParams) -> list[str]:
        if not conversations:
            return []
        prompts = [prompt_token_ids(self.tokenizer, c) for c in conversations]
        return [c.text for c in await self.generator.generate(prompts, sampling)]

    async def close(self) -> None:
        await self.generator.close()


def load_policy(path: str, engine: str = "hf", *, dtype: str = "float32", batch_size: int = 64,
                **engine_args: Any) -> PolicySampler:
    """A sampler for the model directory `path` (a checkpoint's `policy/` or `tiny:<name>`)."""
    from ..backends.hf import load_tokenizer
    from ..build import model_dir

    path = model_dir(path)

    if engine == "hf":
        from ..backends.hf import HFGenerator

        gen = HFGenerator(path, dtype=dtype, batch_size=batch_size, **engine_args)
        return PolicySampler(gen, gen.tokenizer)
    if engine == "vllm":
        from ..backends.vllm import build_vllm_generator

        return PolicySampler(build_vllm_generator(path, dtype, **engine_args), load_tokenizer(path))
    raise ValueError(f"unknown policy engine {engine!r}: use one of {', '.join(POLICY_ENGINES)}")
