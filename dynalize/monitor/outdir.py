"""The monitor's output folder: where it may be, and how its files are written.

`--out` is checked before anything is written: it must be (or become) a folder of its own,
never a file, never inside a dynalize run or a checkpoint (dynalize's, or a transformers
trainer's `checkpoint-N/`, which the trainer deletes when it rotates checkpoints), never inside the rollouts it reads nor holding them. The files that are
rewritten as the monitor goes (summary.json, report.html) are written whole then renamed, so a
reader never sees half of one.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..runlog import is_checkpoint, is_run_dir

STATE = "monitor_state.json"
"""The file that marks a monitor folder (replay.py writes it)."""


def out_problem(out: Path, rollouts: Path) -> str | None:
    """Why `out` cannot be the monitor folder of `rollouts`, in one line; None if it can."""
    if out.is_symlink() and not out.exists():
        return f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist"
    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a folder: choose a folder"
    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"--out {out} cannot be made: {base} is not a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"--out {out} cannot be written: {base} is not writable"
    o, r = out.resolve(), rollouts.resolve()
    if r.is_dir() and o.is_relative_to(r):
        return (f"--out {out} is inside the rollouts {rollouts}: the monitor's files would be read as the run's; "
                f"choose a folder outside it")
    if r.is_relative_to(o):
        return f"--out {out} holds the rollouts {rollouts}: choose a folder of the monitor's own"
    for d in (o, *o.parents):
        ours = d == o and (d / STATE).is_file()
        if not ours and (d / STATE).is_file():
            return f"--out {out} is inside the monitor folder {d}: choose a folder outside it"
        if not ours and (is_run_dir(d) or is_checkpoint(d)):
            what = "checkpoint" if is_checkpoint(d) else "run"
            return (f"--out {out} is inside the {what} {d}: the monitor never writes into a run's folder; "
                    f"choose a folder outside it")
    if out.is_dir() and not (out / STATE).is_file() and any(out.iterdir()):
        return f"--out {out} exists and is not a monitor folder: choose a new --out"
    return None


def write_atomic(path: Path, text: str) -> None:
    """Write `path` whole: a temporary file beside it, then a rename (an error names `path`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None:  # a failed write names no file
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
