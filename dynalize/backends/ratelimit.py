"""Requests-per-minute and tokens-per-minute limits for hosted chat APIs.

Hosted APIs cap requests and tokens per minute and answer 429 past them; a run that keeps
hitting the cap wastes its retries and its time budget. `RateLimiter` keeps the start times of
the requests and the tokens of the finished ones over a sliding 60-second window and makes a
request wait until both are under their limits. Tokens are counted from each reply's `usage`
(prompt + completion), so a request is let through while the tokens of the last minute are under
the limit and its own count is known only once it is answered. The clock and the sleep are
injectable: what the limiter decides can be tested without waiting.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

WINDOW_S = 60.0


class RateLimiter:
    """At most `requests_per_minute` request starts and `tokens_per_minute` tokens in any 60 s (None: no limit)."""

    def __init__(self, requests_per_minute: float | None = None, tokens_per_minute: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = anyio.sleep):
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        self.clock, self.sleep = clock, sleep
        self.starts: deque[float] = deque()
        self.tokens: deque[tuple[float, int]] = deque()
        self.waited_s = 0.0
        """Seconds requests spent waiting for the limits, in all."""
        self._lock: anyio.Lock | None = None

    def wait_time(self, now: float) -> float:
        """Seconds from `now` until one more request may start (0: at once)."""
        while self.starts and self.starts[0] <= now - WINDOW_S:
            self.starts.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.tokens.popleft()
        wait = 0.0
        if self.rpm is not None and len(self.starts) >= self.rpm:
            oldest = self.starts[len(self.starts) - int(self.rpm)]  # the start that must leave the window
            wait = max(wait, oldest + WINDOW_S - now)
        if self.tpm is not None:
            used = sum(n for _, n in self.tokens)
            for t, n in self.tokens:  # wait until enough of the oldest tokens leave the window
                if used < self.tpm:
                    break
                used -= n
                wait = max(wait, t + WINDOW_S - now)
        return wait

    async def acquire(self) -> None:
        """Wait until a request may start, then count it as started."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # one decision at a time: concurrent calls see each other's starts
            while (wait := self.wait_time(self.clock())) > 0:
                self.waited_s += wait
                await self.sleep(wait)
            self.starts.append(self.clock())

    def spent(self, tokens: int) -> None:
        """Count the tokens a finished request used (its `usage`)."""
        if tokens > 0:
            self.tokens.append((self.clock(), tokens))
