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


def undocumented_options(help_text: str) -> list[str]:
    """The options argparse lists with no help text of their own (the next line is another option,
    or nothing)."""
    lines = help_text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^  (-\S.*?)(\s{2,}\S.*)?$", line)
        if not m or m.group(2) or m.group(1).startswith("-h"):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not re.match(r"^\s{6,}\S", following):  # help on the next line is indented past the options
            out.append(m.group(1))
    return out


def test_the_option_check_finds_an_option_without_help():
    text = "options:\n  -h, --help  show this\n  --seed SEED\n  --out OUT   where\n  --log-level LOG_LEVEL\n"
    assert undocumented_options(text) == ["--seed SEED", "--log-level LOG_LEVEL"]


@pytest.mark.parametrize("command", package_commands() + SUBCOMMANDS + ["dynalize.eval --bench rubric"])
def test_every_option_of_every_command_says_what_it_does(command):
    proc = run_help(["-m", *command.split()])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert undocumented_options(proc.stdout) == []


def test_eval_help_lists_the_rubric_bench_and_needs_judge_only_where_it_is_used():
    text = run_help(["-m", "dynalize.eval"]).stdout
    assert "rubric" in re.search(r"^  --bench \{(.*?)\}", text, re.M).group(1).split(",")
    assert re.search(r"\[--judge JUDGE\]", text), "--judge is shown as required"
    for bench in ("eqbench", "mindeval", "healthbench", "researchqa"):
        assert bench in re.search(r"--limit LIMIT\s+(.*?)\n  -", text, re.S).group(1)
    missing = subprocess.run([sys.executable, "-m", "dynalize.eval", "--run", "x", "--bench", "healthbench",
                              "--data", "d.jsonl"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "--bench healthbench needs --judge" in missing.stderr
