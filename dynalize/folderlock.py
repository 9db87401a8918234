"""One writer per folder: an OS lock on a run's (or a monitor's) folder, held while it writes.

`hold_folder(path)` takes an exclusive `flock` on the folder itself (its directory inode: no
lock file is left in it), creating the folder if it is missing, before anything else is checked
or written. A second process asking for the same folder gets `FolderInUse` (one line naming the
holder's pid, read from /proc/locks), so two runs started together with one name, two resumes of
one run or two monitors on one `--out` cannot both write. The kernel drops the lock when the
process ends, however it ends (kill -9 included): a lock is never stale.

The check and the mkdir race no one: a process that lost a race (the folder it locked was moved
aside or removed before it got the lock, e.g. by `--overwrite`) sees that the path no longer
names the inode it holds and tries again. `release(remove_created=True)` removes the folder again
when this process made it and wrote nothing into it (a run refused for bad input leaves nothing).
`where()` says where the locked folder is now: a run checks it before each write (runlog.RunDir),
so a folder renamed mid-run, and a new one made at its path, never receive the run's files.
On a file system that cannot lock a folder (flock fails with another error, as on some NFS
mounts) the folder is used unlocked, with a warning (`folderlock.unsupported`) that says so.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import structlog

from .errors import ConfigError

log = structlog.get_logger("dynalize.folderlock")

ATTEMPTS = 20
"""How often a lock is retried when the folder was replaced under us (each retry means another
process moved or removed it between our mkdir and our lock: a rare race, never a wait)."""


class FolderInUse(ConfigError):
    """Another process holds the folder (the message is one line naming it and the holder's pid)."""


class FolderLock:
    """An exclusive lock on one folder, held until `release()` (or the process ends)."""

    def __init__(self, path: Path, fd: int, created: list[Path], what: str):
        self.path, self._fd, self._created, self.what = path, fd, created, what
        self._origin = path

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, remove_created: bool = False) -> None:
        """Drop the lock; with `remove_created`, first remove the folders this process made for it
        (the folder and missing parents) where they are still empty, and only while the path still
        names the folder locked (a folder another made there after ours moved is not ours)."""
        if self._fd is None:
            return
        if remove_created and self.path == self._origin and _same_inode(self.path, self._fd):
            for folder in reversed(self._created):
                try:
                    folder.rmdir()
                except OSError:  # not empty (something was written), or already gone
                    break
        os.close(self._fd)
        self._fd = None

    def where(self) -> Path | None:
        """Where the locked folder is now: `path` while it is still there, its new path when it was
        renamed (read from /proc/self/fd, Linux), None when it was removed or cannot be found."""
        if self._fd is None or _same_inode(self.path, self._fd):
            return self.path
        if os.fstat(self._fd).st_nlink == 0:  # removed
            return None
        try:
            now = Path(os.readlink(f"/proc/self/fd/{self._fd}"))
        except OSError:
            return None
        return now if _same_inode(now, self._fd) else None

    def replace_aside(self, move_aside: Callable[[Path], Path]) -> Path:
        """With the folder locked, `move_aside(path)` (it renames the folder, returning where to),
        then create and lock a fresh, empty folder at the same path; the old one's lock is dropped
        once the new one is held. Returns where the old folder went."""
        moved = move_aside(self.path)
        fresh = hold_folder(self.path, self.what)
        os.close(self._fd)
        self._fd, self._created = fresh._fd, fresh._created
        fresh._fd = None
        return moved

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release(remove_created=exc[0] is not None)


def hold_folder(path: str | Path, what: str = "folder") -> FolderLock:
    """Lock `path` (made, with its parents, if missing) for this process; FolderInUse when another
    process holds it, ConfigError when it cannot be a folder (a file, a dangling link)."""
    path = Path(path)
    for _ in range(ATTEMPTS):
        created = _make(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # removed between mkdir and open: try again
            continue
        except NotADirectoryError:
            raise ConfigError(f"config error: {path} exists and is not a folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(os.fstat(fd))
            os.close(fd)
            who = f"pid {holder}" if holder else "pid unknown"
            raise FolderInUse(f"config error: {what} {path} is in use by another process ({who}): "
                              f"wait for it to end, or use another folder") from None
        except OSError as e:  # a file system that cannot lock a folder (some NFS mounts): said, not hidden
            log.warning("folderlock.unsupported", folder=str(path), error=os.strerror(e.errno or 0),
                        consequence="the folder is not locked: do not start a second process on it")
        if _same_inode(path, fd):
            return FolderLock(path, fd, created, what)
        os.close(fd)  # the path names another folder now: the one we locked was moved away
    raise ConfigError(f"config error: {path} keeps being replaced by another process: could not lock it")


def _make(path: Path) -> list[Path]:
    """Create `path` and its missing parents; the folders this call made, outermost first."""
    missing = []
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
            made.append(folder)
        except FileExistsError:  # another process made it first: it is not ours to remove
            pass
    return made


def _same_inode(path: Path, fd: int) -> bool:
    try:
        now = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def lock_holder(st: os.stat_result) -> int | None:
    """The pid holding a flock on the file of `st`, from /proc/locks (Linux); None if not found."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    device = (os.major(st.st_dev), os.minor(st.st_dev))
    by_inode = []
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":  # a waiter, or another kind of lock
            continue
        major, minor, inode = fields[5].rsplit(":", 2) if fields[5].count(":") == 2 else ("", "", "")
        if not inode.isdigit() or int(inode) != st.st_ino or not fields[4].isdigit():
            continue
        if (int(major, 16), int(minor, 16)) == device:
            return int(fields[4])
        by_inode.append(int(fields[4]))  # e.g. overlayfs reports another device for the inode
    return by_inode[0] if len(set(by_inode)) == 1 else None
