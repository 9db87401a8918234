"""saferegex: untrusted penalty regexes are checked once and every match stops at its time limit."""

import time

import pytest

from dynalize.judge.saferegex import MAX_PATTERN_CHARS, RegexTimeout, SafeRegex, UnsafeRegex, regex_error

# `regex` backtracks on these (overlapping alternatives); each step down the string doubles the work
EXPONENTIAL = r"(a|aa)+$"
STALLS = "a" * 60 + "!"


@pytest.mark.parametrize("pattern, why", [
    (["x"], "not a string"),
    (3, "not a string"),
    ("(unclosed", "does not compile"),
    ("x*", "matches the empty text"),
    ("a" * (MAX_PATTERN_CHARS + 1), "longer than"),
    ("(?:a{1000}){1000}", "unroll"),  # compiling alone would take seconds
    ("(?:(?:a{100}){100}){100}", "unroll"),
])
def test_unusable_patterns_are_refused_with_a_reason(pattern, why):
    assert why in (regex_error(pattern) or "")
    with pytest.raises(UnsafeRegex, match=why):
        SafeRegex(pattern)


def test_useful_patterns_pass():
    for pattern in [r"(?i)\bcertainly\b", r"\A\s*(?:\S+\s+){400}\S", r"\?[\s\"')\]*_]*\Z", r"a{3}\d{2,5}"]:
        assert regex_error(pattern) is None, pattern
    assert SafeRegex(r"(?i)\bcertainly\b").search("Certainly, friend.")
    assert SafeRegex(r"\bo\w").spans("an ox or two") == [(3, 5), (6, 8)]


@pytest.mark.timeout(60)
def test_catastrophic_backtracking_stops_at_the_limit():
    rx = SafeRegex(EXPONENTIAL)
    assert rx.search("aaa")  # fine where it matches
    with pytest.raises(RegexTimeout):
        rx.search(STALLS, timeout=0.05)
    with pytest.raises(RegexTimeout):
        rx.spans(STALLS, timeout=0.05)
    with pytest.raises(RegexTimeout):  # the pass budget: the texts together
        rx.search_all(["aaa", STALLS, "aa"], budget=0.05)


def test_patterns_that_stall_re_run_fast_here():
    """The issue's examples: `re` spends seconds on each reply, the `regex` engine none (no timeout)."""
    replies = ["a" * 23 + "!", "Is this what you wanted, friend"] * 8
    assert SafeRegex(r"(a+)+$").search_all(replies) == [False] * 16
    assert SafeRegex(r"(?i)(\w+\s?)+\?\s*$").search_all(replies + ["Why?"]) == [False] * 16 + [True]



def test_a_timeout_caused_by_other_threads_is_retried_one_caused_by_the_pattern_is_not():
    """The engine's clock is the whole process's CPU time: busy generation or training threads can
    run it out while this thread has barely started. The limit is this thread's own CPU time."""
    rx = SafeRegex("x")
    early = iter([TimeoutError, TimeoutError, "done"])

    def others_busy(timeout):  # the engine gives up at once, as if other threads had used the clock
        out = next(early)
        if out is TimeoutError:
            raise TimeoutError
        return out

    assert rx._limited(others_busy, "text", 0.05) == "done"

    def slow(timeout):  # this thread itself burns the time
        end = time.thread_time() + timeout
        while time.thread_time() < end:
            pass
        raise TimeoutError

    with pytest.raises(RegexTimeout):
        rx._limited(slow, "text", 0.05)
