"""The preference-pair file: JSONL, one pair per line (CSV, parquet or a `datasets` folder with
the same columns are read too, by `dynalize.tasks.data.read_rows`).

    {"prompt": [{"role": "user", "content": "Write about the sea."}],   # or a plain string
     "chosen": "The sea is ...",                                       # the preferred reply
     "rejected": "Okay, the sea is ... ?",                             # the other reply
     "prompt_id": "sea",                                               # optional: the task prompt's id
     "source": {...}}                                                  # optional: where the pair came from

`prompt` is what the reply answers: a conversation (role `system`, `user` or `assistant`
messages; a multi-turn pair holds the turns before the reply) or a string, read as one user
message. `chosen` and `rejected` are the replies alone. The RM reads each as the task's
`rm_input` gives it (dynalize/rm/train.py); `prompt_id` lets a task hook that reads the prompt's
`meta` find it. `source` is free-form provenance, kept and never read: pairs cut from a run
(`python -m dynalize.rm pairs`) record the run, steps, RM scores and the penalties the rejected
reply triggers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runlog import write_jsonl_atomic
from ..tasks.data import HUB_PREFIX, read_rows
from ..types import Message

ROLES = ("system", "user", "assistant")


class PairFileError(ConfigError):
    """A pair file that cannot be used; the message names the file and line."""


@dataclass
class Pair:
    """One preference: `chosen` over `rejected` as replies to `prompt`."""

    prompt: list[Message]
    chosen: str
    rejected: str
    prompt_id: str | None = None
    source: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Other keys of the line, kept as they were."""

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"prompt": [m.to_dict() for m in self.prompt], "chosen": self.chosen,
                               "rejected": self.rejected}
        if self.prompt_id is not None:
            row["prompt_id"] = self.prompt_id
        if self.source is not None:
            row["source"] = self.source
        return row | self.extra


def _prompt(value: Any, where: str) -> list[Message]:
    if isinstance(value, str):
        return [Message("user", value)]
    if not isinstance(value, list):
        raise PairFileError(f"{where}: prompt must be a string or a list of messages, got {type(value).__name__}")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise PairFileError(f"{where}: prompt[{i}] must be {{\"role\": system|user|assistant, "
                                f"\"content\": string}}")
        out.append(Message(m["role"], m["content"]))
    return out


def parse_pair(row: Any, where: str) -> Pair:
    """One line's pair, or a PairFileError naming `where` and the problem."""
    if not isinstance(row, dict):
        raise PairFileError(f"{where}: expected an object with prompt, chosen and rejected, got {type(row).__name__}")
    missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
    if missing:
        raise PairFileError(f"{where}: missing {', '.join(missing)} (a pair needs prompt, chosen and rejected)")
    for k in ("chosen", "rejected"):
        if not isinstance(row[k], str) or not row[k].strip():
            raise PairFileError(f"{where}: {k} must be a non-empty string (the reply alone)")
    if row["chosen"] == row["rejected"]:
        raise PairFileError(f"{where}: chosen and rejected are the same text")
    pid = row.get("prompt_id")
    if pid is not None and not isinstance(pid, str):
        raise PairFileError(f"{where}: prompt_id must be a string")
    extra = {k: v for k, v in row.items() if k not in ("prompt", "chosen", "rejected", "prompt_id", "source")}
    return Pair(_prompt(row["prompt"], where), row["chosen"], row["rejected"], pid, row.get("source"), extra)


def read_pairs(path: str | Path) -> list[Pair]:
    """Every pair of a file (JSONL; also CSV, parquet, a `datasets` folder or a Hub dataset
    `hub:ORG/NAME[@REVISION][:SPLIT]` with these columns, read by `dynalize.tasks.data.read_rows`);
    the first bad row, or an empty file, stops with one line naming it."""
    if str(path).startswith(HUB_PREFIX):
        return [parse_pair(row.data, row.where) for row in read_rows(str(path))]
    p = Path(path)
    if not p.exists():
        raise PairFileError(f"pair file not found: {p}")
    return [parse_pair(row.data, row.where) for row in read_rows(p)]  # an empty file: "has no rows"


def write_pairs(path: str | Path, pairs: list[Pair]) -> None:
    """Write the pairs as JSONL, whole or not at all."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(p, [x.to_json() for x in pairs])
