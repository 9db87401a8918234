"""An anyio event loop in a daemon thread of its own: where the penalty term lives in a TRL run.

TRL calls reward functions synchronously from its training loop; the penalty term is async and
starts its proposals in a task group that outlives the call. The loop thread holds that task
group, so a proposal keeps running while TRL trains the next steps (the lexical proposer's
permutation tests run in a worker thread of that loop). The thread is a daemon: a training
script that crashes is never kept alive by it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


class Background:
    """`call(fn, *args)` runs `fn` (sync or async) on the loop and returns its result; `tg` is the
    loop's long-lived task group (proposals are started in it)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._portal: BlockingPortal | None = None
        self.tg: anyio.abc.TaskGroup | None = None
        self._stop: anyio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dynalize-penalties", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - handed to the thread that started us
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        async with BlockingPortal() as portal, anyio.create_task_group() as tg:
            self._portal, self.tg, self._stop = portal, tg, anyio.Event()
            self._ready.set()
            await self._stop.wait()
            tg.cancel_scope.cancel()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._portal is not None
        return self._portal.call(fn, *args)

    def close(self) -> None:
        """Cancel whatever still runs on the loop and end the thread."""
        if self._portal is None or not self._thread.is_alive():
            return
        stop = self._stop
        assert stop is not None
        self._portal.call(stop.set)
        self._thread.join(timeout=30)
        self._portal = None
