"""A run on disk: metrics.jsonl, rollouts/step_NNNNNN.jsonl, `<term>.jsonl` event logs (e.g.
penalties.jsonl), eval/task.jsonl, checkpoints/step_NNNNNN/ (written and read by
dynalize.checkpoint).

Every line is flushed and fsynced as it is written, and rollout files are written whole then
renamed, so a crash mid-run loses at most the step in flight and never leaves a broken line. A
run directory is never reused by accident: a new run refuses a directory that holds files,
unless told to move it aside (`--overwrite`), and any run refuses one holding a link that leads
out of it (`links_out`). A file that is not JSON lines of objects is `DamagedFile` (one line);
an OS error is named by the path being written (`naming`), also where a library wraps it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

from .errors import ConfigError
from .types import Message, Rollout


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line durably."""
    with naming(path), open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_jsonl_atomic(path: Path, records: list[dict[str, Any]]) -> None:
    """Write a whole JSONL file via a temporary file and rename."""
    write_text_atomic(path, (json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def write_text_atomic(path: Path, chunks: str | Iterable[str]) -> None:
    """Write `path` whole or not at all: into `<path>.tmp`, fsynced, then renamed over `path`. On
    any failure (a full disk) the temporary file is removed and `path` is as it was."""
    path, chunks = Path(path), [chunks] if isinstance(chunks, str) else chunks
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with naming(tmp), open(tmp, "w", encoding="utf-8") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class DamagedFile(ConfigError):
    """A log or rollout file that is not JSON lines of objects (binary, or a line holding an array
    or a number): one line naming the file and the line; nothing is rewritten."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete JSON lines of a file, each an object (a torn last line, if any, is skipped);
    DamagedFile for a file that is not text or a line that holds another JSON value."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DamagedFile(f"{path} is damaged: not UTF-8 text (byte {e.start}): not a JSON-lines file; "
                          f"restore it or move it away") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            raise DamagedFile(f"{path} is damaged: line {n} holds a JSON {type(record).__name__}, not an object; "
                              f"restore the file or remove that line")
        out.append(record)
    return out


def move_aside(path: Path) -> Path:
    """Rename `path` to `<name>.replaced-<time>` beside it (kept whole: delete it yourself); the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.replaced-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.replaced-{stamp}-{n}")
    os.replace(path, target)
    return target


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a run directory (its config.yaml beside metrics or checkpoints)."""
    return (path / "config.yaml").is_file() and ((path / "metrics.jsonl").exists() or (path / "checkpoints").is_dir())


MANIFEST = "manifest.json"
"""dynalize.checkpoint.MANIFEST, the mark of a checkpoint (that module imports torch)."""


def is_checkpoint(folder: Path) -> bool:
    """A dynalize checkpoint (its manifest.json), or a transformers/TRL one (`checkpoint-N/` with
    its trainer_state.json: the trainer deletes old ones, anything inside them too)."""
    return (folder / MANIFEST).is_file() or (re.fullmatch(r"checkpoint-\d+", folder.name) is not None
                                             and (folder / "trainer_state.json").is_file())


def enclosing_run(path: Path) -> tuple[str, Path] | None:
    """("checkpoint" or "run", the folder) of the innermost checkpoint or run folder that is
    `path` or holds it, links resolved; None when there is none. A resume rewrites a run's files
    and a checkpoint is replaced whole, so nothing else may write inside them."""
    for d in (p := Path(path).resolve(), *p.parents):
        if is_checkpoint(d) or is_run_dir(d):
            return ("checkpoint" if is_checkpoint(d) else "run"), d
    return None


FILESYSTEM_ERRORS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EEXIST,
                               errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EFBIG, errno.EIO})
"""The errors of a disk or folder that is full, read-only, or not what a run needs."""


WRAPPED_OS_ERROR = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
"""How an OS error reads inside another exception's message: a Rust library's (safetensors,
tokenizers: "(os error 28)") or one that collects OSErrors as text (shutil.copytree's Error)."""


def as_os_error(e: BaseException | None) -> OSError | None:
    """`e` as an OSError with its errno: itself, or one a library wrapped in its own exception
    (safetensors raises `SafetensorError("... No space left on device (os error 28)")`, copytree
    an errno-less `shutil.Error` listing them); else None."""
    if isinstance(e, OSError) and e.errno is not None:
        return e
    if e is not None and (m := WRAPPED_OS_ERROR.search(str(e))):
        code = int(m[1] or m[2])
        return OSError(code, os.strerror(code))
    return None


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Run the block; an OS error it raises that names no file (a write or fsync on a full disk, or
    one a library wraps: `as_os_error`) is raised again as an OSError naming `path`."""
    try:
        yield
    except Exception as e:
        os_error = as_os_error(e)
        if os_error is None or (os_error is e and os_error.filename):
            raise
        raise OSError(os_error.errno, os_error.strerror, str(path)) from e


RESUME_HINT = "what was written before is intact: fix the cause, then --resume the run"


def filesystem_problem(e: BaseException | None, then: str = RESUME_HINT) -> str | None:
    """One line for a file system error (a full disk, a read-only folder, a path that is not a
    folder), naming the path and the cause, then `then`; None for any other error. A run's files
    are written whole (checkpoints renamed when complete, lines fsynced), so what was written
    before is intact."""
    e = as_os_error(e)
    if e is None or e.errno not in FILESYSTEM_ERRORS:
        return None
    where = f"{e.filename}: " if e.filename else ""
    return f"file system error: {where}{e.strerror or e} ({then})"


class RunDir:
    """Paths and writers of one run directory. Nothing is written until `create()`.

    Once `hold(lock)` gives it the run's folder lock (dynalize.folderlock), every writer first
    checks that the path still names the locked folder (`here`). A folder renamed mid-run (and
    perhaps a new one made at its path) is followed to where it went: the writes go on into the
    folder the run holds, never into the new one, and `moved` says so in one line (the loop then
    checkpoints there and stops). A folder removed mid-run stops the run with one line.
    """

    def __init__(self, root: str | Path):
        self._set_root(Path(root))
        self.lock: Any = None
        self.moved: str | None = None
        """Set when the folder was found renamed: the stop line."""

    def _set_root(self, root: Path) -> None:
        self.root = root
        self.metrics_path = self.root / "metrics.jsonl"
        self.rollouts_dir = self.root / "rollouts"
        self.checkpoints_dir = self.root / "checkpoints"
        self.eval_path = self.root / "eval" / "task.jsonl"

    def hold(self, lock: Any) -> None:
        """Write only into the folder `lock` (a folderlock.FolderLock on `root`) holds."""
        self.lock = lock

    def here(self) -> Path:
        """The run folder's path now: the locked folder followed if it was renamed (`moved` says
        from where to where); one line (ConfigError) if it was removed."""
        if self.lock is None or not self.lock.held or (now := self.lock.where()) == self.root:
            return self.root
        old = self.root
        if now is None:
            raise ConfigError(f"file system error: the run folder {old} was removed while the run was writing it "
                              f"(or moved where it cannot be found): nothing more can be saved, the run stops")
        self._set_root(now)
        self.lock.path = now
        replaced = f" (and {old} is another folder now, which the run does not touch)" if old.exists() else ""
        self.moved = (f"the run folder {old} was moved to {now} while the run was writing it{replaced}: the run "
                      f"went on writing into {now}, the folder it holds")
        return now

    def create(self) -> None:
        self.here()
        for d in (self.root, self.rollouts_dir, self.checkpoints_dir, self.eval_path.parent):
            d.mkdir(parents=True, exist_ok=True)

    def problem(self) -> str | None:
        """Why a run cannot be written here, in one line (None if it can): its folder is a dangling
        link or not a folder, or the nearest existing folder above it is not a writable folder."""
        root, base = self.root, self.root
        while not base.exists():
            if base.is_symlink():
                return f"{base} is a symbolic link to {os.readlink(base)}, which does not exist"
            if base == base.parent:
                break
            base = base.parent
        if not base.is_dir():
            return f"{base} is not a folder: the run's folder {root} cannot be made there"
        if not os.access(base, os.W_OK | os.X_OK):
            return f"{base} is not writable: the run's folder {root} cannot be written"
        return None

    def links_out(self) -> str | None:
        """A symbolic link inside the run folder that leads out of it, in one line (None if there is
        none): a run writes only inside its own folder, and a link would let it write into another
        run's checkpoints or logs."""
        if not self.root.is_dir():
            return None
        root = self.root.resolve()
        for folder, dirs, files in os.walk(root):  # links to folders are listed, not followed
            for name in sorted(dirs + files):
                path = Path(folder) / name
                if path.is_symlink() and not path.resolve().is_relative_to(root):
                    shown = self.root / path.relative_to(root)
                    return (f"{shown} is a link to {path.resolve()}, outside the run folder {self.root}: a run "
                            f"writes only inside its own folder (replace the link by a folder or file of its own)")
        return None

    def holds_run(self) -> bool:
        """Whether the directory holds any file (an earlier run, or anything else)."""
        return self.root.is_dir() and any(p.is_file() for p in self.root.rglob("*"))

    def move_aside(self) -> Path:
        """Rename the directory to `<name>.replaced-<time>` (kept whole: delete it yourself)."""
        return move_aside(self.root)

    def log_metrics(self, record: dict[str, Any]) -> None:
        self.here()
        append_jsonl(self.metrics_path, record)

    def log_eval(self, record: dict[str, Any]) -> None:
        """Append one held-out evaluation to eval/task.jsonl."""
        self.here()
        append_jsonl(self.eval_path, record)

    def log_rollouts(self, step: int, rollouts: list[Rollout], name: str = "step") -> None:
        self.here()
        write_jsonl_atomic(self.rollouts_dir / f"{name}_{step:06d}.jsonl", [r.record(step) for r in rollouts])

    def log_events(self, name: str, events: list[dict[str, Any]]) -> None:
        """Append a reward term's events to `<name>.jsonl` (each line carries its step)."""
        self.here()
        for e in events:
            append_jsonl(self.root / f"{name}.jsonl", e)

    def truncate(self, from_step: int, eval_rows: int | None = None, event_logs: Sequence[str] = ()) -> None:
        """On resume after `from_step` completed steps: forget the lines of later steps (labelled
        from_step + 1 on: they run again) in metrics.jsonl and the event logs `<name>.jsonl` of
        `event_logs` (the run's reward terms), and the held-out evaluations after the first
        `eval_rows` (None: keep them all). Only these files, named explicitly, are rewritten:
        anything else in the folder is not the run's."""
        logs = {path: read_jsonl(path) for path in (self.metrics_path, *(
            self.root / f"{name}.jsonl" for name in dict.fromkeys(event_logs))) if path.is_file()}
        for path, rows in logs.items():  # every log checked before any is rewritten
            if bad := next((r for r in rows if not _whole(r.get("step", -1))), None):
                raise DamagedFile(f"{path} is damaged: a line holds step {str(bad['step'])[:40]!r}, not a whole "
                                  f"number; restore the file or remove that line (nothing was rewritten)")
        for path, rows in logs.items():
            write_jsonl_atomic(path, [r for r in rows if r.get("step", -1) <= from_step])
        if eval_rows is not None and self.eval_path.exists():
            write_jsonl_atomic(self.eval_path, read_jsonl(self.eval_path)[:eval_rows])

    def checkpoint_path(self, step: int) -> Path:
        self.here()
        return self.checkpoints_dir / f"step_{step:06d}"


def _whole(step: Any) -> bool:
    """Whether a log line's step is a whole number (a bool, a string or a float is a damaged line)."""
    return isinstance(step, int) and not isinstance(step, bool)


def rollout_to_state(r: Rollout) -> dict[str, Any]:
    """Everything needed to rebuild a generated (not yet scored) rollout."""
    return {
        "prompt_id": r.prompt_id, "group": r.group, "prompt_ids": r.prompt_ids,
        "completion_ids": r.completion_ids, "logprobs": r.logprobs, "loss_mask": r.loss_mask,
        "replies": r.replies, "reasoning": r.reasoning, "policy_version": r.policy_version,
        "truncated": r.truncated, "messages": [m.to_dict() for m in r.messages], "meta": r.meta,
        "turns": [m.to_dict() for m in r.turns],
        **({"info": dict(r.info)} if r.info else {}),  # what generation recorded (a failed simulated user)
    }


def rollout_from_state(d: dict[str, Any]) -> Rollout:
    d = dict(d)
    d["messages"] = [Message(**m) for m in d["messages"]]
    d["turns"] = [Message(**m) for m in d.get("turns", [])]
    return Rollout(**d)
