"""Task data loaders: rows from JSONL, CSV, parquet, a `datasets` folder (`save_to_disk`), a
Hugging Face Hub dataset id (`hub:ORG/NAME[@REVISION][:SPLIT]`, through `datasets.load_dataset`),
or data given in memory to `dynalize.train` (a `datasets.Dataset`, a list of dicts).

Every problem is a `DataError` (a `ConfigError`, so `python -m dynalize.run` prints one line and
exits 2) naming the file and, for a bad row, its place and the field:

    rows = read_rows("data/train.jsonl", required=["prompt"])
    rows[0].data["prompt"], rows[0].where        # "data/train.jsonl line 1"

Places are 1-based file lines for JSONL and CSV (a CSV row's first line; the header is line 1)
and 0-based row indices for parquet, `datasets` folders, Hub datasets and data in memory. The
format follows the path: a directory is a `datasets` folder, otherwise the suffix decides
(.jsonl/.ndjson, .csv, .parquet).

File-based tasks take `DataArgs` (train file, eval file or held-out fraction) and build their
splits with `load_splits(args, load)`, where `load` turns one file into prompts.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from ..extras import optional_import
from .base import TaskArgs
from .hub import HUB_PREFIX, read_hub
from .rows import DataError, Row, first_line

T = TypeVar("T")

MAX_ROW_CHARS = 200_000
"""The default cap on one row's size, in characters (`DataArgs.max_row_chars`): about 50k tokens,
past any prompt a policy is trained on; a bigger row (a pasted file, a broken export) is refused
at load with one line, before it can take the memory of tokenizing and generating from it."""

_ROW_CAP: ContextVar[int] = ContextVar("max_row_chars", default=MAX_ROW_CHARS)
_ROW_CAP_SETTING: ContextVar[str] = ContextVar("max_row_chars_setting", default="task.args.max_row_chars")
"""The setting the size-cap line tells the user to raise (another command has its own option)."""

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
"""File suffix → format; a directory is read as a `datasets` folder."""


class NoRowsError(DataError):
    """A data file that holds no rows (empty, or nothing but a header or an unfinished line)."""


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"data error: {path} is not UTF-8 text (line {line}, byte {e.start})") from None


def _check_size(size: int, where: str) -> None:
    if size > (cap := _ROW_CAP.get()):
        raise DataError(f"data error: {where}: a row of {size:,} characters, over max_row_chars={cap:,} "
                        f"(raise {_ROW_CAP_SETTING.get()} if it is meant to be that long)")


@contextmanager
def row_cap(max_chars: int, setting: str = "task.args.max_row_chars") -> Iterator[None]:
    """Rows read inside this block are refused past `max_chars` characters (default MAX_ROW_CHARS);
    the refusal names `setting` as the way to raise the cap."""
    token, named = _ROW_CAP.set(max_chars), _ROW_CAP_SETTING.set(setting)
    try:
        yield
    finally:
        _ROW_CAP.reset(token)
        _ROW_CAP_SETTING.reset(named)


def _whole_lines(raw: bytes, whole_lines_only: bool) -> bytes:
    """`raw`, without a last line that has no newline yet when `whole_lines_only` (a file that
    another process is still appending to)."""
    return raw[: raw.rfind(b"\n") + 1] if whole_lines_only else raw


def _read_jsonl(path: Path, whole_lines_only: bool = False) -> list[Row]:
    lines = _decode(path, _whole_lines(path.read_bytes(), whole_lines_only)).splitlines()
    return [row for i, line in enumerate(lines, start=1) if (row := jsonl_row(path, i, line)) is not None]


def jsonl_row(path: Path, i: int, line: str) -> Row | None:
    """Line `i` of JSONL file `path` as a row (None: a blank line), checked against the row cap;
    a DataError naming the line otherwise. (The monitor reads a growing log line by line with it.)"""
    if not line.strip():
        return None
    _check_size(len(line), f"{path} line {i}")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"data error: {path} line {i}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"data error: {path} line {i}: expected a JSON object, got {type(data).__name__}")
    return Row(data, f"{path} line {i}")


def _read_csv(path: Path, whole_lines_only: bool = False) -> list[Row]:
    limit = csv.field_size_limit(2**31 - 1)  # the file is in memory already: a long field gets the row cap's line
    try:
        return _read_csv_rows(path, whole_lines_only)
    finally:
        csv.field_size_limit(limit)


def _read_csv_rows(path: Path, whole_lines_only: bool) -> list[Row]:
    reader = csv.reader(io.StringIO(_decode(path, _whole_lines(path.read_bytes(), whole_lines_only)), newline=""))
    rows: list[Row] = []
    header: list[str] | None = None
    try:
        while True:
            start = reader.line_num + 1  # a record's first line (records may span lines)
            values = next(reader, None)
            if values is None:
                return rows
            if not values:
                continue  # blank line
            if header is None:
                header = values
                continue
            if len(values) > len(header):
                raise DataError(f"data error: {path} line {start}: more values than header columns")
            _check_size(sum(map(len, values)), f"{path} line {start}")
            rows.append(Row(dict(zip(header, values)), f"{path} line {start}"))
    except csv.Error as e:
        raise DataError(f"data error: {path} line {reader.line_num}: {first_line(e)}") from None


def _read_parquet(path: Path) -> list[Row]:
    pq = optional_import("pyarrow.parquet", f"data error: {path}: a parquet file")

    try:
        records = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DataError(f"data error: {path} is not a readable parquet file ({first_line(e)})") from None
    return [Row(r, f"{path} row {i}") for i, r in enumerate(records)]


def _sized(row: Row) -> Row:
    """`row`, checked against the row cap by the size of its values as JSON."""
    _check_size(len(json.dumps(row.data, ensure_ascii=False, default=str)), row.where)
    return row


def _read_datasets(path: Path) -> list[Row]:
    datasets = optional_import("datasets", f"data error: {path}: a datasets folder")

    state = path / "state.json"
    if state.is_file() and json.loads(state.read_text(encoding="utf-8")).get("_data_files") == []:
        return []  # saved with no rows: `datasets` itself cannot load such a folder
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"data error: {path} is not a datasets folder saved with save_to_disk "
                        f"({first_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = ", ".join(ds)
        raise DataError(f"data error: {path} holds several splits ({splits}): point at one split's subfolder")
    return [Row(r, f"{path} row {i}") for i, r in enumerate(ds)]


_READERS = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet, "datasets": _read_datasets}

CAPPED_AS_READ = ("jsonl", "csv")
"""Formats whose readers check the row cap on each line's text, before parsing it; every other
source's rows (parquet, datasets folders, Hub datasets, data from Python) are checked by
`read_rows` once they are read, by the size of their values as JSON."""


def data_format(path: Path) -> str:
    """`jsonl`, `csv`, `parquet` or `datasets` for `path`."""
    if path.is_dir():
        return "datasets"
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(FORMATS)
        raise DataError(f"data error: {path}: unknown data format {path.suffix or '(no suffix)'!r}; use {known} "
                        f"or a datasets folder")
    return fmt


def _read_memory(spec: str) -> list[Row]:
    """Rows of data given to `dynalize.train` as a Python object (see dynalize.plugins)."""
    from ..plugins import given_object

    data = given_object(spec, "data")
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        data = data.to_dict("records")
    rows = []
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            raise DataError(f"data error: {spec} row {i}: expected a dict, got {type(record).__name__}")
        rows.append(Row(dict(record), f"{spec} row {i}"))
    return rows


def missing(value: Any) -> bool:
    """A field counts as missing when absent, null, an empty string, or a table's missing value
    (NaN, pandas' NA and NaT: a DataFrame's empty cell), which would otherwise read as "nan"."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values, without importing pandas
        return True
    try:
        return bool(value != value)  # NaN, of any float type (numpy's too)
    except (TypeError, ValueError):  # an array: not one missing value
        return False


def read_rows(path: str | Path, required: Sequence[str] = (), *, whole_lines_only: bool = False) -> list[Row]:
    """All rows of a data file, Hub dataset or data in memory, each checked to have the `required`
    fields. `whole_lines_only`: a JSONL or CSV file's last line without its newline is left out
    (the file is still being written: `python -m dynalize.monitor --follow`)."""
    from ..plugins import OBJECT_PREFIX

    p = Path(path)
    if str(path).startswith(HUB_PREFIX):
        fmt, rows = "hub", read_hub(str(path))
    elif str(path).startswith(OBJECT_PREFIX):
        fmt, rows = "memory", _read_memory(str(path))
    elif not p.exists():
        raise DataError(f"data error: no such data file: {p}")
    elif (fmt := data_format(p)) in ("jsonl", "csv"):
        rows = _READERS[fmt](p, whole_lines_only)
    else:
        rows = _READERS[fmt](p)
    if fmt not in CAPPED_AS_READ:
        rows = [_sized(row) for row in rows]  # the row cap, for every source
    if not rows:
        raise NoRowsError(f"data error: {p} has no rows")
    for row in rows:
        for name in required:
            if missing(row.data.get(name)):
                raise row.fail(f"missing field {name!r}")
    return rows


def row_meta(row: Row, field: str = "meta") -> dict[str, Any]:
    """A row's per-prompt data for `Prompt.meta`: its `field`, a JSON object (in CSV, a JSON
    string of one); {} when missing."""
    raw: Any = row.data.get(field)
    if missing(raw):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise row.fail(f"field {field!r} is not a JSON object") from None
    if not isinstance(raw, dict):
        raise row.fail(f"field {field!r} must be an object (key: value), got {type(raw).__name__}")
    return raw


def short_hash(text: str, n: int = 12) -> str:
    """A stable id for a piece of text: the first `n` hex digits of its SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def read_text_file(path: str | Path, what: str) -> str:
    """A UTF-8 text file (e.g. a persona prompt), as a DataError when missing or undecodable."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data error: no such {what} file: {p}")
    return _decode(p, p.read_bytes())


def held_out(n: int, fraction: float, seed: int) -> set[int]:
    """Indices of a seeded held-out fraction of `n` items: at least one when fraction > 0, never
    all of them (so none of a single item; `load_splits` refuses that case)."""
    if fraction <= 0 or n == 0:
        return set()
    k = min(max(1, round(n * fraction)), n - 1)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return set(order[:k])


class DataArgs(TaskArgs):
    """Where a file-based task reads its prompts, and how it splits off held-out ones."""

    train_file: str
    """Training data: a .jsonl, .csv or .parquet file, a datasets folder, a Hub dataset
    `hub:ORG/NAME[@REVISION][:SPLIT]`, or (from Python) a Dataset or list of dicts (docs/data_formats.md)."""
    eval_file: str | None = None
    """Held-out data, in any of those forms; when unset, `eval_fraction` of train_file is held out."""
    eval_fraction: float = Field(0.05, ge=0, lt=1)
    """Share of train_file's prompts held out for evaluation when there is no eval_file: at least one
    prompt, and at least one left for training (a one-prompt file is an error); 0 holds out none."""
    split_seed: int = 0
    """Seed of the held-out draw (independent of the run seed, so runs share a split)."""
    max_train_prompts: int | None = Field(None, gt=0)
    """Use only the first N training prompts (None = all)."""
    max_row_chars: int = Field(MAX_ROW_CHARS, gt=0)
    """Refuse, at load, a data row longer than this many characters (one line naming the file, the
    row and its size): one huge row would otherwise take the memory of tokenizing and generating
    from it mid-run."""


def load_splits(args: DataArgs, load: Callable[[str], list[T]]) -> dict[str, list[T]]:
    """Train and eval items: `load` reads one file into items (prompts), in file order; rows over
    `args.max_row_chars` are refused."""
    with row_cap(args.max_row_chars):
        items = load(args.train_file)
        evals = load(args.eval_file) if args.eval_file else []
    if args.eval_file:
        train = items
    else:
        if args.eval_fraction > 0 and len(items) < 2:
            raise DataError(f"data error: {args.train_file} has {len(items)} prompt: eval_fraction {args.eval_fraction} "
                            f"cannot hold one out for evaluation and keep one for training (give an eval_file, "
                            f"or set eval_fraction: 0)")
        held = held_out(len(items), args.eval_fraction, args.split_seed)
        train = [x for i, x in enumerate(items) if i not in held]
        evals = [x for i, x in enumerate(items) if i in held]
    if args.max_train_prompts:
        train = train[: args.max_train_prompts]
    return {"train": train, "eval": evals}
