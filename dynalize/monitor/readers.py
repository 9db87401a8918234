"""Rollouts of any RL run, read into one shape: step, group, prompt, the policy's replies, reward.

Formats (`--format`, detected when `auto`):

- `plain`: JSONL, CSV or parquet files (or a folder of them), one rollout a row. Columns (names
  settable with `--column NAME=COLUMN`): `step`, `prompt` (text or chat messages), `completion`
  (text, or the policy's messages) or `messages` (the whole conversation: the prompt is what comes
  before the first assistant message), `reward`, and optionally `group` (rollouts of one prompt
  in one step; default: the prompt's text). A dynalize run's `rollouts/` folder reads as plain.
- `trl`: TRL's `GRPOTrainer` with `log_completions=True` writes `<output_dir>/completions/
  completions_NNNNN.parquet` (columns step, prompt, completion, one column per reward function,
  the reward functions' `log_extra` columns, advantage). The reward is the reward functions'
  columns weighted as the trainer weighs them (`reward_weights`, read from the run's
  training_args.bin and trainer_state.json when present, else `--reward-weights`; trl_args.py),
  unless `--column reward=NAME` names one column.
- `verl`: verl with `trainer.rollout_data_dir=DIR` writes `DIR/<step>.jsonl` (input, output,
  score, step, and extra reward infos); a group is the rollouts of one `input`.
- `openrlhf`: OpenRLHF logs one sample per step to W&B as the table `train/generated_samples`
  (global_step, text, reward), saved in the W&B run folder (`wandb/run-…`), under
  `media/table/train` of its `files`; each table file holds all earlier rows too, so the one of
  the highest W&B step (in its name) is read. `text` is prompt and reply decoded
  together. With one sample a step, the rows of a monitored step form one group: use
  `--merge-steps K` (K logged steps monitored as one) so that a group has replies to compare.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..tasks.data import MAX_ROW_CHARS, DataError, NoRowsError, Row, read_rows, row_cap
from ..types import Message
from .errors import MonitorInputError, NotYetError
from .trl_args import reward_columns, trl_reward_settings

__all__ = ["MonitorInputError", "NotYetError", "MonitoredRollout", "ReadOptions", "Reading", "by_step",
           "read_rollouts", "read_source"]

FORMATS = ("auto", "plain", "trl", "verl", "openrlhf")
COLUMNS = ("step", "prompt", "completion", "messages", "reward", "group")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
MAX_STEP = 10**12
"""The largest step the monitor takes: past any run's step count (a sample or token counter
logged as the step included), and exact as a float. A larger one is a broken log."""


@dataclass
class ReadOptions:
    """How the rollouts are read: the columns' names, TRL's reward weights, the row cap, and
    whether the files are still being written (`growing`: `--follow`)."""

    columns: dict[str, str] = field(default_factory=dict)
    reward_weights: list[float] | None = None
    """`--reward-weights`: TRL's `reward_weights` when the run's files do not say them."""
    max_row_chars: int = MAX_ROW_CHARS
    growing: bool = False
    """A last line without its newline is left out, and so is a newest parquet or W&B table file
    that cannot be read yet (its writer has not finished it): both are read at a later poll."""


@dataclass
class MonitoredRollout:
    """One rollout as the monitor sees it."""

    step: int
    group: str
    """Rollouts of one prompt in one step share it (advantage signs are taken within groups)."""
    prompt: list[Message]
    turns: list[Message]
    """Everything after the prompt: the policy's replies (and, multi-turn, the other turns)."""
    reward: float
    where: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def replies(self) -> list[str]:
        return [m.content for m in self.turns if m.role == "assistant"]


@dataclass
class Reading:
    """One read of the rollouts: what was read, from which files, and the files left for later."""

    rollouts: list[MonitoredRollout]
    files: list[Path]
    waiting: list[str] = field(default_factory=list)
    """One line per file whose newest part is not complete yet (growing reads only)."""
    final_step: int | None = None
    """The run's last step, when its files say training finished (TRL's trainer_state.json)."""


def detect_format(path: Path) -> str:
    """The format of `path` by what lies there (see the module docstring)."""
    if path.is_dir():
        if (path / "completions").is_dir() or any(path.glob("completions_*.parquet")):
            return "trl"
        if any(path.glob("**/generated_samples*.table.json")):
            return "openrlhf"
        files = [p for p in path.iterdir() if p.suffix == ".jsonl"]
        if files and all(p.stem.isdigit() for p in files):
            return "verl"
        return "plain"
    if path.name.endswith(".table.json"):
        return "openrlhf"
    if path.name.startswith("completions_") and path.suffix == ".parquet":
        return "trl"
    return "plain"


def data_files(path: Path, pattern: str = "*") -> list[Path]:
    """`path` itself, or the data files of a folder (and of its `rollouts/`, for a dynalize run),
    sorted by name; held-out files (`eval_*`) of a dynalize run are left out."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise _not_data(path) if path.exists() else NotYetError(f"monitor: no such file or folder: {path}")
    root = path / "rollouts" if (path / "rollouts").is_dir() else path
    files = sorted(p for p in root.glob(pattern) if p.is_file() and p.suffix in DATA_SUFFIXES
                   and not p.name.startswith("eval_"))
    if not files:
        raise NotYetError(f"monitor: {path} holds no rollout files ({', '.join(DATA_SUFFIXES)})")
    return files


def read_rollouts(path: str | Path, fmt: str = "auto", columns: dict[str, str] | None = None,
                  options: ReadOptions | None = None) -> list[MonitoredRollout]:
    """Every rollout under `path`, in file order. `columns` renames the plain format's columns."""
    opts = options or ReadOptions()
    if columns is not None:
        opts = replace(opts, columns=dict(columns))
    return read_source(Path(path), fmt, opts).rollouts


def read_source(path: Path, fmt: str, opts: ReadOptions) -> Reading:
    """The rollouts under `path` and the files they came from. Every problem is a
    MonitorInputError (one line); NotYetError when there is nothing to read yet."""
    if not path.exists():
        raise NotYetError(f"monitor: no such file or folder: {path}")
    if not (path.is_file() or path.is_dir()):
        raise _not_data(path)
    detected, fmt = fmt == "auto", detect_format(path) if fmt == "auto" else fmt
    given, cols = checked_columns(path, fmt, detected, opts)
    reading = Reading([], [])
    try:
        with row_cap(opts.max_row_chars, setting="the monitor's --max-row-chars"):
            if fmt == "plain":
                files = data_files(path)
                reading.rollouts = [_plain(r, cols) for f in files for r in _rows(f, files, opts, reading)]
            elif fmt == "trl":
                root = path / "completions" if (path / "completions").is_dir() else path
                files = data_files(root, "completions_*.parquet")
                weigh = _TrlReward(root.parent if root.name == "completions" else root, cols, given, opts)
                reading.rollouts = [weigh.rollout(r) for f in files for r in _rows(f, files, opts, reading)]
                reading.final_step = weigh.run.finished_at
            elif fmt == "verl":
                files = _verl_order(data_files(path, "*.jsonl"))
                reading.rollouts = [_plain(r, cols | _VERL | given) for f in files for r in _rows(f, files, opts, reading)]
            elif fmt == "openrlhf":
                files = _openrlhf_files(path)
                reading.rollouts = _openrlhf(files, cols | _OPENRLHF | given, opts, reading)
            else:
                raise MonitorInputError(f"monitor: unknown --format {fmt!r} (known: {', '.join(FORMATS)})")
    except MonitorInputError:
        raise
    except DataError as e:  # the task-data readers' line, as the monitor's own
        raise MonitorInputError(f"monitor: {str(e).removeprefix('data error: ')}") from None
    except OSError as e:
        raise MonitorInputError(f"monitor: cannot read {e.filename or path}: {e.strerror or e}") from None
    reading.files = files
    if not reading.rollouts:
        raise NotYetError(f"monitor: no complete rollout yet in {path}" + "".join(f"; {w}" for w in reading.waiting))
    return reading


def checked_columns(path: Path, fmt: str, detected: bool, opts: ReadOptions) -> tuple[dict[str, str], dict[str, str]]:
    """(the columns `--column` names, every column's name), once the options are checked for `fmt`."""
    given = dict(opts.columns)
    cols = {c: c for c in COLUMNS} | given
    unknown = set(cols) - set(COLUMNS)
    if unknown:
        raise MonitorInputError(f"monitor: --column: unknown name(s) {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(COLUMNS)})")
    if opts.reward_weights is not None and fmt != "trl":
        if detected and path.is_dir():
            data_files(path)  # a TRL folder before its first table reads as an empty plain one: not yet
        raise MonitorInputError(f"monitor: --reward-weights is for TRL runs (--format trl); {path} reads as {fmt}")
    return given, cols


def jsonl_log(path: Path, fmt: str, opts: ReadOptions) -> tuple[list[Path], Callable[[Row], MonitoredRollout]] | None:
    """A plain or verl log of JSONL files only, which the monitor reads line by line (stream.py):
    its files in reading order and how a row becomes a rollout; None for any other log (read
    whole) or one with no file yet (NotYetError)."""
    detected, fmt = fmt == "auto", detect_format(path) if fmt == "auto" else fmt
    if fmt not in ("plain", "verl"):
        return None
    given, cols = checked_columns(path, fmt, detected, opts)
    files = data_files(path, "*.jsonl" if fmt == "verl" else "*")
    if any(f.suffix != ".jsonl" for f in files):
        return None
    if fmt == "verl":
        return _verl_order(files), lambda r: _plain(r, cols | _VERL | given)
    return files, lambda r: _plain(r, cols)


def _verl_order(files: list[Path]) -> list[Path]:
    """verl's `<step>.jsonl` files by their step."""
    return sorted(files, key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0))


def _not_data(path: Path) -> MonitorInputError:
    """`path` exists but is neither a file nor a folder (a FIFO, a socket, a device)."""
    return MonitorInputError(f"monitor: {path} is not a file or a folder (a FIFO, a socket or a device): give the "
                             f"rollouts' file or folder")


def _rows(f: Path, files: list[Path], opts: ReadOptions, reading: Reading) -> list[Row]:
    """The rows of one file. Growing: a last line without its newline is left out, and the
    newest file, while it holds no complete row yet (or, for parquet, cannot be read yet), is
    left for a later poll; a line says so."""
    try:
        rows = read_rows(f, whole_lines_only=opts.growing)
    except DataError as e:
        if not opts.growing or f != files[-1] or not (isinstance(e, NoRowsError) or f.suffix == ".parquet"):
            raise
        reading.waiting.append(f"{f}: {str(e).removeprefix('data error: ')} (still being written?)")
        return []
    if opts.growing and f.suffix in (".jsonl", ".csv") and not _ends_a_line(f):
        reading.waiting.append(f"{f}: its last line is not complete yet (no newline)")
    return rows


def _ends_a_line(f: Path) -> bool:
    with open(f, "rb") as fh:
        fh.seek(0, 2)
        if fh.tell() == 0:
            return True
        fh.seek(-1, 2)
        return fh.read(1) == b"\n"


_VERL = {"prompt": "input", "completion": "output", "reward": "score"}
_OPENRLHF = {"step": "global_step", "completion": "text"}


def _get(row: Row, name: str, column: str, *, required: bool = True) -> Any:
    value = row.data.get(column)
    if required and (value is None or (isinstance(value, float) and math.isnan(value))):
        raise MonitorInputError(f"monitor: {row.where}: no {name!r} (column {column!r}; rename with "
                                f"--column {name}=COLUMN)")
    return value


def _number(row: Row, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise MonitorInputError(f"monitor: {row.where}: {name} is not a number: {str(value)[:40]!r}")
    try:
        x = float(value)
    except ValueError:
        raise MonitorInputError(f"monitor: {row.where}: {name} is not a number: {str(value)[:40]!r}") from None
    if not math.isfinite(x):
        raise MonitorInputError(f"monitor: {row.where}: {name} is not finite: {value!r}")
    return x


def _step(row: Row, value: Any) -> int:
    x = _number(row, "step", value)
    if not 0 <= x <= MAX_STEP or x != int(x):
        raise MonitorInputError(f"monitor: {row.where}: step must be a whole number from 0 to {MAX_STEP:,}, "
                                f"got {str(value)[:40]!r}")
    return int(x)


def _messages(row: Row, name: str, value: Any) -> list[Message]:
    """Chat messages from a list of {role, content} (or a JSON string of one), or plain text."""
    if isinstance(value, str) and value.lstrip().startswith("[{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(value, str):
        return [Message("user" if name == "prompt" else "assistant", value)]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        out = []
        for m in value:
            role = str(m.get("role") or ("user" if name == "prompt" else "assistant"))
            if role not in ("system", "user", "assistant"):
                role = "user"  # tool and other roles: context the policy answered
            out.append(Message(role, _text(m["content"])))  # type: ignore[arg-type]
        return out
    raise MonitorInputError(f"monitor: {row.where}: {name} is neither text nor a list of chat messages")


def _text(content: Any) -> str:
    """Message content as text (multimodal content lists keep their text parts)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _conversation(row: Row, cols: dict[str, str]) -> tuple[list[Message], list[Message]]:
    if row.data.get(cols["messages"]) is not None and row.data.get(cols["completion"]) is None:
        msgs = _messages(row, "messages", row.data[cols["messages"]])
        first = next((i for i, m in enumerate(msgs) if m.role == "assistant"), None)
        if first is None:
            raise MonitorInputError(f"monitor: {row.where}: messages hold no assistant message")
        return msgs[:first], msgs[first:]
    prompt = _messages(row, "prompt", _get(row, "prompt", cols["prompt"]))
    turns = _messages(row, "completion", _get(row, "completion", cols["completion"]))
    if not any(m.role == "assistant" for m in turns):
        turns = [Message("assistant", "\n\n".join(m.content for m in turns))]
    return prompt, turns


def _group(row: Row, cols: dict[str, str], prompt: list[Message]) -> str:
    value = row.data.get(cols["group"])
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return json.dumps([m.to_dict() for m in prompt], ensure_ascii=False)
    return str(value)


def _plain(row: Row, cols: dict[str, str]) -> MonitoredRollout:
    if "replies" in row.data and "scores" in row.data and cols["completion"] == "completion":
        return _dynalize(row)
    prompt, turns = _conversation(row, cols)
    return MonitoredRollout(_step(row, _get(row, "step", cols["step"])), _group(row, cols, prompt), prompt, turns,
                            _number(row, "reward", _get(row, "reward", cols["reward"])), row.where)


def _dynalize(row: Row) -> MonitoredRollout:
    """A line of a dynalize run's rollouts/step_NNNNNN.jsonl: the reward before penalties."""
    d = row.data
    prompt = _messages(row, "prompt", d.get("prompt") or [])
    turns = _messages(row, "completion", d.get("turns") or [{"role": "assistant", "content": r} for r in d["replies"]])
    scores = d.get("scores") or {}
    before = scores.get("rm", d.get("rm_score"))
    if before is None:
        before = _number(row, "reward", d.get("reward")) - float(scores.get("penalties", 0.0))
    return MonitoredRollout(_step(row, d.get("step")), f"{d.get('prompt_id')}#{d.get('group')}", prompt, turns,
                            _number(row, "reward", before), row.where)


class _TrlReward:
    """A TRL completions row as a rollout, its reward the weighted sum of the reward functions'
    columns only (never a `log_extra` column): names and weights from the run's files
    (trl_args.py), else `--reward-weights` (that many columns after `completion`: TRL writes the
    reward functions' columns first), else the one numeric column there is."""

    def __init__(self, output_dir: Path, cols: dict[str, str], given: dict[str, str], opts: ReadOptions):
        self.cols, self.given, self.opts = cols, given, opts
        self.run = trl_reward_settings(output_dir)
        self.chosen: list[tuple[str, float]] | None = None

    def columns(self, row: Row) -> list[tuple[str, float]]:
        """(column, weight) of each reward function, decided from the first row's columns: those
        between `completion` and `advantage` are the reward functions' and log_extra's."""
        keys = list(row.data)
        start = keys.index(self.cols["completion"]) + 1 if self.cols["completion"] in keys else 0
        end = keys.index("advantage") if "advantage" in keys else len(keys)
        skip = {self.cols[c] for c in ("step", "prompt", "completion", "messages", "group")}
        after = [k for k in keys[start:end] if k not in skip]
        return reward_columns(self.run, self.opts.reward_weights, keys, after, row.where)

    def rollout(self, row: Row) -> MonitoredRollout:
        cols = self.cols
        prompt, turns = _conversation(row, cols)
        if "reward" in self.given:
            reward = _number(row, "reward", _get(row, "reward", self.given["reward"]))
        else:
            self.chosen = self.chosen or self.columns(row)
            parts = []
            for c, w in self.chosen:
                v = row.data.get(c)
                if not (v is None or isinstance(v, float) and math.isnan(v)):  # TRL: NaN = not applied
                    parts.append(w * _number(row, f"reward column {c!r}", v))
            if not parts:
                raise MonitorInputError(f"monitor: {row.where}: every reward column is empty "
                                        f"({', '.join(c for c, _ in self.chosen)})")
            reward = float(sum(parts))
        return MonitoredRollout(_step(row, _get(row, "step", cols["step"])), _group(row, cols, prompt), prompt, turns,
                                reward, row.where)


def _table_step(path: Path) -> int:
    """The W&B step in a table file's name (`<key>_<step>_<hash>.table.json`); -1 when none."""
    m = re.search(r"_(\d+)_[0-9a-f]+\.table\.json$", path.name)
    return int(m.group(1)) if m else -1


def _openrlhf_files(path: Path) -> list[Path]:
    """W&B table files of `generated_samples`, by their step (not file time: a copy or a sync
    touches old files)."""
    files = [path] if path.is_file() else sorted(path.glob("**/generated_samples*.table.json"),
                                                 key=lambda p: (_table_step(p), p.name))
    if not files:
        raise NotYetError(f"monitor: {path} holds no W&B table generated_samples*.table.json")
    return files


def _openrlhf(files: list[Path], cols: dict[str, str], opts: ReadOptions, reading: Reading) -> list[MonitoredRollout]:
    newest = files[-1]  # each table holds every earlier row too
    try:
        table = json.loads(newest.read_text(encoding="utf-8"))
        names, data = list(table["columns"]), list(table["data"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        if opts.growing:  # W&B writes the file in place: read the table before it
            reading.waiting.append(f"{newest}: not a complete W&B table yet (still being written?)")
            return _openrlhf(files[:-1], cols, ReadOptions(), reading) if len(files) > 1 else []
        raise MonitorInputError(f"monitor: {newest} is not a W&B table file ({type(e).__name__})") from None
    out = []
    for i, values in enumerate(data):
        row = Row(dict(zip(names, values)), f"{newest} row {i}")
        text = str(_get(row, "completion", cols["completion"]))
        step = _step(row, _get(row, "step", cols["step"]))
        out.append(MonitoredRollout(step, "all", [], [Message("assistant", text)],
                                    _number(row, "reward", _get(row, "reward", cols["reward"])), row.where))
    return out


def by_step(rollouts: Iterable[MonitoredRollout], merge: int = 1) -> dict[int, list[MonitoredRollout]]:
    """Rollouts by monitored step, in increasing order, each step's rollouts in file order. With
    `merge` K > 1, logged steps k·K … k·K + K − 1 are monitored as one step numbered k·K."""
    out: dict[int, list[MonitoredRollout]] = {}
    for r in rollouts:
        out.setdefault(r.step - r.step % merge, []).append(r)
    return dict(sorted(out.items()))
