"""Counselling: the policy writes a counsellor's next reply; single-turn and multi-turn.

Data (docs/data_formats.md): rows `{"id", "messages": [{"role", "content"}, ...], "meta": {...}}`
whose last message is from the person seeking support (`user`); `meta` (optional) becomes the
prompt's `Prompt.meta`. The RM reads the conversation plus the reply as a chat (its own chat
template applies). A reasoning block (`<think>…</think>` by default) is split off the reply: RM
and judge see only the final reply.

`counseling_multiturn` continues each conversation for up to `max_turns` (≤ 4) policy replies,
with a simulated patient (any ChatModel) answering in between; the patient ends the session by
writing the end marker. Each conversation's patient follows its row's `meta.persona`, or the
task's persona when the row has none. The loop scores every policy reply and averages.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, model_validator

from ..backends.base import ChatModel
from ..backends.config import ChatModelConfig
from ..errors import ConfigError
from ..types import Message, Prompt
from .base import Split, Task
from .data import DataArgs, Row, load_splits, missing, read_rows, read_text_file, row_meta, short_hash
from .text import length_metrics, split_reasoning_tags

ROLES = {
    "system": "system",
    "user": "user", "patient": "user", "client": "user",
    "assistant": "assistant", "counselor": "assistant", "counsellor": "assistant", "therapist": "assistant",
}
"""Accepted message roles (case-insensitive) and the chat role each becomes."""


def parse_conversation(row: Row, field: str = "messages") -> list[Message]:
    """A row's messages as chat Messages: roles mapped (see ROLES), a system message only first,
    the last from the user. A JSON string (CSV) is parsed first."""
    raw: Any = row.data[field]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise row.fail(f"field {field!r} is not a JSON list of messages") from None
    if not isinstance(raw, list) or not raw:
        raise row.fail(f"field {field!r} must be a non-empty list of {{role, content}} messages")
    out = []
    for k, m in enumerate(raw):
        if not isinstance(m, dict):
            raise row.fail(f"{field}[{k}] is not an object with role and content")
        for key in ("role", "content"):
            if missing(m.get(key)) or not isinstance(m[key], str):
                raise row.fail(f"{field}[{k}]: missing field {key!r}")
        role = ROLES.get(m["role"].strip().lower())
        if role is None:
            raise row.fail(f"{field}[{k}]: unknown role {m['role']!r} (use system, user or assistant)")
        if role == "system" and k:
            raise row.fail(f"{field}[{k}]: only the first message may be a system message")
        out.append(Message(role, m["content"]))
    if out[-1].role != "user":
        raise row.fail(f"{field}: the last message must be from the user (the policy writes the next reply)")
    return out


class CounselingArgs(DataArgs):
    """Settings of the single-turn counselling task (`task.args`)."""

    system_prompt: str | None = None
    """A system message added to conversations that have none (None = add nothing)."""
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Opening and closing delimiters of a reasoning block in replies (None = no reasoning)."""


class CounselingTask(Task):
    """Reply as a counsellor to the last message of a conversation."""

    Args = CounselingArgs
    description = ("Counselling: the assistant replies as a counsellor to a person who has come to talk about "
                   "something on their mind.")

    def __init__(self, args: CounselingArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: CounselingArgs = args
        self._prompts = load_splits(args, self.load)

    def load(self, path: str) -> list[Prompt]:
        """The prompts of one data file, in file order."""
        prompts: list[Prompt] = []
        seen: dict[str, str] = {}
        for row in read_rows(path, required=["messages"]):
            messages = parse_conversation(row)
            if self.args.system_prompt and messages[0].role != "system":
                messages.insert(0, Message("system", self.args.system_prompt))
            given = row.data.get("id")
            pid = str(given) if not missing(given) else "c-" + short_hash(
                json.dumps([m.to_dict() for m in messages], ensure_ascii=False))
            if pid in seen:
                raise row.fail(f"duplicate id {pid!r} (first at {seen[pid]})")
            seen[pid] = row.where
            prompts.append(Prompt(pid, messages, self.row_meta(row)))
        return prompts

    def row_meta(self, row: Row) -> dict[str, Any]:
        """A row's `meta` object (per-prompt data hooks read), {} when it has none."""
        return row_meta(row)

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._prompts[split])

    def split_reasoning(self, reply: str) -> tuple[str, str]:
        return split_reasoning_tags(reply, self.args.reasoning_tags)

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        """Mean reply length in words and the share of empty replies (e.g. all reasoning)."""
        return length_metrics(replies)


PATIENT_PERSONA = """\
You are playing a person who has come to talk with a counsellor. Stay in this role for the whole \
conversation. The earlier messages written as you are what you have said so far; the other messages \
are the counsellor speaking to you.

Reply as this person would, in the first person and in one to four sentences, the way people \
really talk: at times unsure or guarded, more open when you feel understood, and pushing back when \
something the counsellor says does not fit you. Keep to the situation and feelings you have already \
described, adding detail only when it is natural to. Do not give advice, do not write the \
counsellor's lines, and never say that you are an AI or that this is a role-play.

When the conversation has come to a natural close, because you have said what you needed to or \
you want to stop, reply with {end_marker} and nothing else."""
"""The default simulated-patient system prompt; `{end_marker}` is replaced by the end marker."""

SESSION_CUE = "(The session begins. Say what brought you here.)"
"""A first `user` turn for the simulator when the conversation starts with the patient speaking,
so chat templates that need user-first alternation accept it."""

OFFLINE_REPLIES = [
    "I guess that's part of it. It's hard to explain, but I keep going over it at night.",
    "Maybe. I haven't really told anyone else about this, so it feels strange to say it out loud.",
    "That helps a little, thank you. I think I'd like to stop here for today.",
]


def offline_patient(messages: list[Message]) -> str:
    """A deterministic stand-in patient for offline runs: canned replies, then `[END]`."""
    said = sum(m.role == "assistant" for m in messages)  # the patient's own turns so far
    return OFFLINE_REPLIES[said - 1] if 0 < said <= len(OFFLINE_REPLIES) else "[END]"


class CounselingMultiturnArgs(CounselingArgs):
    """Settings of the multi-turn counselling task (`task.args`)."""

    max_turns: int = Field(4, ge=1, le=4)
    """Policy replies per conversation at most (the patient may end it sooner)."""
    user_simulator: ChatModelConfig = ChatModelConfig(engine="scripted",
                                                      path="dynalize.tasks.counseling:offline_patient")
    """The chat model playing the patient (default: a scripted offline stand-in)."""
    persona: str | None = None
    """The patient's system prompt (`{end_marker}` is filled in) for conversations whose row has
    no `meta.persona` of its own; None = the built-in one."""
    persona_file: str | None = None
    """A UTF-8 file holding the patient's system prompt, instead of `persona`."""
    end_marker: str = Field("[END]", min_length=1)
    """The patient writes this to end the conversation."""

    @model_validator(mode="after")
    def _one_persona(self) -> "CounselingMultiturnArgs":
        if self.persona is not None and self.persona_file is not None:
            raise ValueError("set persona or persona_file, not both")
        return self


class CounselingMultiturnTask(CounselingTask):
    """Counselling over up to four policy replies, with a simulated patient in between."""

    Args = CounselingMultiturnArgs

    def __init__(self, args: CounselingMultiturnArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: CounselingMultiturnArgs = args
        self.max_turns = args.max_turns  # type: ignore[misc]  # the loop reads it on the instance
        text = read_text_file(args.persona_file, "persona") if args.persona_file else args.persona
        self.persona = (text if text is not None else PATIENT_PERSONA).replace("{end_marker}", args.end_marker)
        self._simulator: ChatModel | None = None
        if args.user_simulator.engine != "hf":  # a local model loads on first use, not here
            self._simulator = self._build_simulator()

    def _build_simulator(self) -> ChatModel:
        from ..build import build_chat_model

        try:
            return build_chat_model(self.args.user_simulator)
        except (ValueError, ImportError, AttributeError) as e:
            raise ConfigError(f"config error: task.args.user_simulator: {e}") from None

    @property
    def simulator(self) -> ChatModel:
        """The patient's chat model."""
        if self._simulator is None:
            self._simulator = self._build_simulator()
        return self._simulator

    @simulator.setter
    def simulator(self, model: ChatModel) -> None:
        self._simulator = model

    def row_meta(self, row: Row) -> dict[str, Any]:
        """As the single-turn task's, with `persona`, when given, checked to be text."""
        meta = super().row_meta(row)
        if "persona" in meta and (missing(meta["persona"]) or not isinstance(meta["persona"], str)):
            raise row.fail("meta.persona must be a non-empty string (the patient's system prompt)")
        return meta

    def persona_for(self, prompt: Prompt | None) -> str:
        """The patient's system prompt in `prompt`'s conversation: its `meta["persona"]` (with
        `{end_marker}` filled in), else the task's persona."""
        own = prompt.meta.get("persona") if prompt is not None else None
        return own.replace("{end_marker}", self.args.end_marker) if own else self.persona

    def simulator_messages(self, conversation: list[Message], persona: str | None = None) -> list[Message]:
        """What the patient model reads: its persona (default: the task's), then the conversation
        with roles swapped (its own lines as `assistant`, the counsellor's as `user`); the
        counsellor's system message is not shown."""
        swap = {"user": "assistant", "assistant": "user"}
        turns = [Message(swap[m.role], m.content) for m in conversation if m.role != "system"]
        if turns and turns[0].role == "assistant":
            turns.insert(0, Message("user", SESSION_CUE))
        return [Message("system", persona or self.persona), *turns]

    async def user_reply(self, conversation: list[Message], prompt: Prompt | None = None) -> str | None:
        """The patient's next message in `prompt`'s conversation, played with that prompt's
        persona, or None once it writes the end marker (or nothing)."""
        text = await self.simulator.chat(self.simulator_messages(conversation, self.persona_for(prompt)))
        _, text = split_reasoning_tags(text, self.args.reasoning_tags)
        if self.args.end_marker in text or not text.strip():
            return None
        return text.strip()
