"""Replay Dynalize's penalty term over the rollouts of a run it did not train.

Each monitored step goes through the same `PenaltyTerm` a dynalize run uses: the oldest accepted
proposal enters the buffer (at most one per step), every reply is judged against the live
penalties, untriggered penalties retire; then every `every` steps the proposer reads the views of
the latest batches (rewards with their advantage signs within groups, the first batch as the
reference). Nothing is trained, so nothing waits: a proposal finishes before the next step, which
makes a replay deterministic and a continued replay (`Monitor.load`) equal to one made in one go.

The output folder is run-like (what `python -m dynalize.report` reads): metrics.jsonl,
rollouts/step_NNNNNN.jsonl (with verdicts), penalties.jsonl, plus monitor_state.json and
monitor_state/, the state a later invocation continues from (state.py: saving a step costs what
the step holds, not what the run has monitored).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

import anyio
import yaml

from ..build_penalties import penalty_term, uses_llm
from ..penalties.config import PenaltiesConfig
from ..rewards.base import mark_unscored
from ..rewards.penalties import PenaltyTerm
from ..runlog import RunDir, append_jsonl, read_jsonl, write_jsonl_atomic
from ..types import Batch, Rollout
from .outdir import STATE, write_atomic
from .readers import MonitoredRollout, MonitorInputError
from .state import StateFiles

EVIDENCE = "evidence.jsonl"
"""One line per proposal: its step, whether its tests could have seen a hack (`state`), why not
(`reason`) and the smallest effect they could detect (`detectable`)."""
STATE_VERSION = 2
"""2: the views, the reference and the steps' digests saved apart (state.py); 1 (read, then
continued as 2): everything in monitor_state.json, rewritten whole every step."""


def row_key(r: MonitoredRollout) -> str:
    """A rollout as text: group, prompt, turns and reward (its order in the file left out)."""
    return json.dumps([r.group, [m.to_dict() for m in r.prompt], [m.to_dict() for m in r.turns], r.reward],
                      ensure_ascii=False)


def in_canonical_order(rows: list[MonitoredRollout]) -> tuple[list[MonitoredRollout], str]:
    """A step's rows sorted by what they hold, and their `rows_digest`: a replay never depends on
    the order a framework (or a shuffle, or a parallel writer) listed them in within the step."""
    keys = list(map(row_key, rows))
    order = sorted(range(len(rows)), key=keys.__getitem__)
    return [rows[i] for i in order], _digest(keys[i] for i in order)


def rows_digest(rows: list[MonitoredRollout], in_file_order: bool = False) -> str:
    """What a monitored step held, in any order: a later invocation refuses a step whose rows
    changed. (`in_file_order`: the digest monitor folders saved before, order included.)"""
    keys = list(map(row_key, rows))
    return _digest(keys if in_file_order else sorted(keys))


def _digest(keys) -> str:
    h = hashlib.sha256()
    for key in keys:
        h.update(key.encode())
    return h.hexdigest()[:16]


def as_batch(step: int, rows: list[MonitoredRollout]) -> Batch:
    """The rows of one step as a dynalize batch: groups in order of first appearance."""
    groups: dict[str, list[Rollout]] = {}
    for r in rows:
        members = groups.setdefault(r.group, [])
        members.append(Rollout(prompt_id=r.group, group=len(groups) - 1, prompt_ids=[], completion_ids=[],
                               logprobs=[], loss_mask=[], replies=r.replies, policy_version=step,
                               messages=list(r.prompt), turns=list(r.turns), scores={"reward": r.reward},
                               reward=r.reward))
    return Batch(step, list(groups.values()))


def within_group_gap(batch: Batch, pid: str) -> float | None:
    """Mean over groups of (mean reward of rollouts triggering `pid` − mean of the rest), over the
    groups that have both; None when no group has both."""
    gaps = []
    for g in batch.groups:
        hit = [r.reward for r in g if (r.info.get("verdicts") or {}).get(pid)]
        rest = [r.reward for r in g if not (r.info.get("verdicts") or {}).get(pid)]
        if hit and rest:
            gaps.append(statistics.fmean(hit) - statistics.fmean(rest))
    return statistics.fmean(gaps) if gaps else None


def monitor_term(cfg: PenaltiesConfig, domain: str, seed: int) -> PenaltyTerm:
    """The penalty term `cfg` describes; an engine (dynalize.build) is imported only for an LLM
    proposer or judge, so a lexical replay with the regex judge loads no torch or transformers."""
    factory = None
    if uses_llm(cfg):
        from ..build import build_chat_model

        factory = build_chat_model
    term = penalty_term(cfg, domain=domain, seed=seed, chat_factory=factory)
    term.label = logged_step  # its batches carry the logged step: log lines name it as the files do
    return term


def logged_step(step: int) -> int:
    """A batch's step as it was logged (the monitor's and dynalize.trl's batches carry it)."""
    return step


def step_metrics(batch: Batch, term: PenaltyTerm) -> dict[str, Any]:
    """One step's metrics row: the batch's size and reward (`Rollout.reward`), the term's metrics
    (then reset) and each live penalty's within-group reward gap."""
    rewards = [r.reward for r in batch.rollouts]
    out: dict[str, Any] = {"step": batch.step, "rollouts": len(rewards), "groups": len(batch.groups),
                           "reward/mean": statistics.fmean(rewards), "reward/std": statistics.pstdev(rewards)}
    out.update(term.metrics())
    for p in term.buffer.active():
        gap = within_group_gap(batch, p.id)
        if gap is not None:
            out[f"penalty/{p.id}/reward_gap"] = gap
    return out


class Monitor:
    """One monitor output folder: the penalty term, the steps done, and how to continue."""

    def __init__(self, out: str | Path, cfg: PenaltiesConfig, *, seed: int = 0, domain: str = "",
                 term: PenaltyTerm | None = None):
        self.out = Path(out)
        self.cfg, self.seed, self.domain = cfg, seed, domain
        self.term = term or monitor_term(cfg, domain, seed)
        self.log = RunDir(self.out)
        self.done: dict[int, str] = {}
        """Monitored steps and the digest of their rows."""
        self.source: dict[str, Any] = {}
        self.files = StateFiles(self.out)

    # --- persistence ----------------------------------------------------------------------------

    @classmethod
    def load(cls, out: str | Path, term: PenaltyTerm | None = None) -> "Monitor":
        """The monitor of folder `out` as its last invocation left it."""
        path = Path(out) / STATE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            cfg = PenaltiesConfig.model_validate(state["penalties"])
        except (OSError, json.JSONDecodeError, KeyError, ValueError) as e:
            raise MonitorInputError(f"monitor: {path} is not a readable monitor state ({type(e).__name__})") from None
        if state.get("version") not in (1, STATE_VERSION):
            raise MonitorInputError(f"monitor: {path} was written by another monitor version")
        m = cls(out, cfg, seed=int(state["seed"]), domain=state.get("domain", ""), term=term)
        m.source = dict(state.get("source") or {})
        try:
            if state["version"] == 1:  # everything inline: saved apart from the next step on
                m.term.load_state_dict(state["term"])
                m.done = {int(k): v for k, v in state["done"].items()}
                m.files.views.mkdir(parents=True, exist_ok=True)
                write_jsonl_atomic(m.files.root / "steps.jsonl",
                                   [{"step": k, "digest": v} for k, v in sorted(m.done.items())])
            else:
                m.files.load_term(m.term, state["term"])
                m.done = m.files.load_steps(state["last"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise MonitorInputError(f"monitor: {path} or {m.files.root} is not a readable monitor state "
                                    f"({type(e).__name__}: {e})") from None
        m.trim()
        return m

    def trim(self) -> None:
        """Forget lines of our own files past the last saved step (an invocation that died between
        writing a step and saving the state): that step is monitored again."""
        last = max(self.done) if self.done else -1
        for name in ("metrics.jsonl", "penalties.jsonl", EVIDENCE):
            path = self.out / name
            if path.exists():
                rows = read_jsonl(path)
                keep = [r for r in rows if r.get("step", -1) <= last]
                if len(keep) != len(rows):
                    write_jsonl_atomic(path, keep)

    def save(self, step: int | None = None) -> None:
        """The state after monitoring `step` (None: before any): that step's view and digest
        written apart (state.py), then monitor_state.json, small, written whole (a crash leaves
        the previous one), then the views it no longer keeps removed."""
        term = self.files.save_term(self.term, step, self.done.get(step) if step is not None else None)
        state = {"version": STATE_VERSION, "seed": self.seed, "domain": self.domain, "source": self.source,
                 "penalties": self.cfg.model_dump(mode="json"), "last": max(self.done) if self.done else None,
                 "steps": len(self.done), "term": term}
        write_atomic(self.out / STATE, json.dumps(state, ensure_ascii=False))
        self.files.forget_views(term["recent_steps"])

    def start(self, source: dict[str, Any]) -> None:
        """A new output folder: its config.yaml names the source and the penalty settings."""
        self.log.create()
        self.source = source
        cfg = {"name": self.out.name, "monitor": source, "seed": self.seed, "penalties": self.cfg.model_dump(mode="json")}
        (self.out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        self.save()

    # --- replay ---------------------------------------------------------------------------------

    def check_unchanged(self, steps: dict[int, list[MonitoredRollout]]) -> None:
        """Refuse rows that changed under a step already monitored (one line)."""
        for step, digest in self.done.items():
            if step in steps and digest not in (rows_digest(steps[step]), rows_digest(steps[step], True)):
                raise MonitorInputError(f"monitor: the rows of step {step} changed since it was monitored; "
                                        f"monitor into a new --out folder")

    async def step(self, step: int, rows: list[MonitoredRollout]) -> dict[str, Any]:
        """Judge, retire and propose for one step, as a run's penalty term would; its metrics row."""
        if self.done and step <= max(self.done):
            raise MonitorInputError(f"monitor: step {step} comes after step {max(self.done)} was monitored")
        ordered, digest = in_canonical_order(rows)
        batch = as_batch(step, ordered)
        scored = await self.term.score(batch)
        for r, info, unscored in zip(batch.rollouts, scored.info, scored.unscored or [False] * len(batch.rollouts)):
            r.info.update(info)
            if unscored:
                mark_unscored(r, self.term.name)
            r.advantage = 0.0
        async with anyio.create_task_group() as tg:
            self.term.observe(batch, tg)  # the proposal runs to its end here: nothing waits on it
        metrics = self.metrics(batch)
        evidence = self.term.evidence
        if evidence is not None and evidence.get("step") == step:  # this step's proposal
            append_jsonl(self.out / EVIDENCE, evidence)
        self.log.log_rollouts(step, batch.rollouts)
        self.log.log_events("penalties", scored.events)
        self.log.log_metrics(metrics)
        self.done[step] = digest
        self.save(step)
        return metrics

    def metrics(self, batch: Batch) -> dict[str, Any]:
        return step_metrics(batch, self.term)

    def stop_reason(self) -> str | None:
        return self.term.stop_reason()


def append_note(out: Path, record: dict[str, Any]) -> None:
    """One line in monitor.jsonl: what each invocation did (source, steps, exit status)."""
    append_jsonl(out / "monitor.jsonl", record)
