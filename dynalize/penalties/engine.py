"""The coordinator the training loop calls: judge, reward, retire, and background proposals.

Per step the loop calls `score(step, batch)` (after RM scores are in) and then
`maybe_propose(step, batch, task_group)` (after RM-only advantages are in). A proposal runs in
the background, never awaited by training; when it finishes, its accepted penalty enters the
buffer at the start of the next `score` call, so it applies from the next batch on. Only one
proposal is in flight at a time. The proposer reads the last `view_steps` batches (pooled), and
the view carries a sample of the run's first batch as a reference for what the untrained policy
wrote.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import asdict
from typing import Any

import anyio.abc
import structlog

from ..types import Batch, Rollout
from .buffer import PenaltyBuffer, PenaltyBufferError
from .candidate import Candidate, ProposalResult, Proposer
from .judge import Judge
from .views import ProposerView, ViewSample, build_view, pool_views

log = structlog.get_logger("dynalize.penalties.engine")


def prompt_context(r: Rollout) -> str | None:
    """What the judge sees as context: the last user message of the rollout's prompt, if any."""
    users = [m.content for m in r.messages if m.role == "user"]
    return users[-1] if users else None


class PenaltyEngine:
    """Evolving penalties for one run: proposer + judge + buffer, with per-step metrics."""

    def __init__(self, proposer: Proposer, judge: Judge, buffer: PenaltyBuffer, *, lam: float = 0.5,
                 every: int = 5, seed: int = 0, domain: str = "", view_groups: int = 16,
                 view_per_group: int = 2, view_steps: int = 1, judge_context: bool = True):
        if every < 1 or view_steps < 1:
            raise ValueError(f"every and view_steps must be >= 1, got {every} and {view_steps}")
        self.proposer, self.judge, self.buffer = proposer, judge, buffer
        self.lam, self.every, self.seed, self.domain = lam, every, seed, domain
        self.view_groups, self.view_per_group = view_groups, view_per_group
        self.judge_context = judge_context
        self.recent: deque[ProposerView] = deque(maxlen=view_steps)  # views of the latest batches
        self.reference: list[ViewSample] = []  # the view of the run's first batch
        self.in_flight = False
        self.pending: ProposalResult | None = None
        self.totals: dict[str, float] = {}
        self._step: dict[str, float] = {}

    # --- the two calls of the loop --------------------------------------------------------------

    async def score(self, step: int, batch: Batch) -> None:
        """Apply a finished proposal, judge every reply, fill verdicts / violations / reward, retire."""
        self._apply_pending(step)
        rollouts = batch.rollouts
        active = self.buffer.active()
        texts, contexts, owner = [], [], []
        if active:
            for i, r in enumerate(rollouts):
                ctx = prompt_context(r) if self.judge_context else None
                for reply in r.replies or [r.text]:
                    texts.append(reply)
                    contexts.append(ctx)
                    owner.append(i)
        judgements = await self.judge.assess(texts, active, self.buffer.version, contexts) if texts else []
        verdicts: list[dict[str, bool]] = [dict.fromkeys((p.id for p in active), False) for _ in rollouts]
        valid: list[set[str]] = [set() for _ in rollouts]
        for i, j in zip(owner, judgements):
            for pid, hit in j.verdicts.items():
                verdicts[i][pid] = verdicts[i][pid] or hit
                if pid not in j.failed:
                    valid[i].add(pid)
        triggers = {p.id: 0 for p in active}
        judged = {p.id: 0 for p in active}
        for r, v, ok in zip(rollouts, verdicts, valid):
            r.verdicts = v
            r.violations = sum(v.values())
            r.reward = r.rm_score - self.lam * r.violations
            for pid, hit in v.items():
                triggers[pid] += hit
                judged[pid] += pid in ok
        retired = self.buffer.end_step(step, triggers, len(rollouts), judged)
        n = len(rollouts)
        self._count("penalties/retires", len(retired))
        self._step["penalties/frac_violating"] = sum(r.violations > 0 for r in rollouts) / n if n else 0.0
        self._step["penalties/mean_violations"] = sum(r.violations for r in rollouts) / n if n else 0.0
        for pid, t in triggers.items():
            self._step[f"penalty/{pid}/prevalence"] = t / n if n else 0.0

    def maybe_propose(self, step: int, batch: Batch, task_group: anyio.abc.TaskGroup) -> None:
        """Keep this batch's view; every `every` steps (step % every == 0), start a proposal in the
        background on the views of the last `view_steps` batches."""
        latest = build_view(batch, seed=self.seed, step=step, groups=self.view_groups,
                            per_group=self.view_per_group)
        if not self.reference:
            self.reference = latest.samples
        self.recent.append(latest)
        if step % self.every:
            return
        if self.in_flight:
            self._count("proposer/skipped_in_flight")
            log.info("proposer.skipped", step=step, reason="previous proposal still running")
            return
        view = pool_views(list(self.recent), step=step, active=self.buffer.active(),
                          retired=self.buffer.retired(), domain=self.domain, reference=self.reference)
        self.in_flight = True
        self._count("proposer/started")
        task_group.start_soon(self._propose, view)

    # --- metrics and checkpoints ----------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """This step's metrics (counters since the last call), then reset."""
        out = {"penalties/active": float(len(self.buffer)), "penalties/adds": 0.0,
               "penalties/revives": 0.0, "penalties/retires": 0.0,
               "proposer/in_flight": float(self.in_flight), "proposer/accepted": 0.0,
               "proposer/failed": 0.0, "buffer/version": float(self.buffer.version)}
        out.update(self.judge.stats.metrics())
        out.update(self._step)
        self.judge.stats.reset()
        self._step = {}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Buffer, running totals, the kept views and a finished-but-unapplied proposal (one in
        flight is lost)."""
        pending = self.pending.accepted.to_dict() if self.pending and self.pending.accepted else None
        return {"buffer": self.buffer.to_json(), "totals": dict(self.totals),
                "pending": pending, "pending_step": self.pending.step if self.pending else None,
                "recent": [{"step": v.step, "samples": [asdict(s) for s in v.samples]} for v in self.recent],
                "reference": [asdict(s) for s in self.reference]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_json(state["buffer"])
        self.totals = dict(state.get("totals", {}))
        self.recent.clear()
        self.recent.extend(ProposerView(v["step"], [ViewSample(**s) for s in v["samples"]])
                           for v in state.get("recent", []))
        self.reference = [ViewSample(**s) for s in state.get("reference", [])]
        self.pending = None
        if state.get("pending"):
            self.pending = ProposalResult(step=state["pending_step"],
                                          accepted=Candidate.from_dict(copy.deepcopy(state["pending"])))

    # --- internals ------------------------------------------------------------------------------

    async def _propose(self, view: ProposerView) -> None:
        t0 = time.perf_counter()
        try:
            result = await self.proposer.propose(view)
        except Exception as e:  # noqa: BLE001 - proposers should not raise; if one does, count it
            result = ProposalResult(step=view.step, error=f"{type(e).__name__}: {e}",
                                    latency=time.perf_counter() - t0)
        finally:
            self.in_flight = False
        self._step["proposer/latency"] = result.latency
        self._count("proposer/candidates", result.candidates)
        for reason, n in result.rejected.items():
            self._count(f"proposer/rejected/{reason}", n)
        if not result.ok:
            self._count("proposer/failed")
            log.warning("proposer.failed", step=view.step, error=result.error)
        elif result.accepted is not None:
            self._count("proposer/accepted")
            self.pending = result
            log.info("proposer.accepted", step=view.step, title=result.accepted.title)

    def _apply_pending(self, step: int) -> None:
        if self.pending is None or self.pending.accepted is None:
            return
        result, self.pending = self.pending, None
        try:
            p = self.buffer.add(result.accepted, step, proposed_at=result.step)
        except PenaltyBufferError as e:
            self._count("proposer/apply_refused")
            log.warning("proposer.apply_refused", step=step, error=str(e))
            return
        event = p.history[-1]["event"]
        self._count("penalties/adds" if event == "add" else "penalties/revives")
        log.info(f"penalty.{event}", step=step, id=p.id, title=p.title, proposed_at=result.step)

    def _count(self, key: str, n: float = 1) -> None:
        self._step[key] = self._step.get(key, 0.0) + n
        self.totals[key] = self.totals.get(key, 0.0) + n
