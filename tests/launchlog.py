"""What a failed multi-process launch said, kept whole where it matters.

A rank that aborts (SIGABRT at teardown) leaves its reason far above the last lines of the
launcher's output: `terminate called after throwing ...`, a C++ stack (TORCH_SHOW_CPP_STACKTRACES)
or a Python fault traceback (PYTHONFAULTHANDLER). `launch_env` asks the ranks for both, and
`failure_report` puts every such line in the assertion message, with the tails, so one failure
under load is enough to see its cause. With DYNALIZE_LAUNCH_LOGS set, the whole output is also
written there (scripts/suite_under_load.sh keeps it)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

CLUES = re.compile(r"terminate called|what\(\)|Fatal Python error|Current thread|File \"|Abort|SIGABRT|"
                   r"signal|Exception raised from|frame #|gloo|c10d|error", re.I)


def launch_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the ranks asked to print C++ stacks and Python fault tracebacks."""
    return {**env, "TORCH_SHOW_CPP_STACKTRACES": "1", "PYTHONFAULTHANDLER": "1"}


def failure_report(done: subprocess.CompletedProcess, name: str = "launch") -> str:
    """The exit status, every clue line of stdout and stderr (up to 200), and both tails."""
    text = (done.stdout or "") + "\n" + (done.stderr or "")
    folder = os.environ.get("DYNALIZE_LAUNCH_LOGS")
    saved = ""
    if folder:
        path = Path(folder) / f"{name}-{os.getpid()}-{time.time_ns()}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"$ {done.args}\nexit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
        saved = f" (whole output: {path})"
    clues = [line for line in text.splitlines() if CLUES.search(line)][:200]
    return (f"{name} exited {done.returncode}{saved}\n--- clue lines\n" + "\n".join(clues)
            + f"\n--- stdout tail\n{(done.stdout or '')[-3000:]}\n--- stderr tail\n{(done.stderr or '')[-6000:]}")
