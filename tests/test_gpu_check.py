"""The GPU check (benchmarks/gpu_check.sh) and its carried wheels (scripts/gpu_wheels.py), on the CPU.

The check runs when a GPU machine is lent, which is rare: its dry run (the same command and code
on a tiny model) runs here, so the day a GPU is there the check still works. The lent machine has
no network, so the wheels it lacks travel with the work tree; `install` must add exactly those.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import regex

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_wheels  # noqa: E402


def make_wheel(folder: Path, dist: str, version: str, requires: list[str] = (), module: str | None = None,
               extra: dict[str, str] | None = None) -> Path:
    """A minimal pure-Python wheel, written by hand (pip installs it from the file, no index)."""
    info = f"{dist}-{version}.dist-info"
    files = {**(extra or {}),
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            dist, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if module:
        files[f"{module}.py"] = "VALUE = 42\n"
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}\n" for name, text in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            z.writestr(name, text)
    return path


def test_install_adds_only_the_wheels_this_python_lacks(tmp_path, capsys):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    make_wheel(wheels, "dynalize_probe_pkg", "0.1", requires=["rich>=999", "dynalize-absent-pkg"],
               module="dynalize_probe_mod")
    make_wheel(wheels, "rich", "0.0.1", module="rich_shadow")  # rich is installed: never shadowed

    assert gpu_wheels.install(target, wheels) == 0

    assert (target / "dynalize_probe_mod.py").read_text() == "VALUE = 42\n"
    assert not (target / "rich_shadow.py").exists()
    out = capsys.readouterr().out
    assert "install dynalize-probe-pkg 0.1" in out and "have    rich" in out
    assert "needs rich>=999" in out  # what the machine has may be older than a carried wheel wants
    assert "needs dynalize-absent-pkg: not installed, not carried" in out


def test_without_pip_a_wheel_is_unpacked_as_pip_would_lay_it_out(tmp_path):
    wheel = make_wheel(tmp_path, "dynalize_probe_pkg", "0.1", module="dynalize_probe_mod", extra={
        "dynalize_probe_pkg-0.1.data/purelib/probe_data_mod.py": "X = 1\n",
        "dynalize_probe_pkg-0.1.data/scripts/probe-cli": "echo probe\n"})
    gpu_wheels.unpack(wheel, tmp_path / "site")
    site = tmp_path / "site"
    assert (site / "dynalize_probe_mod.py").read_text() == "VALUE = 42\n"
    assert (site / "probe_data_mod.py").read_text() == "X = 1\n"  # .data/purelib goes to the top
    assert (site / "dynalize_probe_pkg-0.1.dist-info" / "METADATA").is_file()  # importlib.metadata finds it
    assert not list(site.rglob("probe-cli"))


def test_machine_closure_keeps_out_what_the_machine_is_known_to_lack():
    have = gpu_wheels.machine_closure()
    assert {"torch", "transformers", "huggingface-hub", "numpy"} <= have
    assert not {gpu_wheels.canonical(n) for n in gpu_wheels.MACHINE_LACKS} & have
    assert "pydantic-core" not in have  # required only by pydantic, which the machine lacks


@pytest.mark.slow
@pytest.mark.timeout(1700)
def test_gpu_check_dry_run_measures_both_frameworks_penalties_and_memory(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_CHECK_SITE": str(tmp_path / "site"),
           "PYTHONPATH": str(ROOT), "GPU_CHECK_TIMEOUT": "1500"}  # 4 training runs and 8 processes on a loaded CPU
    run = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]

    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) == 1 for f in files), files  # what the device tool brings back
    log = (out / "gpu_check.log").read_text()
    assert (out / "summary.txt").read_text().strip().splitlines()[-1] in log  # what is printed is in the log

    results = json.loads((out / "results.json").read_text())
    assert all(p["ok"] for p in results["parts"].values()), results["parts"]
    assert results["model"]["vocab_size"] == 8192  # the tokenizer padded to the model's vocabulary
    names = ["dynalize fast (async_level 1)", "dynalize plain (async_level 1)", "TRL GRPOTrainer (default)",
             "TRL GRPOTrainer (continuous batching)"]
    assert list(results["frameworks"]) == names
    for name in names:
        r = results["frameworks"][name]
        assert r["steps"] == 2 and r["step_mean"] > 0 and r["tokens_per_s"] > 0, (name, r)
        assert 0 < r["mean_len"] <= 16 and r["phases"]["generate"] > 0 and r["first_generate_s"] > 0
        assert r["peak_allocated_gib"] is None  # no GPU here
    fast, default = results["frameworks"][names[0]], results["frameworks"][names[2]]
    ratio = fast["tokens_per_s"] / default["tokens_per_s"]
    assert f"{ratio:.2f}× ({'met' if ratio >= 3 else 'NOT met'})" in log  # the target's verdict from the numbers
    steps = [json.loads(line) for line in (out / "trl_steps.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all(s["rest"] > 0 for s in steps)
    assert len((out / "dynalize_metrics.jsonl").read_text().splitlines()) == 3  # 1 warm-up + 2 measured

    cells = results["memory"]["cells"]
    assert len(cells) == 2 * (2 + 2) and not [c for c in cells if "error" in c]  # generation at 2 vocabularies, + 2 parts
    assert {c["part"] for c in cells} == {"generation", "learner", "rm"} and {c["framework"] for c in cells} == {"dynalize", "trl"}
    assert json.loads((out / "memory.json").read_text())["cells"] == cells
    assert all(c["peak_minus_weights_mib"] > 0 for c in cells)
    assert "generation, dynalize, 16 new tokens: peak at V 16,384 / at V 8,192" in log

    pen = results["penalties"]
    added = pen["added"]
    assert added and added[0]["proposed_at"] == 1 and added[0]["step"] in (2, 3), added  # in the background
    at = added[0]["step"] - 1  # the row (0-based) of the step it came in
    pattern = regex.compile(added[0]["regex"])
    assert pattern.search(f"so {pen['planted_word']} it is")  # the proposer found the planted word
    assert [s["penalties/active"] for s in pen["steps"]] == [0] * at + [1] * (3 - at)
    assert [s["judge/verdicts"] for s in pen["steps"]] == [0] * at + [64] * (3 - at)  # every reply, from then on
    for line in (out / "penalty_rollouts.jsonl").read_text().splitlines():  # the last step, judged
        r = json.loads(line)
        hit = pattern.search(r["replies"][0]) is not None
        assert r["verdicts"][added[0]["id"]] is hit
        assert r["reward"] == pytest.approx(r["rm_score"] - 0.5 * r["violations"])
