"""Rollouts of any RL run, read into one shape: step, group, prompt, the policy's replies, reward.

Formats (`--format`, detected when `auto`):

- `plain`: JSONL, CSV or parquet files (or a folder of them), one rollout a row. Columns (names
  settable with `--column NAME=COLUMN`): `step`, `prompt` (text or chat messages), `completion`
  (text, or the policy's messages) or `messages` (the whole conversation: the prompt is what comes
  before the first assistant message), `reward`, and optionally `group` (rollouts of one prompt
  in one step; default: the prompt's text). A dynalize run's `rollouts/` folder reads as plain.
- `trl`: TRL's `GRPOTrainer` with `log_completions=True` writes `<output_dir>/completions/
  completions_NNNNN.parquet` (columns step, prompt, completion, one column per reward function,
  extra columns, advantage). The reward is the sum of the numeric columns other than `step` and
  `advantage` unless `--column reward=NAME` names one.
- `verl`: verl with `trainer.rollout_data_dir=DIR` writes `DIR/<step>.jsonl` (input, output,
  score, step, and extra reward infos); a group is the rollouts of one `input`.
- `openrlhf`: OpenRLHF logs one sample per step to W&B as the table `train/generated_samples`
  (global_step, text, reward), saved in the W&B run folder (`wandb/run-…`), under `media/table/train` of its `files`; each table
  file holds all earlier rows too, so the newest is read. `text` is prompt and reply decoded
  together. With one sample a step, the rows of a monitored step form one group: use
  `--merge-steps K` (K logged steps monitored as one) so that a group has replies to compare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..tasks.data import DataError, Row, read_rows
from ..types import Message

FORMATS = ("auto", "plain", "trl", "verl", "openrlhf")
COLUMNS = ("step", "prompt", "completion", "messages", "reward", "group")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


class MonitorInputError(DataError):
    """Rollouts the monitor cannot read; the message is one line naming the file (and row)."""


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
        raise MonitorInputError(f"monitor: no such file or folder: {path}")
    root = path / "rollouts" if (path / "rollouts").is_dir() else path
    files = sorted(p for p in root.glob(pattern) if p.is_file() and p.suffix in DATA_SUFFIXES
                   and not p.name.startswith("eval_"))
    if not files:
        raise MonitorInputError(f"monitor: {path} holds no rollout files ({', '.join(DATA_SUFFIXES)})")
    return files


def read_rollouts(path: str | Path, fmt: str = "auto", columns: dict[str, str] | None = None) -> list[MonitoredRollout]:
    """Every rollout under `path`, in file order. `columns` renames the plain format's columns."""
    path = Path(path)
    if not path.exists():
        raise MonitorInputError(f"monitor: no such file or folder: {path}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    cols = {c: c for c in COLUMNS} | dict(columns or {})
    unknown = set(cols) - set(COLUMNS)
    if unknown:
        raise MonitorInputError(f"monitor: --column: unknown name(s) {', '.join(sorted(unknown))} "
                                f"(known: {', '.join(COLUMNS)})")
    if fmt == "plain":
        return [_plain(r, cols) for f in data_files(path) for r in read_rows(f)]
    if fmt == "trl":
        root = path / "completions" if (path / "completions").is_dir() else path
        return [_trl(r, cols, columns or {}) for f in data_files(root, "completions_*.parquet") for r in read_rows(f)]
    if fmt == "verl":
        files = sorted(data_files(path, "*.jsonl"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0))
        return [_plain(r, cols | _VERL | dict(columns or {})) for f in files for r in read_rows(f)]
    if fmt == "openrlhf":
        return _openrlhf(path, cols | _OPENRLHF | dict(columns or {}))
    raise MonitorInputError(f"monitor: unknown --format {fmt!r} (known: {', '.join(FORMATS)})")


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
    if x != int(x) or x < 0:
        raise MonitorInputError(f"monitor: {row.where}: step must be a whole number >= 0, got {value!r}")
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


def _trl(row: Row, cols: dict[str, str], given: dict[str, str]) -> MonitoredRollout:
    prompt, turns = _conversation(row, cols)
    if "reward" in given:
        reward = _number(row, "reward", _get(row, "reward", given["reward"]))
    else:
        skip = {cols["step"], cols["prompt"], cols["completion"], cols["messages"], cols["group"], "advantage"}
        parts = [v for k, v in row.data.items() if k not in skip and isinstance(v, int | float)
                 and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))]
        if not parts:
            raise MonitorInputError(f"monitor: {row.where}: no reward columns (name one with --column reward=NAME)")
        reward = float(sum(parts))
    return MonitoredRollout(_step(row, _get(row, "step", cols["step"])), _group(row, cols, prompt), prompt, turns,
                            reward, row.where)


def _openrlhf(path: Path, cols: dict[str, str]) -> list[MonitoredRollout]:
    files = [path] if path.is_file() else sorted(path.glob("**/generated_samples*.table.json"),
                                                 key=lambda p: (p.stat().st_mtime_ns, p.name))
    if not files:
        raise MonitorInputError(f"monitor: {path} holds no W&B table generated_samples*.table.json")
    newest = files[-1]
    try:
        table = json.loads(newest.read_text(encoding="utf-8"))
        names, data = list(table["columns"]), list(table["data"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
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
