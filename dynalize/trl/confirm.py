"""Confirmation inside a TRL run (issue 57; docs/penalties.md, "Confirmation inside a run"): the
script's reward functions score replies edited to remove or add a candidate's pattern.

The reward before penalties of a TRL run is `Σ reward_weights · f(...)` over the script's
functions; `TrlRewardFunctions` is that sum as a dynalize reward term (rewards.functions), so the
run's own confirmation machinery (rewards.rescore.confirm_in_run: the Rescorer, the witness) calls
the functions on edited copies of the step's completions exactly as TRL calls them: the prompt as
TRL gave it, the completion in TRL's form (text, or `[{"role": "assistant", ...}]`), the row's
other columns (gathered from every process with the completions), and TRL's own `trainer_state`.

The functions are called again from the proposal (in the penalties' background thread, on the
main process only) while TRL may be calling them for the next step: each call, TRL's and the
confirmation's, holds one lock (`locked`), so a function is never run by two threads at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from ..rewards.functions import FunctionsTerm, RewardFunction
from ..types import Batch


def locked(fn: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    """`fn`, called under `lock`; its signature kept (what it names decides what it is passed)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return fn(*args, **kwargs)
    return call


class TrlRewardFunctions(FunctionsTerm):
    """The script's reward functions, weighted as TRL weights them, as the reward confirmation
    scores edited replies with; `trainer_state` is TRL's latest (`state`, set at each step)."""

    def __init__(self, functions: list[tuple[str, Callable[..., Any], float]], lock: threading.Lock):
        names = [name if [n for n, _, _ in functions[:i]].count(name) == 0 else f"{name}#{i + 1}"
                 for i, (name, _, _) in enumerate(functions)]  # TRL allows two of a name; errors tell them apart
        super().__init__([RewardFunction(n, locked(fn, lock), weight) for n, (_, fn, weight) in zip(names, functions)],
                         steps=0)
        self.state: Any = None
        """TRL's `TrainerState` of the latest step (the object TRL passes its reward functions)."""

    def trainer_state(self, batch: Batch) -> Any:
        return self.state
