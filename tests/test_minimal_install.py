"""`pip install -e .` with no extras: the monitor and a run work, and a command that needs an extra
stops with one line naming it (`pip install 'dynalize[data]'`). Each command runs in a subprocess in
which every installed package outside the core dependencies' closure is hidden, as if not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_monitor import hacked_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
KEPT = {"pip", "setuptools", "dynalize"}
"""dynalize itself, and what every virtualenv has whatever was installed into it."""

HIDER = """\
# Written by tests/test_minimal_install.py: these modules import as if they were not installed.
import sys
for name in {hidden!r}:
    sys.modules[name] = None  # import raises ModuleNotFoundError; importlib.util.find_spec returns None
"""

DRIVER = """\
# `python -m MODULE ARGS` for each command (JSON: [[module, args, folder], ...]) in a child forked after
# dynalize's imports, which are most of a command's start-up: each child runs one command as `-m` does,
# its output in FOLDER/output.txt; prints each exit status.
import json, os, runpy, sys, traceback
import dynalize.api, dynalize.build, dynalize.monitor.replay, dynalize.rm.train  # not the commands themselves
for module, args, folder in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def core_closure() -> set[str]:
    """The distributions `pip install -e .` installs: pyproject's core dependencies and theirs."""
    todo = list(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])
    seen: set[str] = set()
    while todo:
        req = Requirement(todo.pop())
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
    return seen


def optional_modules() -> list[str]:
    """Top-level modules installed here by no distribution of the core closure (datasets, peft, trl ...)."""
    core = core_closure() | KEPT
    return sorted(module for module, dists in metadata.packages_distributions().items()
                  if module.isidentifier() and not any(canonicalize_name(d) in core for d in dists))


def run_minimal(tmp: Path, commands: list[tuple[str, list[str], Path]]) -> list[tuple[int, str]]:
    """Each `python -m module args` run in its folder with only the core install importable (one
    interpreter, a child per command): its exit status and its output (stdout and stderr)."""
    (tmp / "sitecustomize.py").write_text(HIDER.format(hidden=optional_modules()), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{tmp}:{ROOT}:{ROOT / 'tests'}",  # tests/: the toy task, trlrewards
           "TOKENIZERS_PARALLELISM": "false", "NO_COLOR": "1"}
    spec = json.dumps([[m, a, str(f)] for m, a, f in commands])
    done = subprocess.run([sys.executable, "-c", DRIVER, spec], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=900)
    codes = done.stdout.split()
    assert done.returncode == 0 and len(codes) == len(commands), done.stderr[-3000:]
    return [(int(c), (f / "output.txt").read_text(encoding="utf-8")) for c, (_, _, f) in zip(codes, commands)]


def test_the_packages_of_every_extra_are_hidden():
    hidden = set(optional_modules())
    for module in ("datasets", "peft", "trl", "wandb", "tensorboard", "pandas", "pyarrow"):
        assert module in hidden or not _installed(module), module
    assert not {"torch", "transformers", "scipy", "huggingface_hub", "packaging"} & hidden


def _installed(module: str) -> bool:
    return module in metadata.packages_distributions()


TOY = ["steps=2", "batch_size=8", "group_size=4", "progress=false", "generator.max_new_tokens=8",
       "trainer.micro_batch_size=8", "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=0"]
PROMPTS = ["task.name=prompts", "task.args.eval_fraction=0", "reward_model.enabled=false",
           "reward_funcs=[trlrewards:graded]"]
NEEDS_EXTRA = {  # case: (the extra, the command)
    "hub-dataset": ("data", ["dynalize.run", *PROMPTS, "task.args.train_file=hub:org/stories"]),
    "parquet": ("data", ["dynalize.run", *PROMPTS, "task.args.train_file=rows.parquet"]),
    "datasets-folder": ("data", ["dynalize.run", *PROMPTS, "task.args.train_file=saved"]),
    "lora": ("lora", ["dynalize.run", *TOY, "policy.lora={r: 4, alpha: 8}"]),
    "tracker": ("trackers", ["dynalize.run", *TOY, "report_to=[wandb]"]),
    "rm-train": ("rm", ["dynalize.rm", "train", "--base", "tiny:rm", "--pairs", "pairs.jsonl", "--out", "rm"]),
}


@pytest.fixture(scope="module")
def minimal_results(tmp_path_factory):
    """The monitor on a small log and every NEEDS_EXTRA command, run with only the core install."""
    tmp = tmp_path_factory.mktemp("minimal")
    commands = []
    for case, (_, (module, *args)) in NEEDS_EXTRA.items():
        folder = tmp / case
        folder.mkdir()
        (folder / "rows.parquet").write_bytes(b"PAR1")
        (folder / "saved").mkdir()
        (folder / "saved" / "state.json").write_text('{"_data_files": [{"filename": "data.arrow"}]}')
        (folder / "pairs.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
        commands.append((module, ["output_dir=runs", *args] if module == "dynalize.run" else args, folder))
    (tmp / "monitor").mkdir()
    rows = write_jsonl(tmp / "monitor" / "r.jsonl", hacked_rows(12))
    commands.append(("dynalize.monitor", [str(rows), "--out", "out"], tmp / "monitor"))
    results = run_minimal(tmp, commands)
    return tmp, dict(zip([*NEEDS_EXTRA, "monitor"], results))


@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_the_monitor_works_without_any_extra(minimal_results):
    tmp, results = minimal_results
    code, output = results["monitor"]
    assert code in (0, 10), output[-3000:]  # 10: a live pattern (docs/monitor.md)
    assert json.loads((tmp / "monitor" / "out" / "summary.json").read_text())["verdict"]
    assert (tmp / "monitor" / "out" / "report.html").is_file()


@pytest.mark.parametrize("case", NEEDS_EXTRA)
@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_a_command_needing_an_extra_stops_with_one_line_naming_it(minimal_results, case):
    tmp, results = minimal_results
    code, output = results[case]
    last = output.strip().splitlines()[-1] if output.strip() else ""
    assert code == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert last.endswith(f"which is not installed: pip install 'dynalize[{NEEDS_EXTRA[case][0]}]'"), last
    runs = tmp / case / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # stopped before writing a run


@pytest.mark.slow
def test_a_run_works_without_any_extra(tmp_path):
    ((code, output),) = run_minimal(tmp_path, [("dynalize.run", ["output_dir=runs", *TOY], tmp_path)])
    assert code == 0, output[-3000:]
    assert list((tmp_path / "runs").glob("*/metrics.jsonl"))
