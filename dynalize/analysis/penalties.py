"""A run's penalty history read back: the penalties it discovered, when each was active, and how
prevalent each was per step.

Sources: `penalties.jsonl` (add / retire / revive events with their step, and per-step `stats`
events with `prevalence`); when a run has no stats events, the metrics' `penalty/<id>/prevalence`;
when it has no penalties.jsonl at all, the buffer saved in its last checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..types import Penalty
from .runs import ReportError, Run


@dataclass
class PenaltyHistory:
    """Penalties by id, their active intervals [start, end) and their prevalence series."""

    penalties: dict[str, Penalty]
    intervals: dict[str, list[tuple[int, int | None]]] = field(default_factory=dict)
    prevalence: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    confirmations: dict[str, dict | None] = field(default_factory=dict)
    """What scoring edited replies with the reward said of each penalty when it entered
    (penalties.confirm; None: not confirmed, correlational only)."""

    def active_at_end(self) -> list[Penalty]:
        return [p for pid, p in self.penalties.items()
                if self.intervals.get(pid) and self.intervals[pid][-1][1] is None]

    def select(self, which: str) -> list[Penalty]:
        """`all`: every penalty ever added; `active`: those still active at the end of the run."""
        if which == "all":
            return list(self.penalties.values())
        if which == "active":
            return self.active_at_end()
        raise ReportError(f"--which: expected all or active, got {which!r}")


def penalty_history(run: Run) -> PenaltyHistory:
    """Rebuild the history from the run's events (or its last checkpoint's buffer)."""
    events = run.penalty_events()
    if not events:
        return _from_checkpoint(run)
    penalties: dict[str, Penalty] = {}
    intervals: dict[str, list[tuple[int, int | None]]] = {}
    prevalence: dict[str, list[tuple[int, float]]] = {}
    confirmations: dict[str, dict | None] = {}
    for e in events:
        kind, step, pid = e.get("event"), int(e.get("step", 0)), e.get("id")
        if kind == "add" and pid:
            penalties[pid] = Penalty(id=pid, title=e.get("title", pid), description=e.get("description", ""),
                                     references=list(e.get("references") or []), regex=e.get("regex"),
                                     created_step=step, detector=e.get("detector"))
            intervals[pid] = [(step, None)]
            confirmations[pid] = e.get("confirmation")
        elif kind == "revive" and pid in intervals:
            penalties[pid].active = True
            confirmations[pid] = e.get("confirmation", confirmations.get(pid))
            if "regex" in e:  # a revival may carry the proposing candidate's regex
                penalties[pid].regex = e["regex"]
            intervals[pid].append((step, None))
        elif kind == "retire" and pid in intervals and intervals[pid][-1][1] is None:
            penalties[pid].active = False
            intervals[pid][-1] = (intervals[pid][-1][0], step)
        elif kind == "stats":
            for k, v in (e.get("prevalence") or {}).items():
                prevalence.setdefault(k, []).append((step, float(v)))
    if not prevalence:
        prevalence = _from_metrics(run)
    return PenaltyHistory(penalties, intervals, prevalence, confirmations)


def _from_metrics(run: Run) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in run.rows("metrics"):
        for k, v in r.items():
            if k.startswith("penalty/") and k.endswith("/prevalence") and isinstance(v, int | float):
                out.setdefault(k.split("/")[1], []).append((int(r["step"]), float(v)))
    return out


def _from_checkpoint(run: Run) -> PenaltyHistory:
    states = sorted((run.path / "checkpoints").glob("step_*/state.json"))
    for path in reversed(states):
        state = json.loads(path.read_text())
        term = state.get("terms", {}).get("penalties") or state.get("penalties")  # older runs: "penalties"
        buffer = (term or {}).get("buffer")
        if not buffer:
            continue
        penalties = {d["id"]: Penalty.from_dict(d) for d in buffer["penalties"]}
        intervals: dict[str, list[tuple[int, int | None]]] = {}
        for pid, p in penalties.items():
            for h in p.history:
                if h.get("event") in ("add", "revive"):
                    intervals.setdefault(pid, []).append((int(h["step"]), None))
                elif h.get("event") == "retire" and intervals.get(pid):
                    intervals[pid][-1] = (intervals[pid][-1][0], int(h["step"]))
        prevalence: dict[str, list[tuple[int, float]]] = {}
        for st in buffer.get("step_stats", []):
            for k, v in st.get("prevalence", {}).items():
                prevalence.setdefault(k, []).append((int(st["step"]), float(v)))
        return PenaltyHistory(penalties, intervals, prevalence or _from_metrics(run))
    return PenaltyHistory({})
