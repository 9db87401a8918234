"""A run on disk: metrics.jsonl, rollouts/step_NNNNNN.jsonl, `<term>.jsonl` event logs (e.g.
penalties.jsonl), checkpoints/step_NNNNNN/.

Every line is flushed and fsynced as it is written, and rollout files are written whole then
renamed, so a crash mid-run loses at most the step in flight and never leaves a broken line.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

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
    """Paths and writers of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.metrics_path = self.root / "metrics.jsonl"
        self.rollouts_dir = self.root / "rollouts"
        self.checkpoints_dir = self.root / "checkpoints"
        for d in (self.root, self.rollouts_dir, self.checkpoints_dir):
            d.mkdir(parents=True, exist_ok=True)

    def log_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, record)

    def log_rollouts(self, step: int, rollouts: list[Rollout], name: str = "step") -> None:
        write_jsonl_atomic(self.rollouts_dir / f"{name}_{step:06d}.jsonl", [r.record(step) for r in rollouts])

    def log_events(self, name: str, events: list[dict[str, Any]]) -> None:
        """Append a reward term's events to `<name>.jsonl` (each line carries its step)."""
        for e in events:
            append_jsonl(self.root / f"{name}.jsonl", e)

    def truncate(self, from_step: int) -> None:
        """On resume: forget the metric and event lines of steps ≥ from_step (they run again)."""
        for path in sorted(self.root.glob("*.jsonl")):
            keep = [r for r in read_jsonl(path) if r.get("step", -1) < from_step]
            write_jsonl_atomic(path, keep)

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"step_{step:06d}"

    def latest_checkpoint(self) -> Path | None:
        done = sorted(p for p in self.checkpoints_dir.glob("step_*") if (p / "state.json").exists())
        return done[-1] if done else None


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


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: Path, learner: Any, state: dict[str, Any]) -> None:
    """Learner (policy + optimizer), RNG and the orchestrator's `state` (its batches generated
    ahead go to inflight.json), written to a temporary folder then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    learner.save(str(tmp))
    torch.save(rng_state(), tmp / "rng.pt")
    state = dict(state)
    (tmp / "inflight.json").write_text(json.dumps(state.pop("inflight", {})))
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_checkpoint(path: Path, learner: Any) -> dict[str, Any]:
    """Restore the learner and RNG from `path`; return the orchestrator's state."""
    learner.load(str(path))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    state = json.loads((path / "state.json").read_text())
    state["inflight"] = json.loads((path / "inflight.json").read_text())
    return state
