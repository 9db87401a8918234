"""Steps whose files vanished before the monitor read them (a writer that rotates its logs).

TRL writes one `completions_NNNNN.parquet` per logged step and verl one `<step>.jsonl`: the step
is in the file's name. A run (or a user's clean-up) that removes old files can remove some before
a following monitor has read them; each poll reads whatever is there, so those steps would be
skipped without a word. `VanishedSteps` names them:

- a step whose file a poll listed and a later poll no longer finds, never monitored: certain;
- a step missing from the run's logging cadence between the last monitored step and the newest
  file now there: inferred. The cadence is the most common gap between the steps known (monitored
  and listed), taken only when at least two gaps agree; the grid is anchored on the newest step,
  so a first step logged off the grid (TRL's `logging_first_step`) is no gap.

Each vanished step is said once, in one warning line, and kept in the monitor folder's
`vanished.jsonl`, which `summary.json` counts (`vanished_steps`): a monitor that did not see a
step never reads as if it had seen it clean.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..runlog import append_jsonl, read_jsonl

LOG = "vanished.jsonl"
"""One line per vanished step: {"step", "how": "listed" or "cadence"}."""
_NAMED = {"trl": re.compile(r"completions_(\d+)\.parquet"), "verl": re.compile(r"(\d+)\.jsonl")}


def file_step(path: Path, fmt: str) -> int | None:
    """The step a file's name carries in a format that names files by step (TRL, verl), else None."""
    pattern = _NAMED.get(fmt)
    m = pattern.fullmatch(path.name) if pattern else None
    return int(m.group(1)) if m else None


def cadence(steps: set[int]) -> int | None:
    """The most common gap between consecutive `steps`, when at least two gaps agree on it."""
    ordered = sorted(steps)
    gaps = Counter(b - a for a, b in zip(ordered, ordered[1:]))
    if not gaps:
        return None
    gap, count = gaps.most_common(1)[0]
    return gap if count >= 2 else None


class VanishedSteps:
    """What one following invocation has listed, and the vanished steps it has said."""

    def __init__(self, out: Path, fmt: str, merge: int = 1):
        self.out, self.fmt, self.merge = out, fmt, merge
        self.listed: set[int] = set()
        self.said = {int(r["step"]) for r in read_jsonl(out / LOG)} if (out / LOG).is_file() else set()

    def check(self, files: list[Path], done: set[int]) -> str | None:
        """The new vanished steps given this poll's `files` and the steps monitored (`done`), each
        logged in `vanished.jsonl`; one warning line naming them, or None."""
        present = {s for f in files if (s := file_step(f, self.fmt)) is not None}
        if not present:
            return None
        last = max(done) + self.merge - 1 if done else None  # the last logged step monitored (`--merge-steps`)
        found = {s: "listed" for s in self.listed - present if last is None or s > last}
        gap = cadence(self.listed | present | (done if self.merge == 1 else set()))
        if gap is not None and last is not None:
            newest = max(present)
            found |= {s: "cadence" for s in range(newest - gap, last, -gap) if s not in present and s not in found}
        self.listed |= present
        new = {s: how for s, how in found.items() if s not in self.said}
        if not new:
            return None
        for s in sorted(new):
            append_jsonl(self.out / LOG, {"step": s, "how": new[s]})
        self.said |= set(new)
        steps = sorted(new)
        return (f"warning: step(s) {', '.join(map(str, steps))} vanished before the monitor read them (their files "
                f"were removed: a writer rotating its logs?); they are not monitored, and summary.json counts them "
                f"(vanished_steps)")


def vanished_steps(out: Path) -> list[int]:
    """The steps of monitor folder `out` that vanished unread, in order."""
    path = out / LOG
    return sorted({int(r["step"]) for r in read_jsonl(path)}) if path.is_file() else []


def note(out: Path) -> str | None:
    """The verdict's addendum when steps vanished unread, else None."""
    steps = vanished_steps(out)
    if not steps:
        return None
    return (f"{len(steps)} logged step(s) vanished before they were read and were not monitored "
            f"({', '.join(map(str, steps[:20]))}{' …' if len(steps) > 20 else ''})")


def with_vanished(summary: dict[str, Any], out: Path) -> dict[str, Any]:
    """summary.json's fields with the vanished steps counted (`vanished`, `vanished_steps`) and,
    when there are any, said in the verdict."""
    steps = vanished_steps(out)
    extra = f"; {said}" if (said := note(out)) else ""
    return {**summary, "verdict": f"{summary['verdict']}{extra}", "vanished": len(steps), "vanished_steps": steps}
