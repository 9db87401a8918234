"""`--reward`: the reward the monitored run trained against, so the monitor can confirm a pattern
by scoring edited replies with it (penalties.witness).

Two forms:
- `module:function`: a reward function with TRL's signature, `f(prompts, completions, **kwargs)
  -> list[float]` (dynalize's reward functions have the same, dynalize/rewards/functions.py),
  imported with the current folder on the path. It is called with `prompts` (the user's message
  for a one-message prompt, else the conversation as the judge reads it) and `completions`
  (replies, as strings);
- `http://...` or `https://...`: an endpoint that takes POST `{"prompts": [...], "completions":
  [...]}` and answers a list of numbers, or `{"rewards": [...]}`; retried on a dropped connection
  or a 5xx (`RETRIES` tries).

Both are checked before anything is monitored (`preflight`: one reply scored), as the judge's
endpoint is; a reward that fails then, or later, stops the monitor with one line, never a silent
fallback to the correlational decision.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from ..penalties.witness import RewardError, RewardFn
from .readers import MonitorInputError

RETRIES = 3
TIMEOUT_S = 120.0
PREFLIGHT = (["Say hello."], ["Hello."])


def load_reward(spec: str) -> RewardFn:
    """The reward `spec` names (module docstring); MonitorInputError in one line when it cannot be had."""
    if spec.startswith(("http://", "https://")):
        return http_reward(spec)
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise MonitorInputError(f"monitor: --reward expects module:function or an http(s):// URL, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise MonitorInputError(f"monitor: --reward {spec}: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise MonitorInputError(f"monitor: --reward {spec} is not a function")
    return function_reward(fn, spec)


def function_reward(fn: Any, where: str) -> RewardFn:
    """`fn` (TRL's reward signature) as a RewardFn whose answer is read strictly."""
    def reward(prompts: list[str], completions: list[str]) -> list[float]:
        return read_scores(fn(prompts=prompts, completions=completions), len(completions), where)
    return reward


def read_scores(raw: Any, n: int, where: str) -> list[float]:
    """`raw` as `n` finite numbers, or RewardError."""
    from ..backends.scorecheck import checked_scores
    from ..errors import ConfigError

    try:
        return [float(x) for x in checked_scores(raw, n, f"--reward {where}", allow_none=False)]
    except ConfigError as e:
        raise RewardError(str(e).removeprefix("config error: ")) from None


def http_reward(url: str) -> RewardFn:
    """An HTTP reward endpoint as a RewardFn (module docstring)."""
    import httpx
    from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

    def transient(e: BaseException) -> bool:
        return isinstance(e, httpx.TransportError) or (
            isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500)

    @retry(retry=retry_if_exception(transient), stop=stop_after_attempt(RETRIES),
           wait=wait_exponential(multiplier=0.5, max=8), reraise=True)
    def post(prompts: list[str], completions: list[str]) -> Any:
        r = httpx.post(url, json={"prompts": prompts, "completions": completions}, timeout=TIMEOUT_S)
        r.raise_for_status()
        return r.json()

    def reward(prompts: list[str], completions: list[str]) -> list[float]:
        try:
            raw = post(prompts, completions)
        except httpx.HTTPStatusError as e:
            raise RewardError(f"--reward {url}: HTTP {e.response.status_code} {e.response.reason_phrase}") from None
        except (httpx.HTTPError, ValueError) as e:
            raise RewardError(f"--reward {url}: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
        if isinstance(raw, dict):
            raw = raw.get("rewards")
        return read_scores(raw, len(completions), url)
    return reward


def preflight(reward: RewardFn, spec: str) -> None:
    """Score one reply before anything is monitored; MonitorInputError in one line if that fails."""
    try:
        reward(*PREFLIGHT)
    except RewardError as e:
        raise MonitorInputError(f"monitor: the reward failed its check (one reply scored): {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's function: any failure, in one line
        raise MonitorInputError(f"monitor: --reward {spec} failed its check (one reply scored): "
                                f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
