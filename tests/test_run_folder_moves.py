"""A run writes only into the folder it locked: a run folder renamed mid-run (and a new folder made
at its path) is followed, the step and a checkpoint are written where it went, and the run stops
with one line naming both paths (exit 3); the new folder receives nothing. A folder removed
mid-run is one line, exit 2. Real run processes (`python -m dynalize.run`). Before: the run went
on writing checkpoints into the new folder, without its lock and without a config.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynalize.runlog import read_jsonl

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def run_process(tmp_path: Path, reward: str, *extra: str) -> subprocess.CompletedProcess:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Say {w}.", "answer": w}) + "\n"
                            for w in ["one", "two", "three", "four"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "MOVE_AT_STEP": "2",
           "RUN_FOLDER": str(tmp_path / "runs" / "x")}
    argv = [sys.executable, "-m", "dynalize.run", "--log-level", "ERROR", f"output_dir={tmp_path / 'runs'}", "name=x",
            "steps=4", "batch_size=8", "group_size=4", "progress=false", "generator.max_new_tokens=8",
            "task.name=prompts", f"task.args.train_file={rows}", "task.args.eval_fraction=0",
            "reward_model.enabled=false", "checkpoint_every=0", "torch_threads=1",
            f"reward_funcs=[movingrewards:{reward}]", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_run_folder_renamed_mid_run_is_followed_checkpointed_there_and_the_run_stops(tmp_path):
    done = run_process(tmp_path, "renames_the_run_folder")
    err = done.stderr.strip().splitlines()
    old, new = tmp_path / "runs" / "x", tmp_path / "runs" / "x.old"
    assert done.returncode == 3, done.stderr
    assert not any("Traceback" in line for line in err)
    assert err[-1] == (f"stopped: the run folder {old} was moved to {new} while the run was writing it (and {old} is "
                   f"another folder now, which the run does not touch): the run went on writing into {new}, the folder "
                   f"it holds (stopped after step 2; checkpoint written: fix the cause, then --resume {new})"), err
    assert list(old.iterdir()) == []  # the new folder at the old path received nothing
    assert [r["step"] for r in read_jsonl(new / "metrics.jsonl")] == [1, 2]
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == ["step_000002"]
    assert (new / "config.yaml").is_file()
    resumed = subprocess.run([sys.executable, "-m", "dynalize.run", "--log-level", "ERROR", "--resume", str(new)],
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
                                  "MOVE_AT_STEP": "0", "RUN_FOLDER": str(old)},
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_jsonl(new / "metrics.jsonl")] == [1, 2, 3, 4]
    assert list(old.iterdir()) == []


@pytest.mark.slow
def test_a_run_folder_removed_mid_run_is_one_line(tmp_path):
    done = run_process(tmp_path, "removes_the_run_folder")
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert err == [f"error: file system error: the run folder {tmp_path / 'runs' / 'x'} was removed while the run was "
                   f"writing it (or moved where it cannot be found): nothing more can be saved, the run stops"], err
    assert not (tmp_path / "runs" / "x").exists()
