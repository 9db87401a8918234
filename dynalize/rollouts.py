"""How a rollout unfolds: prompts → chat-template tokens → sampled replies → `Rollout`s.

Single-turn: one policy reply per rollout. The token sequence the learner trains on is exactly
the prompt's template tokens followed by the generated ids (never re-tokenised).
"""

from __future__ import annotations

from typing import Any

from .backends.base import Generator, SamplingParams
from .tasks.base import Task
from .types import Message, Prompt, Rollout


def prompt_token_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The chat-template tokens of `messages`, ending with the assistant generation prompt."""
    text = tokenizer.apply_chat_template([m.to_dict() for m in messages], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def sample_groups(
    generator: Generator,
    tokenizer: Any,
    task: Task,
    prompts: list[Prompt],
    group_size: int,
    sampling: SamplingParams,
) -> list[list[Rollout]]:
    """G rollouts for each prompt, all from the generator's current policy version."""
    version = generator.version
    encoded = [prompt_token_ids(tokenizer, p.messages) for p in prompts]
    requests = [ids for ids in encoded for _ in range(group_size)]
    completions = await generator.generate(requests, sampling)
    groups: list[list[Rollout]] = []
    for g, (prompt, ids) in enumerate(zip(prompts, encoded)):
        group = []
        for c in completions[g * group_size : (g + 1) * group_size]:
            reasoning, reply = task.split_reasoning(c.text)
            group.append(Rollout(
                prompt_id=prompt.id, group=g, prompt_ids=ids, completion_ids=c.token_ids,
                logprobs=c.logprobs, loss_mask=[1] * len(c.token_ids), replies=[reply],
                reasoning=[reasoning] if reasoning else [], policy_version=version,
                truncated=c.finish_reason == "length", messages=list(prompt.messages),
            ))
        groups.append(group)
    return groups


def rm_inputs(task: Task, rollout: Rollout) -> list:
    """What the RM reads for each policy reply of a rollout."""
    return [task.rm_input(rollout.messages, reply) for reply in rollout.replies]
