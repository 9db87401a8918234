"""Every command line of the project answers `--help` with its help text and exit 0: each
`python -m dynalize.*` entry point (found by scanning the package for `__main__` blocks, so a new
one is covered without editing this file), their subcommands, and the scripts under benchmarks/
and scripts/."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAIN_BLOCK = re.compile(r'^if __name__ == "__main__":', re.M)


def package_commands() -> list[str]:
    """`python -m` module names of every file in dynalize/ with a `__main__` block."""
    out = []
    for path in sorted((REPO / "dynalize").rglob("*.py")):
        if MAIN_BLOCK.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return out


SUBCOMMANDS = ["dynalize.report rubric", "dynalize.report audit", "dynalize.rm pairs", "dynalize.rm train"]
SCRIPTS = sorted(str(p.relative_to(REPO)) for d in ("benchmarks", "scripts") for p in (REPO / d).glob("*.py")
                 if MAIN_BLOCK.search(p.read_text(encoding="utf-8")))


def run_help(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args, "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_scan_finds_the_documented_commands():
    assert {"dynalize.run", "dynalize.eval", "dynalize.report", "dynalize.export", "dynalize.rm"} <= set(
        package_commands())


@pytest.mark.parametrize("command", package_commands() + SUBCOMMANDS)
def test_every_command_answers_help_with_exit_0(command):
    proc = run_help(["-m", *command.split()])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: python -m " + command in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_with_exit_0(script):
    proc = run_help([script])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout
