"""What is generated when: each step's prompts, the in-order generation worker, and staleness.

Everything here is a pure function of the step (and the seed), so a run and its resume sample the
same prompts with the same seeds in the same order.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from .types import Prompt, Rollout


def derived_seed(*parts: Any) -> int:
    """A stable 63-bit seed from any values (for per-batch sampling, data order, masks)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class PromptOrder:
    """Batch k's prompts: consecutive slices of per-epoch seeded shuffles. A pure function of k."""

    def __init__(self, prompts: list[Prompt], per_step: int, seed: int):
        self.prompts, self.per_step, self.seed = prompts, per_step, seed

    def position(self, step: int) -> int:
        return step * self.per_step

    def batch(self, step: int) -> list[Prompt]:
        n = len(self.prompts)
        out = []
        for pos in range(self.position(step), self.position(step) + self.per_step):
            epoch, i = divmod(pos, n)
            order = list(range(n))
            random.Random(derived_seed(self.seed, "data", epoch)).shuffle(order)
            out.append(self.prompts[order[i]])
        return out


class Future:
    """A result that one task sets and others await."""

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        """The value of a finished job (raises its error, or RuntimeError while it runs)."""
        if not self.done:
            raise RuntimeError("the job has not finished")
        if self._error is not None:
            raise self._error
        return self._value

    async def wait(self) -> Any:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class GenerationWorker:
    """Runs generator jobs strictly in submission order (batches, weight pushes, evals)."""

    def __init__(self, tg: anyio.abc.TaskGroup):
        self._send, self._recv = anyio.create_memory_object_stream[tuple[Callable[[], Awaitable[Any]], Future]](math.inf)
        tg.start_soon(self._serve)

    def submit(self, job: Callable[[], Awaitable[Any]]) -> Future:
        fut = Future()
        self._send.send_nowait((job, fut))
        return fut

    async def _serve(self) -> None:
        async with self._recv:
            async for job, fut in self._recv:
                try:
                    fut.set(await job())
                except Exception as e:  # delivered to whoever awaits the job
                    fut.set(error=e)


def split_stale(groups: list[list[Rollout]], version: int, max_off_policy: int) -> tuple[list[list[Rollout]], int, Counter]:
    """Keep rollouts at most `max_off_policy` versions old; groups left with < 2 rollouts go too."""
    staleness = Counter(version - r.policy_version for g in groups for r in g)
    kept = [[r for r in g if version - r.policy_version <= max_off_policy] for g in groups]
    kept = [g for g in kept if len(g) >= 2]
    dropped = sum(len(g) for g in groups) - sum(len(g) for g in kept)
    return kept, dropped, staleness
