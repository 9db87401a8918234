"""The monitor's input errors: one line each, exit status 2 (`python -m dynalize.monitor`)."""

from __future__ import annotations

from ..tasks.data import DataError


class MonitorInputError(DataError):
    """Rollouts the monitor cannot read; the message is one line naming the file (and row)."""


class NotYetError(MonitorInputError):
    """The rollouts are not there yet (no such path, no rollout file, no complete row):
    `--follow` waits for them, a one-off monitor stops with this line."""
