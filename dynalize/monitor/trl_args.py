"""What a TRL `GRPOTrainer` run says about its reward: the reward functions' names and weights,
and which columns of its completions table they weigh.

TRL's completions table (`completions/completions_NNNNN.parquet`) holds one column per reward
function, then the columns reward functions log with `log_extra`, then `advantage`; the trainer
sums the reward functions' columns weighted by `GRPOConfig.reward_weights` (None: all 1). The
names are in each checkpoint's `trainer_state.json` (`rewards/<name>/mean` in its log history),
the weights in `training_args.bin` (the pickled `GRPOConfig`, in the output folder and in each
checkpoint). That pickle is read without running any of its code: every class it names is
replaced by an inert record of its fields, so nothing is imported and nothing executes.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import MonitorInputError


@dataclass
class TrlRewardSettings:
    """What the run's own files say (None where they do not say it)."""

    names: list[str] | None = None
    """The reward functions' columns (in the log's order, which is sorted: the table's column
    order is the trainer's)."""
    weights: list[float] | None = None
    """`reward_weights`, one per reward function (an explicit None in the run's args reads as all 1)."""
    weights_set: bool = False
    """Whether a `training_args.bin` was read (then `weights` None means all 1)."""
    finished_at: int | None = None
    """The last step, when a `trainer_state.json` says training reached `max_steps` (the trainer
    saves one at its end): no later completions will come."""
    source: str = ""
    """The files read, for messages."""


class _Fields:
    """An inert stand-in for any class a pickle names: it keeps the fields it is given."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.state = args, {}

    def __setstate__(self, state: Any) -> None:
        self.state = state if isinstance(state, dict) else {"state": state}


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Fields,), {})  # never imports `module`

    def persistent_load(self, pid: Any) -> None:  # tensor storages: not needed
        return None


def read_training_args(path: Path) -> dict[str, Any] | None:
    """The fields of a `torch.save`d TrainingArguments (a zip holding `*/data.pkl`), or None
    when the file is not one."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
            if name is None:
                return None
            obj = _InertUnpickler(z.open(name)).load()
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError,
            AttributeError, IndexError, KeyError):
        return None
    return obj.state if isinstance(obj, _Fields) and isinstance(obj.state, dict) else None


def _step_of(folder: Path) -> int:
    m = re.fullmatch(r"checkpoint-(\d+)", folder.name)
    return int(m.group(1)) if m else -1


def trl_reward_settings(output_dir: Path) -> TrlRewardSettings:
    """The reward names and weights that `output_dir` (a GRPOTrainer's output folder) records,
    and whether its training finished: the `trainer_state.json` of the folder or of its newest
    checkpoint, and `training_args.bin` of the folder or of its newest checkpoint."""
    out = TrlRewardSettings()
    checkpoints = sorted((p for p in output_dir.glob("checkpoint-*") if p.is_dir() and _step_of(p) >= 0),
                         key=_step_of, reverse=True)
    read: list[str] = []
    for folder in [output_dir] + checkpoints:  # the first readable state: the end's, else the newest checkpoint's
        state = folder / "trainer_state.json"
        try:
            saved = json.loads(state.read_text(encoding="utf-8"))
            history = [e for e in saved.get("log_history") or [] if isinstance(e, dict)]
            step, last = saved.get("global_step"), saved.get("max_steps")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(step, int) and isinstance(last, int) and 0 < last <= step:
            out.finished_at = step
        names = list(dict.fromkeys(m.group(1) for e in history for k in e
                                   if (m := re.fullmatch(r"rewards/(.+)/mean", k))))
        out.names = names or None
        read.append(str(state))
        break
    for path in [output_dir / "training_args.bin"] + [c / "training_args.bin" for c in checkpoints]:
        if path.is_file() and (fields := read_training_args(path)) is not None:
            weights = fields.get("reward_weights")
            if weights is None or (isinstance(weights, list) and all(isinstance(w, int | float) for w in weights)):
                out.weights = None if weights is None else [float(w) for w in weights]
                out.weights_set = True
                read.append(str(path))
                break
    out.source = ", ".join(read)
    return out


def _weights(run: TrlRewardSettings, flag: list[float] | None) -> list[float] | None:
    """The weights: `--reward-weights`, else the run's (None: not known); both must agree."""
    if flag is not None and run.weights_set and run.weights is not None and flag != run.weights:
        raise MonitorInputError(f"monitor: --reward-weights {','.join(map(str, flag))} differs from the run's "
                                f"reward_weights {run.weights} ({run.source}): leave the flag out")
    if flag is not None:
        return flag
    if run.weights_set:
        return run.weights if run.weights is not None else ([1.0] * len(run.names) if run.names else None)
    return None


def reward_columns(run: TrlRewardSettings, flag: list[float] | None, keys: list[str], after: list[str],
                   where: str) -> list[tuple[str, float]]:
    """(column, weight) of each reward function of a completions table with columns `keys`,
    `after` those between `completion` and `advantage`: the names the run's files give, else
    the first len(weights) of `after` (TRL writes the reward functions' columns before the
    log_extra ones), else the one column there is; otherwise one line asking for the weights."""
    names, weights = run.names, _weights(run, flag)
    if names is not None:
        missing = [n for n in names if n not in keys]
        if missing:
            raise MonitorInputError(f"monitor: {where}: no column for the reward function(s) "
                                    f"{', '.join(missing)} that {run.source} names")
        names = [k for k in keys if k in set(names)]  # the trainer's order (the log's keys are sorted)
        if weights is None and len(names) > 1:
            raise MonitorInputError(f"monitor: {where}: the run's reward functions are {', '.join(names)} "
                                    f"({run.source}) but no readable training_args.bin says their weights: "
                                    f"pass --reward-weights W1,W2,... (1 each by default)")
    elif weights is not None:
        names = after[: len(weights)]
    elif len(after) == 1:
        names, weights = after, [1.0]
    else:
        raise MonitorInputError(
            f"monitor: {where}: cannot tell the reward functions' columns from log_extra columns among "
            f"{', '.join(after) or '(none)'}: no training_args.bin or checkpoint says them; pass "
            f"--reward-weights W1,W2,... (the run's reward_weights, one per reward function, 1 each by default) "
            f"or --column reward=NAME")
    weights = weights if weights is not None else [1.0] * len(names)
    if len(weights) != len(names):
        raise MonitorInputError(f"monitor: {len(weights)} reward weight(s) for {len(names)} reward function "
                                f"column(s) ({', '.join(names)}) in {where}")
    return list(zip(names, weights))
