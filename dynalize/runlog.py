"""A run on disk: metrics.jsonl, rollouts/step_NNNNNN.jsonl, `<term>.jsonl` event logs (e.g.
penalties.jsonl), eval/task.jsonl, checkpoints/step_NNNNNN/ (written and read by
dynalize.checkpoint).

Every line is flushed and fsynced as it is written, and rollout files are written whole then
renamed, so a crash mid-run loses at most the step in flight and never leaves a broken line. A
run directory is never reused by accident: a new run refuses a directory that holds files,
unless told to move it aside (`--overwrite`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .types import Message, Rollout


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line durably."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_jsonl_atomic(path: Path, records: list[dict[str, Any]]) -> None:
    """Write a whole JSONL file via a temporary file and rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a file (a torn last line, if any, is skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class RunDir:
    """Paths and writers of one run directory. Nothing is written until `create()`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.metrics_path = self.root / "metrics.jsonl"
        self.rollouts_dir = self.root / "rollouts"
        self.checkpoints_dir = self.root / "checkpoints"
        self.eval_path = self.root / "eval" / "task.jsonl"

    def create(self) -> None:
        for d in (self.root, self.rollouts_dir, self.checkpoints_dir, self.eval_path.parent):
            d.mkdir(parents=True, exist_ok=True)

    def holds_run(self) -> bool:
        """Whether the directory holds any file (an earlier run, or anything else)."""
        return self.root.is_dir() and any(p.is_file() for p in self.root.rglob("*"))

    def move_aside(self) -> Path:
        """Rename the directory to `<name>.replaced-<time>` (kept whole: delete it yourself)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.root.with_name(f"{self.root.name}.replaced-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.root.with_name(f"{self.root.name}.replaced-{stamp}-{n}")
        os.replace(self.root, target)
        return target

    def log_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, record)

    def log_rollouts(self, step: int, rollouts: list[Rollout], name: str = "step") -> None:
        write_jsonl_atomic(self.rollouts_dir / f"{name}_{step:06d}.jsonl", [r.record(step) for r in rollouts])

    def log_events(self, name: str, events: list[dict[str, Any]]) -> None:
        """Append a reward term's events to `<name>.jsonl` (each line carries its step)."""
        for e in events:
            append_jsonl(self.root / f"{name}.jsonl", e)

    def truncate(self, from_step: int, eval_rows: int | None = None) -> None:
        """On resume after `from_step` completed steps: forget the metric and event lines of later steps
        (labelled from_step + 1 on: they run again), and the held-out evaluations after the first
        `eval_rows` (None: keep them all)."""
        for path in sorted(self.root.glob("*.jsonl")):
            keep = [r for r in read_jsonl(path) if r.get("step", -1) <= from_step]
            write_jsonl_atomic(path, keep)
        if eval_rows is not None and self.eval_path.exists():
            write_jsonl_atomic(self.eval_path, read_jsonl(self.eval_path)[:eval_rows])

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}"


def rollout_to_state(r: Rollout) -> dict[str, Any]:
    """Everything needed to rebuild a generated (not yet scored) rollout."""
    return {
        "prompt_id": r.prompt_id, "group": r.group, "prompt_ids": r.prompt_ids,
        "completion_ids": r.completion_ids, "logprobs": r.logprobs, "loss_mask": r.loss_mask,
        "replies": r.replies, "reasoning": r.reasoning, "policy_version": r.policy_version,
        "truncated": r.truncated, "messages": [m.to_dict() for m in r.messages], "meta": r.meta,
        "turns": [m.to_dict() for m in r.turns],
    }


def rollout_from_state(d: dict[str, Any]) -> Rollout:
    d = dict(d)
    d["messages"] = [Message(**m) for m in d["messages"]]
    d["turns"] = [Message(**m) for m in d.get("turns", [])]
    return Rollout(**d)
