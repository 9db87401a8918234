"""A judge's counters (calls, failures, cache hits, latency) and the failure window that stops a
run whose judge keeps failing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields


@dataclass
class JudgeStats:
    """Counters since the last reset: LLM calls, failed calls, texts re-asked and verdicts they
    recovered, calls cut by the time budget, missing verdicts, cache hits, regex, predicate and
    detector verdicts, regexes that ran past their time budget, latency; and the requests a chat
    model really got (retries and re-asks included) with their characters each way
    (`usage.CountedChat`)."""

    calls: int = 0
    failed_calls: int = 0
    reasked: int = 0
    """Texts asked again because a verdict failed (`JudgeConfig.reasks`)."""
    recovered: int = 0
    """Verdicts the re-asking gave that the first call had failed."""
    timed_out: int = 0
    failures: int = 0
    cache_hits: int = 0
    lexical: int = 0
    predicate: int = 0
    detector: int = 0
    regex_timeouts: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0
    requests: int = 0
    prompt_chars: int = 0
    reply_chars: int = 0

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        out = {f"{prefix}{f.name}": float(getattr(self, f.name))
               for f in fields(self) if f.name != "latency_sum"}
        out[f"{prefix}latency_mean"] = self.latency_sum / self.calls if self.calls else 0.0
        return out

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())


class FailureWindow:
    """Verdicts asked and failed over the last `window` judged steps (steps that asked any), and
    the reason to stop a run whose judge fails more than `max_rate` of them. (The loop keeps one
    of rollouts scored and left out too: `max_left_out_rate`.)"""

    def __init__(self, max_rate: float | None, window: int):
        self.max_rate = max_rate
        self.steps: deque[tuple[int, int]] = deque(maxlen=window)  # (failed, asked)

    def add(self, failed: int, asked: int) -> None:
        if asked:
            self.steps.append((failed, asked))

    def over_limit(self) -> tuple[int, int] | None:
        """(failed, asked) over the window when it is full and more than `max_rate` failed, else None."""
        if self.max_rate is None or len(self.steps) < (self.steps.maxlen or 0):
            return None
        failed, asked = (sum(x) for x in zip(*self.steps))
        return (failed, asked) if failed > self.max_rate * asked else None

    def stop_reason(self, setting: str, last_error: str | None) -> str | None:
        """One line when the window is full and too many failed (`setting` names the knob), else None."""
        if (over := self.over_limit()) is None:
            return None
        failed, asked = over
        return (f"the judge failed {failed} of {asked} verdicts ({failed / asked:.0%}) over the last "
                f"{len(self.steps)} judged steps, more than {setting}={self.max_rate}; "
                f"last error: {last_error or 'none recorded'}")
