"""TRL-style reward functions as one reward term (`reward_funcs`, weighted by `reward_weights`).

Each function is called as TRL's `GRPOTrainer` calls it, once per batch, one entry per rollout:

    f(prompts=[...], completions=[...], completion_ids=[...], **columns, trainer_state=state,
      log_extra=..., log_metric=...)

`prompts` are the dataset's prompts as the rows gave them (a string, or for conversational data
a list of `{"role", "content"}` messages); `completions` the policy's replies (a string, or for
conversational data `[{"role": "assistant", "content": reply}]`, every turn after the prompt in a
multi-turn rollout); `columns` every other column of the row (`answer`, `solution`, a test
case), one value per rollout. A function that takes no `**kwargs` gets only the arguments it
names. It returns one number per rollout, or None where it does not apply (TRL's convention).

The term's value is the weighted sum over the functions that gave a number (TRL's NaN-aware sum:
a None adds nothing); a rollout every function left out (and no other term scores) is unscored,
so its group is left out of the update (docs/reliability.md). Each function's raw scores are
recorded per rollout (`rewards: {name: score or null}`) and as metrics `rewards/<name>/mean` and
`rewards/<name>/std` (over the rollouts it scored; std with Bessel's correction, as TRL).

Nothing a function does can change what the run trains or records as its own: its scores are read
strictly (dynalize/backends/scorecheck.py), a metric it logs goes under `user/` (`log_metric("step", 9)` is
`user/step`, never the row's `step`), and a data column named like an argument TRL passes
(`RESERVED_COLUMNS`: `completions` would replace the replies) is refused when the run starts.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..hooks import user_code
from ..backends.scorecheck import MAX_SCORE, as_number, checked_scores
from ..types import Batch, Prompt, Rollout
from .base import RewardTerm, TermScores

TRL_FIXED = ("prompt", "completion", "completion_ids")
"""Row columns TRL does not pass on as keyword arguments (the prompt and completion come as
`prompts` and `completions`)."""

RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                    "environments")
"""The arguments TRL's GRPOTrainer passes to a reward function besides the row's columns. A column of
one of these names would stand for the real argument: TRL 1.x either fails at the first reward call
(`prompts`, `completions`: "got multiple values for keyword argument") or drops the column without a
word (`completion_ids`, `trainer_state`, `log_extra`, `log_metric`, `environments`). dynalize refuses
such a column in one line when the run starts (`reserved_column`): rename it in the data."""

USER_METRICS = "user/"
"""The prefix of the metrics a reward function logs with `log_metric`: they can never replace a
field the run writes (`step`, `reward/mean`, `rewards/<name>/mean`)."""


def reserved_column(prompts: list[Prompt]) -> str | None:
    """One line naming the first row column (of a task's `meta["row"]`, tasks/prompts.py) that
    collides with an argument TRL passes to reward functions, or None."""
    for p in prompts:
        row = p.meta.get("row") if isinstance(p.meta.get("row"), dict) else {}
        if clash := next((c for c in row.get("columns") or {} if c in RESERVED_COLUMNS), None):
            return (f"config error: reward_funcs: the data has a column {clash!r} (prompt {p.id!r}), the name of an "
                    f"argument TRL passes to reward functions ({', '.join(RESERVED_COLUMNS)}): it would stand for "
                    f"the real one; rename the column")
    return None


@dataclass
class TrainerState:
    """What TRL's `trainer_state` offers a reward that shapes itself by progress: steps done and planned."""

    global_step: int
    max_steps: int


@dataclass
class RewardFunction:
    """One reward function of `reward_funcs`: its name (TRL's: the function's `__name__`), the
    function and its weight."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0


def function_name(fn: Any) -> str:
    """The name TRL logs a reward function under: its `__name__` (a callable object: its class's)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def trl_inputs(rollouts: list[Rollout]) -> dict[str, list[Any]]:
    """The batch as TRL's reward functions read it: prompts, completions, completion ids and the
    rows' other columns (a row missing a column gives None). A task's row (`meta["row"]`: its
    `prompt` as given and its other `columns`, tasks/prompts.py) is passed as it is; any other
    task's prompt is its messages."""
    rows = [r.meta.get("row") if isinstance(r.meta.get("row"), dict) else {} for r in rollouts]  # tasks/prompts.py
    prompts, completions = [], []
    for r, row in zip(rollouts, rows):
        prompt = row.get("prompt", [m.to_dict() for m in r.messages])
        prompts.append(prompt)
        if isinstance(prompt, str):
            completions.append(r.text)
        else:
            completions.append([m.to_dict() for m in r.turns])
    out: dict[str, list[Any]] = {"prompts": prompts, "completions": completions,
                                 "completion_ids": [list(r.completion_ids) for r in rollouts]}
    columns = [row.get("columns") or {} for row in rows]
    for k in dict.fromkeys(k for c in columns for k in c if k not in TRL_FIXED):
        if k in RESERVED_COLUMNS:  # refused at the start (reserved_column); never over the real argument
            raise ConfigError(reserved_column([Prompt(r.prompt_id, [], r.meta) for r in rollouts]) or k)
        out[k] = [c.get(k) for c in columns]
    return out


def _call_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """All of `kwargs` for a function with `**kwargs` (as TRL's are), else the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in named}


def weighted_sum(got: list[tuple[float, float]], step: int) -> float:
    """Σ weight · score of one rollout; ConfigError when the weights carry it past ±MAX_SCORE."""
    total = math.fsum(w * s for w, s in got) if all(abs(w * s) <= MAX_SCORE for w, s in got) else math.inf
    if not abs(total) <= MAX_SCORE:
        raise ConfigError(f"config error: reward_weights: the weighted sum of the reward functions' scores at step "
                          f"{step} is beyond ±{MAX_SCORE:.0e} (weights × scores {[w * s for w, s in got]}): use "
                          f"smaller weights")
    return total


class UserMetrics:
    """What reward functions log with `log_metric` in one step: each name under `user/`, the mean
    of the values logged (TRL averages them too); a NaN is left out (TRL's "no value this batch"),
    anything else that is not a finite number is one line."""

    def __init__(self, step: int):
        self.step, self.values = step, defaultdict(list)

    def log(self, name: Any, value: Any) -> None:
        x = as_number(value)
        if x is None or math.isinf(x):
            raise ConfigError(f"log_metric({str(name)[:40]!r}, {str(value)[:40]!r}) at step {self.step}: the value "
                              f"must be a finite number")
        if not math.isnan(x):
            self.values[f"{USER_METRICS}{name}"].append(x)

    def means(self) -> dict[str, float]:
        return {k: statistics.fmean(v) for k, v in self.values.items()}


class FunctionsTerm(RewardTerm):
    """`scores["reward_funcs"]`: Σ weight · f(...) over the functions that scored the rollout.

    `alone`: no other term scores the run, so a rollout no function scored has no reward at all
    (unscored); with an RM or the rubric term beside it, it keeps theirs. `steps`: the run's
    length, TRL's `trainer_state.max_steps`.
    """

    name = "reward_funcs"

    def __init__(self, functions: list[RewardFunction], *, steps: int, alone: bool = True):
        names = [f.name for f in functions]
        if dup := next((n for n in names if names.count(n) > 1), None):
            raise ConfigError(f"config error: reward_funcs: two reward functions are named {dup!r} (metrics and "
                              f"rollouts name each function by its __name__): rename one")
        self.functions, self.steps, self.alone = functions, steps, alone
        self._metrics: dict[str, float] = {}

    @property
    def rescorable(self) -> bool:  # type: ignore[override]
        return self.not_rescorable() is None

    def not_rescorable(self) -> str | None:
        """A function that names `completion_ids` reads tokens an edited reply does not have."""
        for f in self.functions:
            try:
                named = "completion_ids" in inspect.signature(f.fn).parameters
            except (TypeError, ValueError):
                named = False
            if named:
                return (f"reward function {f.name!r} reads completion_ids, which a reply edited to confirm a "
                        f"penalty does not have")
        return None

    async def rescore(self, batch: Batch) -> list[float]:
        """Σ weight · f(...) of each edited rollout, the functions called as `score` calls them
        (what they log is dropped; an edited reply's `completion_ids` are empty): rewards.rescore."""
        per, _, _ = await self._scores(batch, "replies edited to confirm a penalty")
        return [weighted_sum([(f.weight, per[f.name][i]) for f in self.functions if per[f.name][i] is not None],
                             batch.step + 1) for i in range(len(batch.rollouts))]

    async def _scores(self, batch: Batch, label: str | None = None
                      ) -> tuple[dict[str, list[float | None]], dict[str, list[Any]], UserMetrics]:
        """Each function's scores of `batch` (None where it gave none), what they logged with
        `log_extra` and `log_metric`. `label` names the batch in errors (default: its step)."""
        rollouts = batch.rollouts
        step = batch.step + 1  # batch k is step k + 1, as every output counts
        user = UserMetrics(step)
        extra: dict[str, list[Any]] = {}
        base = {**trl_inputs(rollouts), "trainer_state": self.trainer_state(batch),
                "log_extra": lambda column, values: extra.setdefault(str(column), []).extend(values),
                "log_metric": user.log}
        per: dict[str, list[float | None]] = {}
        for f in self.functions:
            where = f"({label})" if label else f"at step {step}"
            per[f.name] = checked_scores(await self._call(f, base, label or f"the batch of step {step}"),
                                         len(rollouts), f"reward function {f.name!r} {where}")
        return per, extra, user

    async def score(self, batch: Batch) -> TermScores:
        rollouts = batch.rollouts
        step = batch.step + 1  # batch k is step k + 1, as every output counts
        per, extra, user = await self._scores(batch)
        metrics = user.means()
        values, info, unscored = [], [], []
        for i in range(len(rollouts)):
            got = [(f.weight, per[f.name][i]) for f in self.functions if per[f.name][i] is not None]
            values.append(weighted_sum(got, step))
            unscored.append(self.alone and not got)
            info.append({"rewards": {f.name: per[f.name][i] for f in self.functions},
                         **({"reward_extra": {k: v[i] for k, v in extra.items() if i < len(v)}} if extra else {})})
        for f in self.functions:
            given = [s for s in per[f.name] if s is not None]
            if given:
                metrics[f"rewards/{f.name}/mean"] = statistics.fmean(given)
                metrics[f"rewards/{f.name}/std"] = statistics.stdev(given) if len(given) > 1 else 0.0
            metrics[f"rewards/{f.name}/none_frac"] = 1 - len(given) / len(rollouts) if rollouts else 0.0
        self._metrics = metrics
        return TermScores(values, info, unscored=unscored if any(unscored) else None)

    def trainer_state(self, batch: Batch) -> Any:
        """What the functions get as `trainer_state` when they score `batch`."""
        return TrainerState(batch.step, self.steps)

    async def _call(self, f: RewardFunction, base: dict[str, Any], where: str) -> Any:
        """`f.fn` called as TRL calls it (awaited when it is a coroutine function); its errors named
        with `where` (the batch it scores)."""
        with user_code(f"reward function {f.name!r} ({where})", "score"):
            out = f.fn(**_call_kwargs(f.fn, base))
            return await out if inspect.isawaitable(out) else out

    def metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out
