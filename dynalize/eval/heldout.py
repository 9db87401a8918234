"""A rubric run's saved held-out replies as the "policy" of a benchmark: graded without generating.

A run with `eval_every` writes each held-out evaluation's rollouts to `rollouts/eval_NNNNNN.jsonl`
(prompt id, the conversation the policy saw, its replies with reasoning split off). With
`python -m dynalize.eval --heldout`, each such file stands for a step: the benchmark grades those
replies instead of a checkpoint's fresh ones (HealthBench and ResearchQA), into
`eval/<bench>_heldout.jsonl`. Each saved sample of a prompt is one example, as the official
`n_repeats` repeats examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runlog import read_jsonl
from .common import BenchmarkError


@dataclass
class SavedReply:
    prompt_id: str
    sample: int
    prompt: list[dict[str, str]]
    reply: str
    reasoning: str


class SavedReplies:
    """The held-out replies of one `rollouts/eval_NNNNNN.jsonl`, by prompt id, in file order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.by_prompt: dict[str, list[SavedReply]] = {}
        for n, r in enumerate(read_jsonl(self.path), 1):
            replies = r.get("replies")
            if not isinstance(r.get("prompt_id"), str) or not isinstance(replies, list) or not replies:
                raise BenchmarkError(f"--heldout: {self.path} line {n} has no prompt_id and replies")
            same = self.by_prompt.setdefault(r["prompt_id"], [])
            reasoning = r.get("reasoning")
            same.append(SavedReply(r["prompt_id"], len(same), list(r.get("prompt") or []), str(replies[-1]),
                                   str(reasoning[-1]) if isinstance(reasoning, list) and reasoning else ""))

    def replies_for(self, prompt_ids: list[str]) -> tuple[list[SavedReply], list[str]]:
        """(the saved replies to `prompt_ids`, in their order; the saved prompt ids not among them)."""
        wanted = set(prompt_ids)
        found = [x for pid in prompt_ids for x in self.by_prompt.get(pid, [])]
        return found, sorted(set(self.by_prompt) - wanted)

    async def close(self) -> None:
        """Nothing to free (the driver closes what it loaded)."""


def heldout_sources(run_dir: str | Path) -> list[tuple[int, str]]:
    """(step, file) of every saved held-out evaluation of a run, by step."""
    out = []
    for p in sorted((Path(run_dir) / "rollouts").glob("eval_*.jsonl")):
        suffix = p.stem.removeprefix("eval_")
        if suffix.isdigit():
            out.append((int(suffix), str(p)))
    return out


def saved_records(policy: Any, ids: list[str], bench: str) -> tuple[list[SavedReply], list[str]] | None:
    """The saved replies when `policy` is SavedReplies (else None); refuses a file that answers
    none of the benchmark's prompts."""
    if not isinstance(policy, SavedReplies):
        return None
    found, unknown = policy.replies_for(ids)
    if not found:
        raise BenchmarkError(f"--heldout: {policy.path} answers none of the {bench} data file's prompts "
                             f"(its prompt ids: {', '.join(unknown[:3])}...): is --data the run's eval_file?")
    return found, unknown
