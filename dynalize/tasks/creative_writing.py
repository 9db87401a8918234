"""Creative writing: stories for LitBench-style writing prompts, scored on the raw story.

Data (docs/data_formats.md): rows with a `prompt` field; LitBench's preference pairs repeat a
prompt once per pair (`chosen_story`, `rejected_story`, upvotes, timestamps ride along unused), so
prompts are deduplicated in first-seen order, each with a stable id from a hash of its text. The
RM reads only the story (a `str`: no prompt, no chat template), as LitBench's verifier was trained.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..types import Message, Prompt
from .base import Split, Task
from .data import load_splits, read_rows, short_hash
from .text import TemplatedArgs, length_metrics, split_reasoning_tags


STORY_TEMPLATE = "Write a story based on this writing prompt.\n\n{prompt}"
"""The LitBench instruction configs/creative_writing.yaml wraps each writing prompt in (the
task's default before `template` defaulted to the prompt as written)."""


class CreativeWritingArgs(TemplatedArgs):
    """Settings of the creative-writing task (`task.args`): `prompt_field` holds the writing prompt;
    `template` defaults to it as written (configs/creative_writing.yaml sets `STORY_TEMPLATE`)."""

    defaults_before_frozen: ClassVar[dict[str, Any]] = {"template": STORY_TEMPLATE}
    """What a run saved without `template` (before it was frozen) started with."""

    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    """Opening and closing delimiters of a reasoning block in replies (None = no reasoning)."""


class CreativeWritingTask(Task):
    """Write a story for a writing prompt."""

    Args = CreativeWritingArgs
    description = "Creative writing: the user gives a short writing prompt and the assistant writes a story for it."

    def __init__(self, args: CreativeWritingArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: CreativeWritingArgs = args
        self._prompts = load_splits(args, self.load)

    def load(self, path: str) -> list[Prompt]:
        """The unique writing prompts of one data file, in first-seen order."""
        field = self.args.prompt_field
        counts: dict[str, int] = {}
        for row in read_rows(path, required=[field]):
            text = str(row.data[field]).strip()
            counts[text] = counts.get(text, 0) + 1
        return [self.prompt(text, n) for text, n in counts.items()]

    def prompt(self, text: str, pairs: int = 1) -> Prompt:
        """The Prompt for one writing prompt (`pairs`: rows it appeared in)."""
        return Prompt(f"cw-{short_hash(text)}", self.args.messages(text), meta={"writing_prompt": text, "pairs": pairs})

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._prompts[split])

    def rm_input(self, conversation: list[Message], reply: str) -> str:
        """The raw story alone."""
        return reply

    def split_reasoning(self, reply: str) -> tuple[str, str]:
        return split_reasoning_tags(reply, self.args.reasoning_tags)

    async def evaluate(self, prompts: list[Prompt], replies: list[str]) -> dict[str, float]:
        """Mean story length in words and the share of empty stories (e.g. all reasoning)."""
        return length_metrics(replies)
