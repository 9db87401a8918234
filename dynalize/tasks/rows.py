"""What every task-data reader returns and raises: `Row`s (a record and where it came from) and
`DataError`, one line naming the file, the row and the field (dynalize.tasks.data, .hub)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


class DataError(ConfigError):
    """Bad or missing task data: the message is one line naming the file (and row, and field)."""


@dataclass
class Row:
    """One record and where it came from (for error messages)."""

    data: dict[str, Any]
    where: str

    def fail(self, problem: str) -> DataError:
        """A DataError about this row."""
        return DataError(f"data error: {self.where}: {problem}")


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
