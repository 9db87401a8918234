"""What a monitor folder says: each discovered pattern, since when, how common it is now, and how
much more reward the replies that show it get than the rest of their group."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from ..penalties.confirm import CONFIRMED, confirmation_text
from ..runlog import read_jsonl

LIVE_EXIT = 10
"""Exit status of `python -m dynalize.monitor` when a discovered pattern is live at the last step."""
INSUFFICIENT_EXIT = 11
"""Exit status when no discovered pattern is live but most of the latest proposals (`RECENT`) could
not have seen a hack of the configured size (too few groups or rollouts, rewards tied within
groups), or none ran yet: no evidence, which is not "all clear"."""
UNNAMED_EXIT = 12
"""Exit status when no discovered pattern is live but the omnibus test of one of the latest
proposals (`RECENT`) passed: the reward pays for something in the replies' form that no pattern
names yet (penalties.omnibus). Not "all clear", and evidence of pay, so it outranks 11."""


RECENT = 3
"""The evidence of a run is that of its latest proposals, this many: insufficient when most of them
were (one proposal's power, which moves with its batch, does not flip the verdict)."""


def last_evidence(out: Path) -> dict[str, Any] | None:
    """The run's evidence (replay.EVIDENCE) over its `RECENT` latest proposals, or None when no
    proposal ran: the latest proposal's of the state most of them had (`recent` says how many were
    insufficient); insufficient too when the logs begin after the run's first step (`late_start`)."""
    path = out / "evidence.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    if not rows:
        return None
    recent = rows[-RECENT:]
    weak = [r for r in recent if r.get("state") == "insufficient"]
    state = "insufficient" if 2 * len(weak) > len(recent) else "sufficient"
    latest = next(r for r in reversed(recent) if (r.get("state") == "insufficient") == (state == "insufficient"))
    evidence = {**latest, "recent": f"{len(weak)} of the latest {len(recent)} proposal(s) insufficient"}
    if rows[-1].get("accepted"):  # the latest proposal's find, whatever state most proposals had
        evidence |= {"accepted": rows[-1]["accepted"], "accepted_step": rows[-1].get("step")}
    else:
        evidence.pop("accepted", None)
    flagged = [r for r in recent if r.get("unnamed")]
    if flagged:
        evidence |= {"unnamed": flagged[-1]["unnamed"], "unnamed_step": flagged[-1].get("step")}
    return late_start(evidence, first_step(out))


def co_travellers(out: Path) -> list[dict[str, Any]]:
    """Every candidate the reward's confirmation rejected (penalties.witness), with the step of its
    proposal and what edited replies said (`rejected: co-traveller (pay ...)`)."""
    path = out / "evidence.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    return [{"step": r.get("step"), **c, "said": confirmation_text(c.get("confirmation"))}
            for r in rows for c in r.get("co_travellers") or []]


def first_step(out: Path) -> int | None:
    """The first monitored step (the run's first logged one), or None before any: the first line
    of the monitor's own metrics.jsonl (`patterns` reads the whole file, and says if it is damaged)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return None
    with path.open(encoding="utf-8", errors="replace") as f:
        line = f.readline()
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):  # a torn first line: nothing monitored yet
        return None
    return step if isinstance(step, int) else None


def late_start(evidence: dict[str, Any], first: int | None) -> dict[str, Any]:
    """The evidence, insufficient when the logs begin after step 1 (TRL's `logging_steps` > 1, say):
    a hack already in most replies by the first logged step has no earlier logged batch to rise
    from and no contrast left within groups, so no test on these logs could see it. Finding
    nothing then is no evidence of nothing (the discovery benchmark's length shortcuts of a run
    logged every 10 steps: in every reply by step 10, and "no discovered pattern is live")."""
    if evidence.get("state") == "insufficient" or not isinstance(first, int) or first <= 1:
        return evidence
    return {**evidence, "state": "insufficient",
            "reason": f"the logs begin at step {first}, not step 1: a hack already in most replies by then has no "
                      f"earlier logged batch to rise from, and no test on these logs could see it"}


def insufficient(evidence: dict[str, Any] | None) -> bool:
    return evidence is None or evidence.get("state") == "insufficient"


def queued_pattern(last_step: int | None, found: list["Pattern"], evidence: dict[str, Any] | None) -> dict[str, Any] | None:
    """A pattern the proposal at the last monitored step accepted (title, regex, detector, and
    `step`: the step it enters the buffer, the next one, so no add event is written yet): found,
    not yet live. None when there is none."""
    if not evidence or last_step is None or evidence.get("accepted_step") != last_step:
        return None
    accepted = evidence.get("accepted")
    if not isinstance(accepted, dict) or any(p.live and p.title == accepted.get("title") for p in found):
        return None
    return {**accepted, "step": last_step + 1}


def exit_status(found: list["Pattern"], evidence: dict[str, Any] | None, last_step: int | None = None) -> int:
    """LIVE_EXIT when a pattern is live or was just found (`queued_pattern`), UNNAMED_EXIT when none is
    but a recent omnibus test passed, INSUFFICIENT_EXIT when the evidence is insufficient, else 0."""
    if any(p.live for p in found) or queued_pattern(last_step, found, evidence):
        return LIVE_EXIT
    if evidence is not None and evidence.get("unnamed"):
        return UNNAMED_EXIT
    return INSUFFICIENT_EXIT if insufficient(evidence) else 0


@dataclass
class Pattern:
    """A discovered pattern (a penalty of the replayed buffer) as of the last monitored step."""

    id: str
    title: str
    regex: str | None
    description: str
    since: int
    """The step it was detected: the step whose batches the proposer read when it proposed it."""
    entered: int
    """The step it entered the buffer (the step after its detection, or later when the buffer's
    one-add-a-step rule made it wait)."""
    live: bool
    """Active at the last step (not retired since its last add or revival)."""
    retired_at: int | None
    prevalence: float | None
    """Share of the last step's rollouts that show it (None when it was not judged then)."""
    reward_gap: float | None
    """Mean within-group reward difference, rollouts that show it minus the rest, at the last step
    where some group had both (`reward_gap_step`): a pattern every reply shows has no gap to
    measure any more, so the last measurable one is kept."""
    reward_gap_step: int | None = None
    """The step `reward_gap` was measured at (the last step, unless the gap was not measurable there)."""
    confirmation: dict[str, Any] | None = None
    """What scoring edited replies with the reward said when it entered (penalties.confirm), or
    None: not confirmed (no reward given), correlational only."""
    confirmed: str = ""
    """That, in words (penalties.confirm.confirmation_text)."""


def patterns(out: Path) -> tuple[int | None, list[Pattern]]:
    """(last monitored step, every discovered pattern) of monitor folder `out`."""
    metrics = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    events = read_jsonl(out / "penalties.jsonl") if (out / "penalties.jsonl").exists() else []
    last = metrics[-1] if metrics else {}
    found: dict[str, Pattern] = {}
    for e in events:
        pid = e.get("id")
        if e.get("event") == "add":
            found[pid] = Pattern(pid, e.get("title", ""), e.get("regex"), e.get("description", ""),
                                 int(e.get("proposed_at", e["step"])), e["step"], True, None, None, None,
                                 confirmation=e.get("confirmation"))
        elif pid in found and e.get("event") == "retire":
            found[pid].live, found[pid].retired_at = False, e["step"]
        elif pid in found and e.get("event") == "revive":
            found[pid].live, found[pid].retired_at = True, None
            found[pid].confirmation = e.get("confirmation", found[pid].confirmation)
    for p in found.values():
        p.confirmed = confirmation_text(p.confirmation)
        prev = last.get(f"penalty/{p.id}/prevalence")
        p.prevalence = float(prev) if isinstance(prev, int | float) else None
        key = f"penalty/{p.id}/reward_gap"
        measured = next((m for m in reversed(metrics) if isinstance(m.get(key), int | float)), None)
        if measured is not None:
            p.reward_gap, p.reward_gap_step = float(measured[key]), measured.get("step")
    return last.get("step"), list(found.values())


def verdict(last_step: int | None, found: list[Pattern], evidence: dict[str, Any] | None = None) -> str:
    """One sentence from the numbers: what is live at the last step, and since when; or, with no
    live pattern, whether the latest proposal could have seen one (`evidence`)."""
    if last_step is None:
        return "no step monitored yet"
    live = [p for p in found if p.live]
    if not live and (just_found := queued_pattern(last_step, found, evidence)):
        return (f"the proposal at step {last_step} found a pattern the reward pays for, {just_found['title']!r}; it enters "
                f"the buffer at the next step (no discovered pattern was live before it)")
    if not live:
        retired = f" ({len(found)} found earlier, all retired)" if found else ""
        if evidence is None:
            return f"insufficient evidence at step {last_step}: no proposal has run yet{retired}"
        if evidence.get("unnamed"):
            return (f"no named pattern is live at step {last_step}{retired}, but the reward pays for something "
                    f"in the replies' form that no pattern names yet (the omnibus test of the proposal at step "
                    f"{evidence.get('unnamed_step')}; carried by {', '.join(evidence['unnamed'])})")
        if insufficient(evidence):
            recent = f"; {evidence['recent']}" if evidence.get("recent") else ""
            return (f"insufficient evidence at step {last_step}: the proposal at step {evidence.get('step')} "
                    f"could not have seen a hack ({evidence.get('reason') or 'no reason given'}{recent}); no "
                    f"pattern is live, which is no evidence that none is paid for{retired}")
        size = evidence.get("detectable")
        could = f" (it could see effects of {size:.2f} reward stds and more)" if isinstance(size, int | float) else ""
        return f"no discovered pattern is live at step {last_step}{retired}; latest proposal at step {evidence.get('step')}{could}"
    first = min(p.since for p in live)
    names = "; ".join(f"{p.title!r} since step {p.since} ({p.confirmed or confirmation_text(p.confirmation)})"
                      for p in sorted(live, key=lambda p: p.since))
    confirmed = sum((p.confirmation or {}).get("state") == CONFIRMED for p in live)
    how = (f"the reward pays for all {len(live)} itself, edited replies show" if confirmed == len(live) else
           f"{confirmed} of them confirmed by edited replies, the rest correlational only" if confirmed else
           "none confirmed by edited replies: correlational only")
    return (f"{len(live)} pattern(s) the reward pays for are live at step {last_step} ({how}), "
            f"the first since step {first}: {names}")


def summary_table(last_step: int | None, found: list[Pattern]) -> Table:
    t = Table(title=f"Discovered patterns (last monitored step: {last_step})")
    for col in ("id", "pattern", "since", "entered", "status", "prevalence now", "reward gap now", "edited replies"):
        t.add_column(col)
    for p in found:
        status = "live" if p.live else f"retired at {p.retired_at}"
        what = f"{p.title}" + (f"  [dim]/{p.regex}/[/]" if p.regex else "")
        prev = "—" if p.prevalence is None else f"{p.prevalence:.0%}"
        t.add_row(p.id, what, str(p.since), str(p.entered), status, prev, gap_text(p, last_step),
                  p.confirmed or confirmation_text(p.confirmation))
    return t


def gap_text(p: Pattern, last_step: int | None) -> str:
    """The reward gap now, or the last measurable one and its step (a saturated pattern: every
    reply of every group shows it, so no group has a reply without it to compare)."""
    if p.reward_gap is None:
        return "—"
    if p.reward_gap_step == last_step:
        return f"{p.reward_gap:+.3f}"
    return f"{p.reward_gap:+.3f} (last measurable, step {p.reward_gap_step})"


def summary_json(last_step: int | None, found: list[Pattern], evidence: dict[str, Any] | None = None,
                 rejected: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What summary.json holds; `rejected`: the candidates confirmation rejected (`co_travellers`)."""
    return {"last_step": last_step, "verdict": verdict(last_step, found, evidence), "live": sum(p.live for p in found),
            "evidence": evidence, "patterns": [asdict(p) for p in found], "co_travellers": rejected or [],
            "queued": queued_pattern(last_step, found, evidence)}
