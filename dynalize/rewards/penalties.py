"""Dynalize's term: `−λ · violations` of the live penalties (with `weight="pay"`, each violation
costs λ plus what the reward measurably pays for its pattern: penalties/pay.py), and the
background proposals that keep the penalty buffer up to date.

`score` applies the oldest accepted proposal not yet applied (so a new penalty counts from the
next batch on; accepted proposals queue, one enters per step), judges every policy reply against
all active penalties in one pass, and retires penalties that nothing triggered, or whose regex
the judge set aside (`unusable_regex`). `observe` keeps the view of the scored batch and, every
`every` steps, starts a proposal in the background: training never waits for it (with `sync`,
the next step's score does), only one runs at a time, and it sees the queued proposals as active
penalties. `finish` (the run's end) cancels one in flight (after up to `finish_timeout`, 0 by
default: the end of a run does not wait for a proposal that can no longer change its training);
a cancelled or checkpointed one is proposed again first on resume, so extending a finished run
completes it as a resume after a crash does. The proposer reads the last `view_steps` batches
(pooled), each sample with its reward before penalties and that reward's advantage sign, plus the
samples of the run's first `reference_steps` batches, a reference for what the untrained policy wrote.

Failures are never silent: a verdict the judge failed to give marks its rollout `unscored` (its
group is left out of the update, docs/reliability.md), every failure is counted (`judge/…`,
`proposer/…` metrics, with running `_total`s), and `stop_reason` stops the run when the judge
fails too often over a window of steps or the proposer fails proposal after proposal.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import anyio.abc
import structlog

from ..penalties.buffer import PenaltyBuffer, PenaltyBufferError
from ..penalties.candidate import Candidate, ProposalResult, Proposer
from ..penalties.config import PenaltiesConfig
from ..penalties.confirm import NOT_CONFIRMABLE, Confirmation, confirmation_text
from ..penalties.pay import group_gaps, record_pay, violation_cost
from ..judge.judge import Judge
from ..judge.prompting import judge_inputs
from ..penalties.views import ProposerView, ViewSample, build_view, group_centred, own_reply_scores, pool_views
from ..types import Batch, Penalty, Rollout, output_step
from .base import RewardTerm, TermScores

log = structlog.get_logger("dynalize.rewards.penalties")


class PenaltyTerm(RewardTerm):
    """Evolving penalties for one run: proposer + judge + buffer, with per-step metrics.

    Records per rollout `verdicts` ({penalty id: triggered by any reply}), `violations` (how many
    distinct penalties, among the verdicts given) and `judge_failed` (ids without a valid
    verdict; such a rollout is `unscored`). Events (add / retire / revive / stats) go to
    `penalties.jsonl`.
    """

    TOTALS = ("judge/verdicts", "judge/failed_verdicts", "proposer/finished", "proposer/failed",
              "proposer/accepted", "penalties/adds", "penalties/revives", "proposer/apply_refused",
              "proposer/insufficient", "proposer/unnamed")
    """Counters also reported as running totals (`<name>_total`) in every step's metrics."""
    CONFIRM_TOTALS = ("confirm/reward_calls", "confirm/seconds", "proposer/rejected/co_traveller")
    """Running totals also reported by a run that confirms candidates (rewards.rescore)."""

    name = "penalties"
    event_log = True

    def __init__(self, cfg: PenaltiesConfig, proposer: Proposer, judge: Judge, buffer: PenaltyBuffer | None = None,
                 *, seed: int = 0, domain: str = ""):
        self.cfg = cfg
        self.proposer, self.judge = proposer, judge
        self.buffer = buffer if buffer is not None else PenaltyBuffer()
        self.seed, self.domain = seed, domain
        self.label: Callable[[int], int] = output_step
        """How a batch's step is named in log lines: `output_step` where batches count from 0 (a
        dynalize run); the identity where they carry the step already (the monitor: the logged
        step; dynalize.trl: TRL's step), so its lines name the step its files do."""
        self.sparse_steps = False
        """Whether batches may skip steps (dynalize.trl: TRL scores a generation batch once every
        few steps when `steps_per_generation · num_iterations` exceeds the gradient accumulation):
        a proposal then starts at the first batch past each multiple of `every`, not only at one
        that falls on it (which a skipping run may never reach)."""
        self._observed: int | None = None  # the latest observed batch's step
        self.view_groups, self.view_per_group, view_steps = cfg.view_shape()
        self.recent: deque[ProposerView] = deque(maxlen=view_steps)  # views of the latest batches
        self.reference: list[ViewSample] = []  # the views of the run's first `reference_steps` batches, pooled
        self._reference_batches = 0
        self.in_flight = False
        self.pending: list[ProposalResult] = []  # accepted, not applied yet: oldest first
        self._running: ProposerView | None = None  # the view of the proposal in flight
        self._restart: ProposerView | None = None  # a view whose proposal never finished (checkpoint, cancel)
        self._done: anyio.Event | None = None
        self._scope: anyio.CancelScope | None = None
        self.totals: dict[str, float] = {}
        self.evidence: dict[str, Any] | None = None
        """The last finished proposal's evidence: step, state (`sufficient` / `insufficient`),
        reason, and the smallest effect it could detect (None: unbounded)."""
        self._step: dict[str, float] = {}
        self._proposals_failed_in_a_row = 0
        self._proposer_error: str | None = None
        self.proposals = 0
        """Proposals this run started (a restarted one counted once): the next one's share of the
        run's error rate (ProposerView.proposal)."""
        self.rescorer: Any = None
        """The run's reward that confirms candidates (rewards.rescore.Rescorer, set by
        `confirm_in_run`): it keeps the rollouts of the batches the proposals read."""
        self.unconfirmed: str | None = None
        """Why confirmation is unavailable in this run (`confirm_in_run`), or None: what the
        term adds then says "not confirmed: correlational only (why)"."""

    # --- the term ---------------------------------------------------------------------------------

    async def score(self, batch: Batch) -> TermScores:
        """Apply a finished proposal, judge every reply, retire what nothing triggered. With
        `sync`, first wait for the proposal in flight."""
        if self.cfg.sync:
            await self.settle()
        self._apply_pending(batch.step)
        rollouts = batch.rollouts
        active = self.buffer.active()
        texts, contexts, owner = judge_inputs(enumerate(rollouts) if active else [], self.cfg.judge.context)
        judgements = await self.judge.assess(texts, active, self.buffer.version, contexts) if texts else []
        verdicts: list[dict[str, bool]] = [dict.fromkeys((p.id for p in active), False) for _ in rollouts]
        failed: list[set[str]] = [set() for _ in rollouts]
        valid: list[set[str]] = [set() for _ in rollouts]
        for i, j in zip(owner, judgements):
            for pid, hit in j.verdicts.items():
                verdicts[i][pid] = verdicts[i][pid] or hit
                (failed if pid in j.failed else valid)[i].add(pid)
        triggers = {p.id: 0 for p in active}
        judged = {p.id: 0 for p in active}
        violations = []
        for v, ok in zip(verdicts, valid):
            violations.append(sum(v.values()))
            for pid, hit in v.items():
                triggers[pid] += hit
                judged[pid] += pid in ok
        retired = self.buffer.end_step(batch.step, triggers, len(rollouts), judged)
        for p in self.buffer.active():
            if p.regex in self.judge.unusable_regexes:
                self.buffer.retire(p.id, batch.step, reason="unusable_regex", why=self.judge.unusable_regexes[p.regex])
                retired.append(p.id)
        n = len(rollouts)
        self._count("penalties/retires", len(retired))
        self._step["penalties/frac_violating"] = sum(k > 0 for k in violations) / n if n else 0.0
        self._step["penalties/mean_violations"] = sum(violations) / n if n else 0.0
        for pid, t in triggers.items():
            self._step[f"penalty/{pid}/prevalence"] = t / n if n else 0.0
        asked, n_failed = len(texts) * len(active), sum(len(j.failed) for j in judgements)
        self._count("judge/verdicts", asked)
        self._count("judge/failed_verdicts", n_failed)
        self.judge.window.add(n_failed, asked)
        if asked:
            self._step["judge/failure_rate"] = n_failed / asked
        info = [{"verdicts": v, "violations": k, "judge_failed": sorted(f)}
                for v, k, f in zip(verdicts, violations, failed)]
        return TermScores(self._costs(active, verdicts, violations), info, self.buffer.drain_events(),
                          unscored=[bool(f) for f in failed])

    def _costs(self, active: list[Penalty], verdicts: list[dict[str, bool]], violations: list[int]) -> list[float]:
        """Each rollout's penalty: −λ · violations (`weight="fixed"`), or minus the sum of its
        violated penalties' costs, λ plus each one's measured pay (`weight="pay"`, penalties.pay)."""
        if self.cfg.weight == "fixed":
            return [-self.cfg.lam * k for k in violations]
        cost = {p.id: violation_cost(p, self.cfg.lam, self.cfg.weight) for p in active}
        for pid, c in cost.items():
            self._step[f"penalty/{pid}/cost"] = c
        return [-sum(cost[pid] for pid, hit in v.items() if hit) for v in verdicts]

    def observe(self, batch: Batch, task_group: anyio.abc.TaskGroup) -> None:
        """Keep this batch's view (and, `weight="pay"`, what the reward paid each live penalty's
        pattern); every `every` steps (step % every == 0, `_due`), start a proposal in the
        background on the views of the last `view_steps` batches."""
        before = [[r.reward - r.scores.get(self.name, 0.0) for r in g] for g in batch.groups]
        if self.cfg.weight == "pay":
            self._measure_pay(batch, before)
        own = [[reply_scores(r, b) for r, b in zip(g, bg)] for g, bg in zip(batch.groups, before)]
        latest = build_view(batch, before, group_centred(before), seed=self.seed, step=batch.step,
                            groups=self.view_groups, per_group=self.view_per_group, reply_scores=own)
        if self._reference_batches < self.cfg.reference_steps:
            self.reference = self.reference + latest.samples
            self._reference_batches += 1
        self.recent.append(latest)
        if self.rescorer is not None:  # the rollouts of every view a proposal may still confirm on
            running = [s.batch for s in self._running.samples if s.batch is not None] if self._running else []
            self.rescorer.remember(batch, keep_from=min([v.step for v in self.recent] + running))
        if not self._due(batch.step) and self._restart is None:
            return
        if self._proposer_gave_up():  # the run stops at this step's end: no proposal after the last allowed
            return
        if self.in_flight:
            self._count("proposer/skipped_in_flight")
            log.info("proposer.skipped", step=self.label(batch.step), reason="previous proposal still running")
            return
        active, retired = self.buffer.preview([r.accepted for r in self.pending if r.accepted])
        if self._restart is not None:  # a proposal that never finished (checkpoint, cancel): again, first
            views, step, proposal = [self._restart], self._restart.step, self._restart.proposal
            self._restart = None
            self._count("proposer/restarted")
        else:
            views, step = list(self.recent), batch.step
            self.proposals += 1
            proposal = self.proposals
        view = pool_views(views, step=step, active=active, retired=retired, domain=self.domain,
                          reference=self.reference, proposal=proposal)
        self.in_flight, self._running = True, view
        self._done, self._scope = anyio.Event(), anyio.CancelScope()  # finish() may cancel it before it starts
        self._count("proposer/started")
        task_group.start_soon(self._propose, view)

    def _due(self, step: int) -> bool:
        """A proposal is due at `step`: step % every == 0, or with `sparse_steps` a multiple of
        `every` passed since the previous observed batch (the same where no step is skipped)."""
        last, self._observed = self._observed, step
        if not self.sparse_steps or last is None:
            return step % self.cfg.every == 0
        return step // self.cfg.every > last // self.cfg.every

    async def settle(self) -> None:
        """Wait for the proposal in flight, if any, to finish (its result queued): what `sync`
        does before a step's score, for a checkpoint taken between steps."""
        if self.in_flight and self._done is not None:
            await self._done.wait()

    async def finish(self) -> None:
        """The run ends: wait up to `finish_timeout` seconds (default 0) for a proposal in flight
        (a result is queued, so the last checkpoint keeps it); then cancel it (counted) and keep
        its view, so a resumed or extended run proposes it again."""
        if not self.in_flight or self._done is None:
            return
        with anyio.move_on_after(self.cfg.finish_timeout):
            await self._done.wait()
        if self.in_flight and self._scope is not None:
            self._scope.cancel()
            await self._done.wait()

    def metrics(self) -> dict[str, float]:
        """This step's metrics (counters since the last call), then reset."""
        out = {"penalties/active": float(len(self.buffer)), "penalties/adds": 0.0,
               "penalties/revives": 0.0, "penalties/retires": 0.0,
               "proposer/in_flight": float(self.in_flight), "proposer/pending": float(len(self.pending)),
               "proposer/accepted": 0.0, "proposer/failed": 0.0, "proposer/cancelled": 0.0,
               "buffer/version": float(self.buffer.version)}
        out.update(self.judge.stats.metrics())
        out.update(self._step)
        out.update({f"{k}_total": self.totals.get(k, 0.0) for k in self.TOTALS})
        if self.rescorer is not None:  # a run that confirms: what confirmation cost and rejected, so far
            out.update({f"{k}_total": self.totals.get(k, 0.0) for k in self.CONFIRM_TOTALS})
        self.judge.stats.reset()
        self._step = {}
        return out

    def chat_models(self) -> dict[str, Any]:
        return {"penalty judge": self.judge.chat, "proposer": getattr(self.proposer, "chat", None),
                "dedup": getattr(self.proposer, "dedup_chat", None)}

    def stop_reason(self) -> str | None:
        """A judge failing more than `max_failure_rate` of its verdicts over the last
        `failure_window` judged steps, or `max_failed_proposals` failed proposals in a row."""
        p = self.cfg.proposer
        judge = self.judge.window.stop_reason("penalties.judge.max_failure_rate", self.judge.last_error)
        if judge:
            return judge
        if failure := getattr(self.proposer, "failure", None):  # the reward confirming candidates (penalties.witness)
            return failure
        if self._proposer_gave_up():
            return (f"the proposer failed its last {self._proposals_failed_in_a_row} proposals "
                    f"(penalties.proposer.max_failed_proposals={p.max_failed_proposals}); "
                    f"last error: {self._proposer_error}")
        return None

    def _proposer_gave_up(self) -> bool:
        """`max_failed_proposals` proposals in a row failed. The rule is exact: no proposal starts
        after the one whose failure reached the limit, so the run stops with exactly that many,
        however fast the background proposer runs against the steps."""
        limit = self.cfg.proposer.max_failed_proposals
        return limit is not None and self._proposals_failed_in_a_row >= limit

    def state_dict(self, views_apart: bool = False) -> dict[str, Any]:
        """Buffer, running totals, the kept views, the accepted proposals not applied yet, and the
        view of a proposal in flight (a resumed run proposes it again), and this step's counters not
        reported yet (a proposal that finished after the step's metrics: the next step reports them).
        `views_apart`: the kept
        views are named by their steps (`recent_steps`) and the reference left out, for a caller
        that saves each step's view once, apart (the monitor: a step's save then costs that step,
        not the window); `load_state_dict` then takes them back through `view_of`."""
        unfinished = self._running or self._restart
        state: dict[str, Any] = {
            "buffer": self.buffer.to_json(), "totals": dict(self.totals),
            "pending": [{"step": r.step, "candidate": r.accepted.to_dict()} for r in self.pending if r.accepted],
            "in_flight": view_state(unfinished) if unfinished else None,
            "reference_batches": self._reference_batches, "evidence": self.evidence, "proposals": self.proposals,
            "observed_step": self._observed,
            "unreported": dict(self._step)}  # counters since the last `metrics` (a proposal that finished)
        if views_apart:
            state["recent_steps"] = [v.step for v in self.recent]
        else:
            state["recent"] = [view_state(v) for v in self.recent]
            state["reference"] = [sample_state(s) for s in self.reference]
        return state

    def load_state_dict(self, state: dict[str, Any], view_of: Callable[[int], ProposerView] | None = None,
                        reference: list[ViewSample] | None = None) -> None:
        """The state `state_dict` gave; with `views_apart`, `view_of(step)` gives back each kept
        view and `reference` the reference's samples."""
        self.buffer.load_json(state["buffer"])
        self.totals = dict(state.get("totals", {}))
        self.recent.clear()
        if "recent_steps" in state:
            assert view_of is not None, "views saved apart: load_state_dict needs view_of"
            self.recent.extend(view_of(int(step)) for step in state["recent_steps"])
            self.reference = list(reference or [])
        else:
            self.recent.extend(view_from_state(v) for v in state.get("recent", []))
            self.reference = [ViewSample(**s) for s in state.get("reference", [])]
        self.evidence = state.get("evidence")
        self._observed = state.get("observed_step")
        self._step = dict(state.get("unreported", {}))
        # older checkpoints: every start counted, restarts too (at worst a share spent twice)
        self.proposals = int(state.get("proposals", self.totals.get("proposer/started", 0)))
        self._reference_batches = int(state.get("reference_batches", 1 if self.reference else 0))
        pending = state.get("pending") or []
        if isinstance(pending, dict):  # older checkpoints: one candidate, its step apart
            pending = [{"step": state.get("pending_step", 0), "candidate": pending}]
        self.pending = [ProposalResult(step=int(d["step"]), accepted=Candidate.from_dict(copy.deepcopy(d["candidate"])))
                        for d in pending]
        self._restart = view_from_state(state["in_flight"]) if state.get("in_flight") else None

    # --- internals ------------------------------------------------------------------------------

    async def _propose(self, view: ProposerView) -> None:
        t0 = time.perf_counter()
        assert self._done is not None and self._scope is not None
        done, scope, result = self._done, self._scope, None
        try:
            with scope:
                try:
                    result = await self.proposer.propose(view)
                except Exception as e:  # noqa: BLE001 - proposers should not raise; if one does, count it
                    result = ProposalResult(step=view.step, error=f"{type(e).__name__}: {e}",
                                            latency=time.perf_counter() - t0)
        finally:
            self.in_flight, self._running, self._scope = False, None, None
            if result is None:  # cancelled: keep the view, a resumed run proposes it again
                self._restart = view
            done.set()
        if result is None:
            self._count("proposer/cancelled")
            log.warning("proposer.cancelled", step=self.label(view.step), after_s=round(time.perf_counter() - t0, 3))
            return
        self._step["proposer/latency"] = result.latency
        self._count("proposer/finished")
        self._proposals_failed_in_a_row = 0 if result.ok else self._proposals_failed_in_a_row + 1
        self._proposer_error = " ".join(str(result.error).split())[:300] if not result.ok else None
        self._count("proposer/candidates", result.candidates)
        self._count("proposer/regex_timeouts", result.regex_timeouts)
        if result.reward_calls:  # confirmation (penalties.witness): the reward's cost, counted as the judge's
            self._count("confirm/reward_calls", result.reward_calls)
            self._count("confirm/seconds", result.confirm_seconds)
        if result.ok:
            self._count("proposer/insufficient", float(result.evidence == "insufficient"))
            self._count("proposer/unnamed", float(result.unnamed is not None))
            if result.unnamed is not None:
                log.warning("proposer.unnamed", step=output_step(view.step), carried_by=result.unnamed,
                            said="the reward pays for something in the replies' form that no pattern names yet")
            self.evidence = {"step": view.step, "state": result.evidence, "reason": result.evidence_reason,
                             "detectable": result.detectable if math.isfinite(result.detectable) else None,
                             "unnamed": result.unnamed,
                             "accepted": None if result.accepted is None else brief(result.accepted)}
            if result.omnibus is not None:  # what the omnibus test read of the view (a draw past its size)
                self.evidence["omnibus"] = result.omnibus
            if result.also:  # the runners-up, queued after it (`runners_up`)
                self.evidence["also"] = [brief(c) for c in result.also]
            if result.read is not None:  # the proposal read a draw of the view (`most_rollouts`)
                self.evidence["read"] = result.read
            if result.co_travellers:  # what the reward's confirmation rejected (penalties.witness)
                self.evidence["co_travellers"] = result.co_travellers
                for c in result.co_travellers if self.rescorer is not None else []:  # a run's log says each
                    log.info("proposer.co_traveller", step=self.label(view.step), title=c["title"],
                             said=confirmation_text(c["confirmation"]))
        for reason, n in result.rejected.items():
            self._count(f"proposer/rejected/{reason}", n)
        if not result.ok:
            self._count("proposer/failed")
            self._count(f"proposer/failed/{result.failed_at or 'propose'}")
            log.warning("proposer.failed", step=self.label(view.step), stage=result.failed_at, error=result.error)
        elif result.accepted is not None:
            for c in [result.accepted, *result.also]:  # the runners-up enter after it, one a step
                if self.unconfirmed and c.confirmation is None:
                    c.confirmation = Confirmation(NOT_CONFIRMABLE, self.unconfirmed).to_dict()
                self._count("proposer/accepted")
                self.pending.append(result if c is result.accepted else ProposalResult(step=result.step, accepted=c))
                log.info("proposer.accepted", step=self.label(view.step), title=c.title, queued=len(self.pending))

    def _measure_pay(self, batch: Batch, before: list[list[float]]) -> None:
        """Each live penalty's within-group reward gap on this batch, kept on it (penalties.pay)."""
        for p in self.buffer.active():
            judged = [[(b, None if p.id in r.info.get("judge_failed", ()) else r.info.get("verdicts", {}).get(p.id))
                       for r, b in zip(g, bg)] for g, bg in zip(batch.groups, before)]
            record_pay(p, batch.step, group_gaps(judged), self.cfg.every)

    def _apply_pending(self, step: int) -> None:
        """Apply the oldest accepted proposal the buffer takes (one per step); refusals are counted."""
        while self.pending:
            result = self.pending.pop(0)
            assert result.accepted is not None
            try:
                confirmed = {"confirmation": result.accepted.confirmation} if result.accepted.confirmation else {}
                p = self.buffer.add(result.accepted, step, proposed_at=result.step, **confirmed)
            except PenaltyBufferError as e:
                self._count("proposer/apply_refused")
                log.warning("proposer.apply_refused", step=self.label(step), error=str(e))
                continue
            break
        else:
            return
        event = p.history[-1]["event"]
        self._count("penalties/adds" if event == "add" else "penalties/revives")
        log.info(f"penalty.{event}", step=self.label(step), id=p.id, title=p.title,
                 proposed_at=self.label(result.step))

    def _count(self, key: str, n: float = 1) -> None:
        self._step[key] = self._step.get(key, 0.0) + n
        self.totals[key] = self.totals.get(key, 0.0) + n


def brief(c: Candidate) -> dict[str, Any]:
    """What evidence.jsonl records of a proposed candidate: its title, regex and detector."""
    return {k: getattr(c, k) for k in ("title", "regex", "detector")}


def sample_state(s: ViewSample) -> dict[str, Any]:
    """A view sample as plain data (what `ViewSample(**d)` takes back): its fields, lists copied
    one level (a sample holds strings and numbers), without `asdict`'s deep copy."""
    return {f: list(v) if isinstance(v := getattr(s, f), list) else v for f in SAMPLE_FIELDS}


SAMPLE_FIELDS = tuple(f.name for f in fields(ViewSample))


def view_state(v: ProposerView) -> dict[str, Any]:
    """A kept view as plain data (`view_from_state` takes it back)."""
    return {"step": v.step, "samples": [sample_state(s) for s in v.samples], "proposal": v.proposal}


def view_from_state(d: dict[str, Any]) -> ProposerView:
    return ProposerView(d["step"], [ViewSample(**s) for s in d["samples"]], proposal=int(d.get("proposal", 1)))


def reply_scores(rollout: Rollout, before: float) -> list[float]:
    """The replies' own scores before penalties: the RM's per-reply scores (`rm_scores`) when the
    reward before penalties is their mean (views.own_reply_scores); [] otherwise."""
    return own_reply_scores(rollout.info.get("rm_scores") or [], len(rollout.replies), before)
