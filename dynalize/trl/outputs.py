"""The run-like folder a TRL run with penalties writes (what `python -m dynalize.report` reads):
config.yaml, metrics.jsonl, rollouts/step_NNNNNN.jsonl (with verdicts), penalties.jsonl,
evidence.jsonl, and at the end summary.json and report.html, as the monitor writes them.

Steps are TRL's: the batch generated at `global_step` k trains step k + 1, and is labelled so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog
import yaml

from ..monitor.outdir import write_atomic
from ..monitor.replay import EVIDENCE
from ..monitor.summary import INSUFFICIENT_EXIT, LIVE_EXIT, UNNAMED_EXIT, insufficient, last_evidence, patterns, summary_json, verdict
from ..rewards.penalties import PenaltyTerm
from ..runlog import RunDir, append_jsonl
from ..types import Batch

log = structlog.get_logger("dynalize.trl")


def status_of(term: PenaltyTerm) -> int:
    """The monitor's exit status now: LIVE_EXIT when a penalty is live, UNNAMED_EXIT when none is but
    the latest finished proposal's omnibus test passed, INSUFFICIENT_EXIT when it could not have seen
    one (or none finished yet), else 0."""
    if term.buffer.active():
        return LIVE_EXIT
    if term.evidence and term.evidence.get("unnamed"):
        return UNNAMED_EXIT
    return INSUFFICIENT_EXIT if insufficient(term.evidence) else 0


class RunFolder:
    """One run's folder, written by the main process only."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.log = RunDir(self.out)
        self.evidence_written: dict[str, Any] | None = None

    def start(self, config: dict[str, Any], resumed_at: int | None) -> None:
        """A new run: an earlier folder there is moved aside (never deleted). A resumed one: the
        lines of the steps after `resumed_at` are forgotten (they run again)."""
        if resumed_at is not None and self.out.is_dir():
            self.log.truncate(resumed_at, event_logs=("penalties", EVIDENCE.removesuffix(".jsonl")))
        elif self.log.holds_run():
            moved = self.log.move_aside()
            log.warning("penalties.folder_moved_aside", folder=str(self.out), to=str(moved))
        self.log.create()
        (self.out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def write_step(self, batch: Batch, events: list[dict[str, Any]], metrics: dict[str, Any],
                   evidence: dict[str, Any] | None) -> None:
        """One step's rollouts, penalty events, metrics row, and the evidence of a proposal that
        finished since the last step."""
        self.write_evidence(evidence)
        self.log.log_rollouts(batch.step, batch.rollouts)
        self.log.log_events("penalties", events)
        self.log.log_metrics(metrics)

    def write_evidence(self, evidence: dict[str, Any] | None) -> None:
        """The latest finished proposal's evidence, once (a proposal finishes in the background:
        its line is written at the next step, checkpoint or end of training)."""
        if evidence is not None and evidence != self.evidence_written:
            append_jsonl(self.out / EVIDENCE, evidence)
            self.evidence_written = evidence

    def verdict(self) -> str:
        """The monitor's sentence on the folder as it stands."""
        last, found = patterns(self.out)
        return verdict(last, found, last_evidence(self.out))

    def finish(self, html: bool = True) -> str:
        """summary.json and report.html, each written whole; the verdict."""
        last, found = patterns(self.out)
        evidence = last_evidence(self.out)
        write_atomic(self.out / "summary.json", json.dumps(summary_json(last, found, evidence), indent=1))
        if html and last is not None:
            from ..analysis.html import render_page
            from ..analysis.runs import Run

            write_atomic(self.out / "report.html", render_page([Run(self.out)]))
        return verdict(last, found, evidence)
