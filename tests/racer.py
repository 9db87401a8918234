"""Two processes that meet at one point: `python tests/racer.py BARRIER MODULE.FUNCTION COMMAND ARGS...`
runs `COMMAND`'s `main(ARGS)` (a module, e.g. dynalize.run) with `MODULE.FUNCTION` patched to wait,
when first called, until the file BARRIER/go exists (each arrival leaves BARRIER/<pid>.arrived).
Started twice at once, both processes stand at that point together before either goes on: what
happens next is decided by the code (a lock), never by which process the scheduler ran first."""

import importlib
import os
import sys
import time
from pathlib import Path

WAIT_S = 300
"""How long a racer waits for the test's go (a test that never gives it fails, not hangs)."""


def wait_at(barrier: Path) -> None:
    (barrier / f"{os.getpid()}.arrived").touch()
    deadline = time.monotonic() + WAIT_S
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("racer: no go from the test")
        time.sleep(0.02)


def main() -> int:
    barrier, target, command, *argv = sys.argv[1:]
    module, name = target.rsplit(".", 1)
    try:
        owner = importlib.import_module(module)
    except ModuleNotFoundError:  # a method: module.Class.method
        module, cls = module.rsplit(".", 1)
        owner = getattr(importlib.import_module(module), cls)
    original = getattr(owner, name)

    def waiting(*args, **kwargs):
        wait_at(Path(barrier))
        return original(*args, **kwargs)

    setattr(owner, name, waiting)
    return importlib.import_module(command).main(argv)


if __name__ == "__main__":
    sys.exit(main())
