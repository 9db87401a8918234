"""How a rollout unfolds: prompts → chat-template tokens → sampled replies → `Rollout`s.

Single-turn: one policy reply. Multi-turn (`task.max_turns > 1`): policy replies alternate with
simulated-user messages (`task.user_reply`) until the user ends the conversation or the turn
limit is reached. A simulated user whose engine fails (`EngineError`: an API still answering
500 after its retries) ends that conversation there, marked `user_failed` with the reason; the
loop leaves its group out of the update, counted, as it does a failed judge verdict (any other
exception in `user_reply` is a bug: it stops the run as a HookError). The learner trains on
exactly the token ids the generator saw and produced: generated ids are kept as they are, and
only the text *between* replies (end of the reply's message, the user's message, the next
generation prompt, as the chat template renders them after the reply in the whole conversation)
is tokenised, so the loss mask (1 on policy tokens, 0 on everything else) can never shift, and
templates that render the last assistant turn unlike the earlier ones (Qwen3's) work. Each turn samples with its own seed, derived from the batch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import structlog

from .backends.base import Completion, EngineError, Generator, SamplingParams
from .errors import describe
from .hooks import HookError, optional, owner_name, unwrap_hook_errors, user_code
from .schedule import derived_seed
from .tasks.base import Task
from .types import Message, Prompt, Rollout

log = structlog.get_logger("dynalize.rollouts")

USER_FAILED = "user_failed"
"""A rollout's `info` key: why its simulated user gave no next message (its engine failed); the
conversation ends there and the loop leaves the rollout's group out of the update."""


def render(tokenizer: Any, messages: list[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template([m.to_dict() for m in messages], add_generation_prompt=generation_prompt,
                                         tokenize=False)


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_token_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The chat-template tokens of `messages`, ending with the assistant generation prompt."""
    return encode(tokenizer, render(tokenizer, messages, generation_prompt=True))


_REPLY = "\ue000reply\ue000"  # stands for the reply while rendering the template around it


def between_turns_ids(tokenizer: Any, conversation: list[Message], user: str, stop_text: str | None) -> list[int]:
    """Tokens from the end of a generated reply to the start of the next one: what the chat
    template puts after the reply once the user answers it (the end of the reply's message, the
    user's message, the next assistant generation prompt), cut from the rendering of the whole
    conversation. Templates that render the last assistant turn differently from earlier ones
    (Qwen3's empty <think></think> block) work: nothing before the reply is re-rendered, the
    generated tokens stay as they were. `stop_text` is the text of the token the reply stopped
    on; the template's closing does not repeat it."""
    full = render(tokenizer, [*conversation, Message("assistant", _REPLY), Message("user", user)],
                  generation_prompt=True)
    if full.count(_REPLY) != 1:
        raise ValueError("the chat template does not render an assistant message's content verbatim, once; "
                         "multi-turn rollouts need one that does")
    closing = full[full.index(_REPLY) + len(_REPLY):]
    if stop_text and closing.startswith(stop_text):
        closing = closing[len(stop_text):]
    return encode(tokenizer, closing)


def turn_sampling(sampling: SamplingParams, turn: int) -> SamplingParams:
    """The sampling of a rollout's `turn`-th policy reply: turn 0 keeps the batch's seed, later
    turns get their own, derived from it, so the turns of a conversation do not draw the same
    random numbers (and a run, or its resume, still samples exactly the same)."""
    if turn == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=derived_seed(sampling.seed, "turn", turn))


@dataclass
class _Episode:
    """A rollout under construction."""

    prompt: Prompt
    group: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Message] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    truncated: bool = False
    done: bool = False
    user_failed: str | None = None

    @property
    def conversation(self) -> list[Message]:
        return [*self.prompt.messages, *self.turns]

    def add_reply(self, task: Task, c: Completion) -> None:
        self.completion_ids += c.token_ids
        self.logprobs += c.logprobs
        self.loss_mask += [1] * len(c.token_ids)
        with user_code(owner_name("task", task), "split_reasoning"):
            reasoning, reply = task.split_reasoning(c.text)
        self.replies.append(reply)
        self.reasoning.append(reasoning)  # aligned with replies ("" where there was none)
        self.turns.append(Message("assistant", reply))
        self.truncated |= c.finish_reason == "length"

    def add_user(self, ids: list[int], user: str) -> None:
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.turns.append(Message("user", user))

    def to_rollout(self, version: int) -> Rollout:
        return Rollout(
            prompt_id=self.prompt.id, group=self.group, prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids, logprobs=self.logprobs, loss_mask=self.loss_mask,
            replies=self.replies, reasoning=self.reasoning if any(self.reasoning) else [],
            policy_version=version, truncated=self.truncated,
            messages=list(self.prompt.messages), meta=self.prompt.meta, turns=self.turns,
            info={USER_FAILED: self.user_failed} if self.user_failed else {},
        )


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
    episodes = []
    for g, prompt in enumerate(prompts):
        ids = prompt_token_ids(tokenizer, prompt.messages)
        episodes += [_Episode(prompt, g, ids) for _ in range(group_size)]
    for turn in range(task.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        completions = await generator.generate([e.prompt_ids + e.completion_ids for e in active],
                                               turn_sampling(sampling, turn))
        for e, c in zip(active, completions):
            e.add_reply(task, c)
        if turn + 1 < task.max_turns:
            stops = [tokenizer.decode(c.token_ids[-1:]) if c.finish_reason == "stop" else None for c in completions]
            await _user_turns(task, tokenizer, active, stops)
    return [[e.to_rollout(version) for e in episodes if e.group == g] for g in range(len(prompts))]


async def _user_turns(task: Task, tokenizer: Any, episodes: list[_Episode], stops: list[str | None]) -> None:
    """Ask the simulated user for each conversation's next message, concurrently (with the
    conversation's Prompt when `user_reply` names a `prompt` argument). `stops[i]`: the text of
    the token episode i's last reply stopped on (None: it ran out of tokens). A simulated user
    whose engine fails ends its conversation (`user_failed`); any other failing `user_reply`
    raises one HookError, however many conversations it failed in."""
    owner = owner_name("task", task)

    async def one(e: _Episode, stop: str | None) -> None:
        try:
            with user_code(owner, "user_reply"):
                user = await task.user_reply(e.conversation, **optional(task.user_reply, prompt=e.prompt))
                if user is not None and not isinstance(user, str):
                    raise TypeError(f"returned a {type(user).__name__}, not a str or None")
        except HookError as err:
            if not isinstance(err.error, EngineError):
                raise
            e.user_failed, e.done = describe(err.error), True
            log.warning("rollout.user_failed", prompt_id=e.prompt.id, reason=e.user_failed)
            return
        if user is None:
            e.done = True
            return
        e.add_user(between_turns_ids(tokenizer, e.conversation[:-1], user, stop), user)

    with unwrap_hook_errors():
        async with anyio.create_task_group() as tg:
            for e, stop in zip(episodes, stops):
                tg.start_soon(one, e, stop)
