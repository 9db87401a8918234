"""Penalty regexes are untrusted input (a proposer LLM writes them): every one runs through here,
with its cost bounded, in the proposer's checks, the lexical proposer and the judge alike.

The engine is the `regex` package (`re`'s syntax; it comes with transformers). Its matcher
stops at a `timeout` and, with `concurrent=True`, releases the GIL while it runs, so a match
can run in a worker thread without freezing the event loop. It also sidesteps much of `re`'s
backtracking: `(a+)+$` and `(?i)(\\w+\\s?)+\\?\\s*$`, which take `re` seconds on a 30-character
reply, take it microseconds; what it cannot sidestep (`(a|aa)+$`) stops at the limit. Rejected
alternatives: refusing nested quantifiers statically refuses good patterns (the lexical length
penalty `(?:\\S+\\s+){L}` is one) and misses bad ones (overlapping alternatives); a worker
process per match costs a process start per reply and a kill to stop; `re` in a thread cannot
be stopped at all and keeps a core and the GIL.

Limits (constants, far above what a useful pattern needs):
- a pattern: at most `MAX_PATTERN_CHARS` characters, and the product of its counted repeats'
  lower bounds (`{n}`, `{n,}`, `{n,m}`) at most `MAX_REPEAT_PRODUCT` (`regex` unrolls them when
  compiling: `(?:a{1000}){1000}` alone takes seconds and grows with each level);
- a match: `MATCH_TIMEOUT` seconds on one text, and `PASS_BUDGET` seconds over all the texts
  of one pass (a judge step, a proposer's check), so a pattern slow on every reply cannot add
  up either. Past either limit `RegexTimeout` is raised; callers count it and set the pattern
  aside (see docs/penalties.md, "Failure policy").
Seconds are CPU seconds of the thread that matches: neither other processes (a loaded machine)
nor other threads of this one (generation, training) can make a good pattern look slow. (The
engine's own clock counts the whole process's CPU time, so a timeout it reports while other
threads are busy is retried with this thread's time left.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import regex

MAX_PATTERN_CHARS = 500
"""Longest pattern accepted."""
MAX_REPEAT_PRODUCT = 10_000
"""Largest product of the lower bounds of a pattern's counted repeats."""
MATCH_TIMEOUT = 0.1
"""Seconds one match may take on one text (a useful pattern needs well under a millisecond)."""
PASS_BUDGET = 1.0
"""Seconds one pattern may take over all the texts of one pass."""

_REPEAT = regex.compile(r"(?<!\\)\{(\d+)(?:,\d*)?\}")
_MAX_ATTEMPTS = 20


class RegexTimeout(TimeoutError):
    """A pattern ran past `MATCH_TIMEOUT` on one text or past its pass budget."""


def regex_error(pattern: Any) -> str | None:
    """Why `pattern` cannot be a penalty's regex, or None: not a string, too long, too many
    unrolled repeats, does not compile, or matches the empty text (it would flag every reply)."""
    if not isinstance(pattern, str):
        return f"not a string but a {type(pattern).__name__}"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    product = 1
    for m in _REPEAT.finditer(pattern):
        product *= max(1, int(m.group(1)))
    if product > MAX_REPEAT_PRODUCT:
        return f"counted repeats unroll to more than {MAX_REPEAT_PRODUCT} copies"
    try:
        compiled = _compile(pattern)
    except (regex.error, TypeError, ValueError, OverflowError, RecursionError) as e:
        return f"does not compile: {e}"
    try:
        if compiled.search("", timeout=MATCH_TIMEOUT):
            return "matches the empty text"
    except TimeoutError:
        return "too slow on the empty text"
    return None


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


class SafeRegex:
    """A checked penalty regex whose matches stop at a time limit (raises `UnsafeRegex` if the
    pattern fails `regex_error`)."""

    def __init__(self, pattern: str):
        problem = regex_error(pattern)
        if problem:
            raise UnsafeRegex(pattern, problem)
        self.pattern = pattern
        self._rx = _compile(pattern)

    def search(self, text: str, timeout: float = MATCH_TIMEOUT) -> bool:
        """Whether the pattern occurs in `text`; `RegexTimeout` past `timeout` seconds."""
        return self._limited(lambda t: self._rx.search(text, timeout=t, concurrent=True) is not None, text, timeout)

    def spans(self, text: str, timeout: float = MATCH_TIMEOUT) -> list[tuple[int, int]]:
        """The (start, end) of every match in `text`; `RegexTimeout` past `timeout` seconds."""
        return self._limited(lambda t: [m.span() for m in self._rx.finditer(text, timeout=t, concurrent=True)],
                             text, timeout)

    def _limited(self, run: Callable[[float], Any], text: str, limit: float) -> Any:
        """`run(engine_timeout)` within `limit` CPU seconds of this thread (module docstring); it
        gives up once this thread has spent half the limit, so a match costs it at most `limit`."""
        spent = 0.0
        for _ in range(_MAX_ATTEMPTS):
            t0 = time.thread_time()
            try:
                return run(max(limit - spent, 1e-4))
            except TimeoutError:
                spent += time.thread_time() - t0
                if spent >= limit / 2:
                    break
        raise RegexTimeout(f"regex {self.pattern!r} ran past {limit:.3g}s on a text of {len(text)} chars")

    def search_all(self, texts: Iterable[str], budget: float = PASS_BUDGET) -> list[bool]:
        """`search` on each text, `budget` seconds for them all (`RegexTimeout` past it)."""
        return [bool(s) for s in self._each(self.search, texts, budget)]

    def spans_all(self, texts: Iterable[str], budget: float = PASS_BUDGET) -> list[list[tuple[int, int]]]:
        """`spans` of each text, `budget` seconds for them all (`RegexTimeout` past it)."""
        return self._each(self.spans, texts, budget)

    def _each(self, fn: Any, texts: Iterable[str], budget: float) -> list[Any]:
        out = []
        deadline = time.thread_time() + budget
        for text in texts:
            left = deadline - time.thread_time()
            if left <= 0:
                raise RegexTimeout(f"regex {self.pattern!r} ran past its budget of {budget:.3g}s")
            out.append(fn(text, min(MATCH_TIMEOUT, left)))
        return out

    def __repr__(self) -> str:
        return f"SafeRegex({self.pattern!r})"


class UnsafeRegex(ValueError):
    """A pattern that cannot be a penalty's regex; `reason` says why."""

    def __init__(self, pattern: Any, reason: str):
        super().__init__(f"regex {pattern!r}: {reason}")
        self.pattern, self.reason = pattern, reason
