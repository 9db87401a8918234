"""A JSONL log read step by step: the monitor holds one step's rows, never the run's.

A plain or verl log of JSONL files (readers.jsonl_log) is read line by line from where the last
read of each file stopped (`LogTail`): a one-off invocation reads each line once, and `--follow`
reads at each poll only the bytes appended since the previous one, a last line without its
newline left for a later poll. Rows become steps as they come (`LogTail.steps`): a step is
complete once a row of a later step is read, or once the log ends (`flush`), so the log must list
its steps in order (the rows within a step in any order); a row of an earlier step is refused
with one line. Other formats (parquet, CSV, TRL, OpenRLHF tables) are read whole
(readers.read_source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..tasks.data import DataError, Row, jsonl_row, row_cap
from .errors import MonitorInputError
from .readers import MonitoredRollout, ReadOptions

Partial = Literal["strict", "try", "wait"]
"""A last line without its newline: read as any line (`strict`: the file is complete), taken when
it reads whole (`try`: the file stayed quiet over a poll), or left for a later poll (`wait`)."""


@dataclass
class Cursor:
    """How far one file was read: bytes and lines consumed, rows read."""

    offset: int = 0
    line: int = 0
    rows: int = 0


class LogTail:
    """The files of one JSONL log, each read from where the last read stopped, and the step whose
    rows are still coming (`pending`)."""

    def __init__(self, opts: ReadOptions, merge: int = 1):
        self.opts, self.merge = opts, merge
        self.cursors: dict[Path, Cursor] = {}
        self.pending_step: int | None = None
        self.pending: list[MonitoredRollout] = []
        self.last_step: int | None = None
        """The last step handed out (`steps`, `flush`)."""
        self.waiting: list[str] = []
        """One line per file whose newest part is not complete yet (the last read)."""

    def steps(self, files: list[Path], rollout: Callable[[Row], MonitoredRollout],
              partial: Partial) -> Iterator[tuple[int, list[MonitoredRollout]]]:
        """The steps that the rows appended to `files` since the last read complete, in order."""
        self.waiting = []
        for f in files:
            for row in self._rows(f, files, partial):
                yield from self._add(self._rollout(rollout, row))

    def flush(self) -> tuple[int, list[MonitoredRollout]] | None:
        """The step whose rows were still coming, now complete (the log ended); None if none."""
        if self.pending_step is None:
            return None
        done = (self.pending_step, self.pending)
        self.last_step, self.pending_step, self.pending = self.pending_step, None, []
        return done

    def _add(self, r: MonitoredRollout) -> Iterator[tuple[int, list[MonitoredRollout]]]:
        step = r.step - r.step % self.merge
        if self.last_step is not None and step <= self.last_step or \
                self.pending_step is not None and step < self.pending_step:
            after = self.pending_step if self.pending_step is not None else self.last_step
            raise MonitorInputError(f"monitor: {r.where}: a row of step {r.step} after the rows of step {after}: the "
                                    f"monitor reads a log one step at a time, in step order (sort the log by step)")
        if self.pending_step is not None and step > self.pending_step:
            done = self.flush()
            assert done is not None
            yield done
        self.pending_step = step
        self.pending.append(r)

    def _rollout(self, rollout: Callable[[Row], MonitoredRollout], row: Row) -> MonitoredRollout:
        try:
            return rollout(row)
        except DataError as e:
            raise MonitorInputError(f"monitor: {str(e).removeprefix('data error: ')}") from None

    def _rows(self, f: Path, files: list[Path], partial: Partial) -> Iterator[Row]:
        """The rows of `f` past its cursor. Growing (`partial` not `strict`), a file that holds no
        row yet is awaited while it is the newest; otherwise it is refused, as a whole read does."""
        cur = self.cursors.setdefault(f, Cursor())
        try:
            size = f.stat().st_size
            if size < cur.offset:
                raise MonitorInputError(f"monitor: {f} is shorter than when it was read ({size:,} < {cur.offset:,} "
                                        f"bytes): it was rewritten; monitor it into a new --out")
            with open(f, "rb") as fh:
                fh.seek(cur.offset)
                for raw in fh:
                    if not raw.endswith(b"\n") and partial != "strict":
                        if partial == "wait" or (row := self._try(f, cur, raw)) is None:
                            self.waiting.append(f"{f}: its last line is not complete yet (no newline)")
                            break
                    else:
                        row = self._line(f, cur, raw)
                    cur.offset += len(raw)
                    cur.line += 1
                    if row is not None:
                        cur.rows += 1
                        yield row
        except OSError as e:
            raise MonitorInputError(f"monitor: cannot read {e.filename or f}: {e.strerror or e}") from None
        if cur.rows == 0 and not any(w.startswith(f"{f}:") for w in self.waiting):
            if partial == "strict" or f != files[-1]:
                raise MonitorInputError(f"monitor: {f} has no rows")
            self.waiting.append(f"{f}: {f} has no rows (still being written?)")

    def _line(self, f: Path, cur: Cursor, raw: bytes) -> Row | None:
        """Line `cur.line + 1` of `f` as a row (None: blank), every problem one line naming it."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MonitorInputError(f"monitor: {f} is not UTF-8 text (line {cur.line + 1}, byte "
                                    f"{cur.offset + e.start})") from None
        if cur.offset == 0:
            text = text.removeprefix("\ufeff")
        try:
            with row_cap(self.opts.max_row_chars, setting="the monitor's --max-row-chars"):
                return jsonl_row(f, cur.line + 1, text.rstrip("\r\n"))
        except DataError as e:
            raise MonitorInputError(f"monitor: {str(e).removeprefix('data error: ')}") from None

    def _try(self, f: Path, cur: Cursor, raw: bytes) -> Row | None:
        """A last line without its newline as a row when it reads whole, else None (still being written)."""
        try:
            return self._line(f, cur, raw)
        except MonitorInputError:
            return None
