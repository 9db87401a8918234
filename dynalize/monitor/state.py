"""The monitor's state on disk, laid out so that saving step t costs what step t holds.

`monitor_state.json` (STATE, rewritten whole after every step) stays small: the settings, the
penalty buffer, running totals, the last monitored step and the steps of the views the proposer
keeps. The bulk lives in `monitor_state/` (STATE_DIR), each part written once:

- `views/step_NNNNNN.json`: the proposer's view of one step, written when the step is monitored
  and removed once the proposer's window (`view_steps`) no longer holds it;
- `reference.json`: the reference's samples (the first `reference_steps` steps' views), written
  while it grows, then never again;
- `steps.jsonl`: one line per monitored step, the digest of its rows (appended).

A step's files are written before `monitor_state.json` names the step: a crash in between leaves
a view or digest lines the state does not name, which the next load ignores (and overwrites).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..penalties.views import ProposerView, ViewSample
from ..rewards.penalties import PenaltyTerm, sample_state, view_from_state, view_state
from ..runlog import append_jsonl, read_jsonl, write_jsonl_atomic
from .outdir import write_atomic

STATE_DIR = "monitor_state"
"""The folder beside monitor_state.json that holds the views, the reference and the steps' digests."""


class StateFiles:
    """The parts of a monitor's state saved apart (module docstring), and what of them is written."""

    def __init__(self, out: Path):
        self.root = Path(out) / STATE_DIR
        self.views = self.root / "views"
        self.written: set[int] = set()
        """Steps whose view file holds the view the state names."""
        self.reference_batches = 0
        """How many steps' views reference.json holds."""

    def view_path(self, step: int) -> Path:
        return self.views / f"step_{step:06d}.json"

    def save_term(self, term: PenaltyTerm, step: int | None, digest: str | None) -> dict[str, Any]:
        """Write what the term's state names that is not on disk yet (the newest view; the reference
        while it grows) and `step`'s digest line; the term's state to put in monitor_state.json."""
        state = term.state_dict(views_apart=True)
        self.views.mkdir(parents=True, exist_ok=True)
        for v in term.recent:
            if v.step not in self.written:
                write_atomic(self.view_path(v.step), json.dumps(view_state(v), ensure_ascii=False))
                self.written.add(v.step)
        if state["reference_batches"] != self.reference_batches:
            write_atomic(self.root / "reference.json",
                         json.dumps([sample_state(s) for s in term.reference], ensure_ascii=False))
            self.reference_batches = state["reference_batches"]
        if step is not None:
            append_jsonl(self.root / "steps.jsonl", {"step": step, "digest": digest})
        return state

    def forget_views(self, keep: list[int]) -> None:
        """Remove the view files of steps the saved state no longer keeps (only files this folder's
        monitor wrote: `written`)."""
        for step in sorted(self.written - set(keep)):
            self.view_path(step).unlink(missing_ok=True)
            self.written.discard(step)

    def load_term(self, term: PenaltyTerm, state: dict[str, Any]) -> None:
        """`term` as `state` (monitor_state.json's `term`) and the files beside it left it."""
        cache: dict[int, ProposerView] = {}

        def view_of(step: int) -> ProposerView:
            if step not in cache:
                cache[step] = view_from_state(json.loads(self.view_path(step).read_text(encoding="utf-8")))
            return cache[step]

        path = self.root / "reference.json"
        reference = [ViewSample(**s) for s in json.loads(path.read_text(encoding="utf-8"))] if path.exists() else []
        term.load_state_dict(state, view_of=view_of, reference=reference)
        self.written = {v.step for v in term.recent}
        for p in self.views.glob("step_*.json"):  # a view a crash left unnamed: its step is monitored again
            if int(p.stem.removeprefix("step_")) not in self.written:
                p.unlink()
        self.reference_batches = int(state.get("reference_batches", 0))

    def load_steps(self, last: int | None) -> dict[int, str]:
        """The monitored steps' digests up to `last` (lines past it, of a step the state never
        named, are dropped from the file)."""
        path = self.root / "steps.jsonl"
        rows = read_jsonl(path) if path.exists() else []
        keep = [r for r in rows if last is not None and r["step"] <= last]
        if len(keep) != len(rows):
            write_jsonl_atomic(path, keep)
        return {int(r["step"]): r["digest"] for r in keep}
