"""The penalty buffer B_t: live penalties, their retirements and revivals, and the history.

Rules (docs/architecture.md): at most one penalty enters per step; a penalty that no judged
rollout of a step triggers is retired; a retired penalty proposed again comes back with its old
id and history. Every change bumps `version` (the judge's cache keys on it). Pure state: each
add / retire / revive and each step's trigger stats is an event, collected until
`drain_events()`; the run directory writes them (`penalties.jsonl`).
"""

from __future__ import annotations

import copy
from typing import Any

from ..types import Penalty
from .candidate import Candidate, normalize_title


class PenaltyBufferError(RuntimeError):
    """A change the buffer's rules forbid (a second add in one step, a duplicate of a live penalty)."""


class PenaltyBuffer:
    """Penalties by id (`p001`, `p002`, ...), active or retired, and the events not yet drained."""

    def __init__(self) -> None:
        self.version = 0
        self._events: list[dict[str, Any]] = []
        self._penalties: dict[str, Penalty] = {}
        self._next_id = 1
        self._last_add_step: int | None = None

    # --- reading --------------------------------------------------------------------------------

    def active(self) -> list[Penalty]:
        return [p for p in self._penalties.values() if p.active]

    def retired(self) -> list[Penalty]:
        return [p for p in self._penalties.values() if not p.active]

    def all(self) -> list[Penalty]:
        return list(self._penalties.values())

    def get(self, penalty_id: str) -> Penalty:
        return self._penalties[penalty_id]

    def __len__(self) -> int:
        return len(self.active())

    def find(self, candidate: Candidate) -> Penalty | None:
        """The penalty `candidate` repeats: named by the dedup pass, same title, same regex, or same detector."""
        if candidate.revives and candidate.revives in self._penalties:
            return self._penalties[candidate.revives]
        title = normalize_title(candidate.title)
        for p in self._penalties.values():
            if (normalize_title(p.title) == title or (candidate.regex and p.regex == candidate.regex)
                    or (candidate.detector and p.detector == candidate.detector)):
                return p
        return None

    # --- changes --------------------------------------------------------------------------------

    def add(self, candidate: Candidate, step: int, **extra: Any) -> Penalty:
        """Let `candidate` in at `step`: a new penalty, or the revival of the retired one it repeats.

        `extra` goes into the event (e.g. `proposed_at`). Raises PenaltyBufferError on a second
        add in the same step or a duplicate of a live penalty.
        """
        match = self.find(candidate)
        if match is not None and match.active:
            raise PenaltyBufferError(f"candidate {candidate.title!r} duplicates active penalty {match.id}")
        if match is not None:
            return self.revive(match.id, step, candidate, **extra)
        self._claim(step)
        p = Penalty(id=f"p{self._next_id:03d}", title=candidate.title, description=candidate.description,
                    references=list(candidate.references), regex=candidate.regex, created_step=step,
                    detector=candidate.detector)
        self._next_id += 1
        self._penalties[p.id] = p
        if p.detector:
            extra["detector"] = p.detector
        self._event(p, step, "add", description=p.description, regex=p.regex,
                    references=p.references, groups=candidate.groups, **extra)
        return p

    def revive(self, penalty_id: str, step: int, candidate: Candidate | None = None, **extra: Any) -> Penalty:
        """Bring retired penalty `penalty_id` back at `step`, keeping its id, text and history.

        Its regex becomes the candidate's only when the proposer chose so for this revival
        (`candidate.revives == penalty_id` and `keep_regex == "candidate"`); the event records
        the regex it carries, where it came from and, if changed, the previous one.
        """
        p = self._penalties[penalty_id]
        if p.active:
            raise PenaltyBufferError(f"penalty {penalty_id} is active, nothing to revive")
        self._claim(step)
        p.active = True
        if candidate is not None:
            p.references = list(candidate.references)
            extra = {"proposed_title": candidate.title, "references": p.references, **extra}
            if candidate.revives == p.id and candidate.keep_regex == "candidate" and candidate.regex != p.regex:
                extra["previous_regex"], p.regex = p.regex, candidate.regex
            extra.update(regex=p.regex, regex_from=candidate.keep_regex if candidate.revives == p.id else "penalty")
            if candidate.regex_reason:
                extra["regex_reason"] = candidate.regex_reason
        self._event(p, step, "revive", **extra)
        return p

    def retire(self, penalty_id: str, step: int, **why: Any) -> Penalty:
        """Retire an active penalty at `step`."""
        p = self._penalties[penalty_id]
        if not p.active:
            raise PenaltyBufferError(f"penalty {penalty_id} is already retired")
        p.active = False
        self._event(p, step, "retire", **why)
        return p

    def end_step(self, step: int, trigger_counts: dict[str, int], n_judged: int,
                 judged: dict[str, int] | None = None) -> list[str]:
        """Record this step's triggers and prevalence per active penalty; retire the untriggered.

        `judged[id]` (optional) is how many rollouts got a valid verdict for `id`; a penalty with
        none (every judge call failed) is not retired, since nothing was observed. Returns the
        ids retired.
        """
        active = self.active()
        if not active:
            return []
        triggers = {p.id: int(trigger_counts.get(p.id, 0)) for p in active}
        prevalence = {pid: (t / n_judged if n_judged else 0.0) for pid, t in triggers.items()}
        self._events.append({"step": step, "event": "stats", "n_judged": n_judged,
                             "triggers": triggers, "prevalence": prevalence})
        retired = []
        for p in active:
            observed = judged.get(p.id, 0) if judged is not None else n_judged
            if triggers[p.id] == 0 and n_judged > 0 and observed > 0:
                self.retire(p.id, step, reason="no_triggers", n_judged=n_judged)
                retired.append(p.id)
        return retired

    def preview(self, candidates: list[Candidate]) -> tuple[list[Penalty], list[Penalty]]:
        """(active, retired) as they will be once `candidates` are applied in order (accepted
        proposals not applied yet), with the ids they will get: what a new proposal must not repeat."""
        future = PenaltyBuffer.from_json(self.to_json())
        for i, c in enumerate(candidates):
            try:
                future.add(copy.deepcopy(c), step=-1 - i)
            except PenaltyBufferError:
                pass  # it will be refused when applied, too
        return future.active(), future.retired()

    def drain_events(self) -> list[dict[str, Any]]:
        """The events since the last call (add / retire / revive / stats, each with its step)."""
        events, self._events = self._events, []
        return events

    # --- persistence ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Everything needed to resume (saved in every checkpoint)."""
        return {"version": self.version, "next_id": self._next_id, "last_add_step": self._last_add_step,
                "penalties": [p.to_dict() for p in self._penalties.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PenaltyBuffer":
        buf = cls()
        buf.load_json(data)
        return buf

    def load_json(self, data: dict[str, Any]) -> None:
        """Replace this buffer's state with `data` (from `to_json`)."""
        self.version = int(data["version"])
        self._next_id = int(data["next_id"])
        self._last_add_step = data.get("last_add_step")
        data = copy.deepcopy(data)
        self._penalties = {d["id"]: Penalty.from_dict(d) for d in data["penalties"]}

    # --- internals ------------------------------------------------------------------------------

    def _claim(self, step: int) -> None:
        if self._last_add_step == step:
            raise PenaltyBufferError(f"a penalty already entered the buffer at step {step}")
        self._last_add_step = step

    def _event(self, p: Penalty, step: int, event: str, **extra: Any) -> None:
        entry = {"step": step, "event": event, **extra}
        p.history.append(entry)
        self.version += 1
        self._events.append({"step": step, "event": event, "id": p.id, "title": p.title, **copy.deepcopy(extra)})
