"""The repository names no path of one particular machine: defaults are relative to the checkout,
come from an environment variable or `~`, and instructions work on a user's machine.

An absolute path in a file (POSIX, `file://` URL or Windows) must start with one of ALLOWED:
directories every Linux machine has, HTTP routes, and the usual placeholders. Anything else
(a home directory, a work or scratch mount, a venv somewhere) is this machine's. Test fixtures
(recorded outputs of other programs) are not checked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = (
    "/dev/",          # /dev/shm, /dev/null
    "/tmp/",
    "/proc/",         # /proc/cpuinfo
    "/sys/",
    "/usr/bin/env",   # shebangs
    "/v1/",           # OpenAI-compatible HTTP routes, not files
    "/path/to/",      # placeholders in docs
    "/no/such/",      # a path that exists nowhere, on purpose (tests)
)
NOT_CHECKED = ("tests/fixtures/",)
PATH_LISTS = (".gitignore", ".dockerignore")
"""Files whose leading `/` anchors a pattern at the repository root."""

# An absolute POSIX path of two or more parts (a slash, a name, a slash...), not the tail of a
# URL, a relative path or one under a variable or placeholder (`https://h/a`, `a/b`, `$HOME/a`,
# `${X}/a`, `<dir>/a`, `~/a`); a Windows path from a drive letter.
POSIX = re.compile(r"(?<![\w./~$})\]>])/[A-Za-z_][\w.@+-]*/[\w.@+/-]*")
WINDOWS = re.compile(r"(?<![\w\\])[A-Z]:\\\w[\w .-]*\\")


def machine_paths(text: str) -> list[str]:
    """The absolute paths in `text` that are not ALLOWED."""
    text = text.replace("file://", "")  # a file URL names the absolute path after it
    found = [m.group(0) for m in POSIX.finditer(text) if not (m.group(0) + "/").startswith(ALLOWED)]
    return found + [m.group(0) for m in WINDOWS.finditer(text)]


def repository_files() -> list[str]:
    """Tracked files, and new ones git does not ignore, relative to the checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot tell the repository's files from build outputs")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return sorted({f for f in out.split("\0") if f and (ROOT / f).is_file()})


def test_no_file_names_a_path_of_this_machine():
    files = [f for f in repository_files() if not f.startswith(NOT_CHECKED) and Path(f).name not in PATH_LISTS]
    assert len(files) > 50
    found = []
    for rel in files:
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if not line.startswith("#!"):
                found += [f"{rel}:{n}: {p}" for p in machine_paths(line)]
    assert not found, "absolute paths of one machine (make them relative, an env var, or ~):\n" + "\n".join(found)


def _abs(path: str) -> str:
    """`/` + path, written so that this file itself names no absolute path."""
    return "/" + path


@pytest.mark.parametrize("line", [
    f"VENV=\"${{1:-${{VLLM_VENV:-{_abs('work/vllm-venv')}}}}}\"",
    f"`{_abs('work/vllm-venv/bin/python')} -m pytest -m vllm tests/test_vllm.py`",
    f'cache = Path("{_abs("home/alice/.cache/dynalize")}")',
    f"default: {_abs('root/models/qwen')}",
    f"--bench-dir {_abs('Users/bob/src/mind-eval')}",
    f"checkpoint_dir={_abs('mnt/shared/weights')!r}",
    f"extra-index-url = file://{_abs('opt/pypi/simple')}",
    "path: C:" + "\\" + "Users" + "\\" + "bob" + "\\" + "rm",
])
def test_machine_paths_are_found(line):
    assert machine_paths(line)


@pytest.mark.parametrize("line", [
    f'tempfile.mkdtemp(dir="{_abs("dev/shm")}")',
    f"grep -qw avx2 {_abs('proc/cpuinfo')}",
    f"log to {_abs('tmp/dynalize.log')}",
    f"POST {_abs('v1/completions')}",
    'VENV="${1:-${VLLM_VENV:-$REPO/.venv-vllm}}"',
    "--bench-dir ~/src/mind-eval and $HOME/models/rm",
    "see https://docs.vllm.ai/en/latest/getting_started/installation/cpu.html",
    "runs/sandbox_dynalize/checkpoints/step_000010/ and a / b / c",
    f"reward_model: {{engine: hf, path: {_abs('path/to/my-rm')}}}",
])
def test_portable_paths_pass(line):
    assert machine_paths(line) == []
