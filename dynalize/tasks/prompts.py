"""A dataset of prompts as TRL's GRPOTrainer reads one: each row one prompt, its other columns
kept for the reward functions.

A row's `prompt` is either a string (TRL's standard format: it becomes the user message) or a
list of `{"role", "content"}` messages (the conversational format), used as written: no template
unless `template` asks for one. Every other column (`answer`, `solution`, a test case) rides
along in `Prompt.meta["row"]["columns"]`, and the prompt as the row gave it in `meta["row"]["prompt"]`: reward
functions (`reward_funcs`) receive both as TRL passes them (dynalize/rewards/functions.py).
Rows are not deduplicated: two rows with one prompt and two answers are two prompts.
"""

from __future__ import annotations

import json
from typing import Any

from ..types import Message, Prompt, as_messages
from .base import Split, Task
from .data import Row, load_splits, read_rows, short_hash
from .text import TemplatedArgs

ROLES = ("system", "user", "assistant")


class PromptsArgs(TemplatedArgs):
    """Settings of the `prompts` task (`task.args`): `prompt_field` holds a string or a list of
    {role, content} messages; `template` and `system_prompt` apply to string prompts alone."""


class PromptsTask(Task):
    """Prompts of a TRL-format dataset, rewarded by `reward_funcs` (or an RM, or the rubric term)."""

    Args = PromptsArgs
    description = "A general assistant task: the user writes a request and the assistant answers it."

    def __init__(self, args: PromptsArgs, seed: int = 0):
        super().__init__(args, seed)
        self.args: PromptsArgs = args
        self._prompts = load_splits(args, self.load)

    def load(self, path: str) -> list[Prompt]:
        """One Prompt per row, in file order; ids from the row's content (a repeat gets `-2`, `-3`...)."""
        out: list[Prompt] = []
        seen: dict[str, int] = {}
        for row in read_rows(path, required=[self.args.prompt_field]):
            columns = _plain({k: v for k, v in row.data.items() if k != self.args.prompt_field})
            raw = _plain(row.data[self.args.prompt_field])
            key = short_hash(json.dumps([raw, columns], sort_keys=True))
            seen[key] = seen.get(key, 0) + 1
            pid = f"row-{key}" + (f"-{seen[key]}" if seen[key] > 1 else "")
            out.append(Prompt(pid, self.messages(row, raw), meta={"row": {"prompt": raw, "columns": columns}}))
        return out

    def messages(self, row: Row, raw: Any) -> list[Message]:
        """The conversation of a row's prompt: a string through `template`, messages as they are."""
        if isinstance(raw, str):
            return self.args.messages(raw)
        if not (isinstance(raw, list) and raw and all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in raw)):
            raise row.fail(f"field {self.args.prompt_field!r} must be a string or a list of "
                           f"{{'role': system/user/assistant, 'content': text}} messages")
        if self.args.template != "{prompt}" or self.args.system_prompt:
            raise row.fail("template and system_prompt apply to string prompts; this row's prompt is a list of "
                           "messages, used as written")
        return as_messages(raw)

    def prompts(self, split: Split) -> list[Prompt]:
        return list(self._prompts[split])


def _plain(value: Any) -> Any:
    """`value` as JSON data (rows ride in checkpoints): a NumPy scalar or array becomes its Python value."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
