"""`python -m dynalize.monitor` as careful as `dynalize.run`: unreadable rollouts and an unusable
`--out` give one line and exit 2, nothing is written before the input reads, and the monitor
never writes into a run, a checkpoint or the rollouts it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dynalize.monitor.__main__ import main
from dynalize.monitor.summary import INSUFFICIENT_EXIT, LIVE_EXIT

MONITORED = (0, LIVE_EXIT, INSUFFICIENT_EXIT)
"""The exit statuses of a monitor that read its input (the verdict is not what these tests check)."""
from dynalize.runlog import read_jsonl
from test_monitor import hacked_rows, write_jsonl


def run(*argv) -> int:
    return main([str(a) for a in argv] + ["--no-html"])


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _parquet(path, rows):
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)
    return path


def _torn(tmp_path):
    lines = [json.dumps(r) for r in hacked_rows(2)]
    lines[5] = lines[5][:20]  # a line cut in the middle, with more lines after it
    path = tmp_path / "torn.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, "line 6: not valid JSON"


def _huge(tmp_path):
    rows = hacked_rows(1)
    rows[2]["completion"] = "x" * 300_000
    return write_jsonl(tmp_path / "huge.jsonl", rows), "line 3: a row of 300,"


def _empty(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return tmp_path / "empty.jsonl", "has no rows"


def _array(tmp_path):
    path = tmp_path / "array.jsonl"
    path.write_text(json.dumps(hacked_rows(1)[0]) + "\n[1, 2, 3]\n")
    return path, "line 2: expected a JSON object"


def _truncated_parquet(tmp_path):
    path = _parquet(tmp_path / "cut.parquet", hacked_rows(2))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path, "not a readable parquet file"


def _garbage_parquet(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(os.urandom(3000))
    return path, "not a readable parquet file"


def _csv_extra_values(tmp_path):
    path = tmp_path / "extra.csv"
    path.write_text("step,prompt,completion,reward\n0,p,a reply,1.0\n0,p,another,0.5,surplus\n")
    return path, "line 3: more values than header columns"


UNREADABLE = [_torn, _huge, _empty, _array, _truncated_parquet, _garbage_parquet, _csv_extra_values]


@pytest.mark.parametrize("make", UNREADABLE, ids=lambda f: f.__name__.strip("_"))
def test_unreadable_rollouts_give_one_line_exit_2_and_create_no_out(tmp_path, capsys, make):
    path, problem = make(tmp_path)
    assert run(path, "--out", tmp_path / "out") == 2
    line = one_line(capsys)
    assert problem in line and str(path) in line, line
    assert not (tmp_path / "out").exists()


def test_the_size_cap_line_names_the_monitors_own_option_and_the_option_raises_it(tmp_path, capsys):
    path, _ = _huge(tmp_path)
    assert run(path, "--out", tmp_path / "out") == 2
    line = one_line(capsys)
    assert "--max-row-chars" in line and "task.args" not in line
    assert run(path, "--out", tmp_path / "out", "--max-row-chars", "400000") in MONITORED


def test_a_real_process_prints_no_traceback_for_unreadable_rollouts(tmp_path):
    for make in (_torn, _garbage_parquet):
        path, problem = make(tmp_path)
        proc = subprocess.run([sys.executable, "-m", "dynalize.monitor", str(path), "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and problem in proc.stderr and "Traceback" not in proc.stderr


def test_a_step_of_1e300_is_refused_at_the_whole_number_check(tmp_path, capsys):
    rows = hacked_rows(1)
    rows[3]["step"] = 1e300
    path = write_jsonl(tmp_path / "big.jsonl", rows)
    assert run(path, "--out", tmp_path / "out") == 2
    line = one_line(capsys)
    assert "line 4" in line and "step must be a whole number from 0 to" in line
    assert not (tmp_path / "out").exists()


def test_a_bad_input_does_not_create_out_so_the_corrected_command_is_not_refused(tmp_path, capsys):
    bad, _ = _torn(tmp_path)
    assert run(bad, "--out", tmp_path / "out", "--every", "2") == 2
    assert not (tmp_path / "out").exists()
    good = write_jsonl(tmp_path / "good.jsonl", hacked_rows(3))
    capsys.readouterr()
    assert run(good, "--out", tmp_path / "out", "--every", "2") in MONITORED
    assert "other penalty settings" not in capsys.readouterr().err


def test_an_out_that_is_a_file_gives_one_line_and_is_left_alone(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(2))
    (tmp_path / "notes.txt").write_text("keep")
    assert run(path, "--out", tmp_path / "notes.txt") == 2
    assert "exists and is not a folder" in one_line(capsys)
    assert run(path, "--out", tmp_path / "notes.txt" / "sub") == 2
    assert "is not a folder" in one_line(capsys)
    assert (tmp_path / "notes.txt").read_text() == "keep"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_gives_one_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(2))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert run(path, "--out", locked / "out") == 2
        assert "is not writable" in one_line(capsys)
    finally:
        locked.chmod(0o755)


def test_a_full_disk_gives_one_line_naming_the_file_and_the_rerun_continues_exactly(tmp_path, capsys):
    """/dev/full answers every write with ENOSPC: the monitor's state file is written through it."""
    rows = hacked_rows(6)
    path = write_jsonl(tmp_path / "r.jsonl", [r for r in rows if r["step"] < 3])
    out = tmp_path / "out"
    run(path, "--out", out)
    write_jsonl(path, rows)
    (out / ".monitor_state.json.tmp").symlink_to("/dev/full")
    capsys.readouterr()
    assert run(path, "--out", out) == 2
    line = one_line(capsys)
    assert "No space left on device" in line and "monitor_state.json" in line
    (out / ".monitor_state.json.tmp").unlink()
    run(path, "--out", out)
    run(path, "--out", tmp_path / "once")
    steps = [m["step"] for m in read_jsonl(out / "metrics.jsonl")]
    assert steps == [m["step"] for m in read_jsonl(tmp_path / "once" / "metrics.jsonl")] == list(range(6))


def _run_folder(tmp_path):
    """A dynalize run's shape: its config.yaml, metrics and a checkpoint with its manifest."""
    run_dir = tmp_path / "runs" / "r1"
    ckpt = run_dir / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("name: r1\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    (ckpt / "manifest.json").write_text("{}")
    return run_dir, ckpt


def test_an_out_inside_a_run_or_a_checkpoint_is_refused_and_nothing_is_written_there(tmp_path, capsys):
    from dynalize.checkpoint import MANIFEST
    from dynalize.runlog import MANIFEST as MARK

    assert MARK == MANIFEST
    run_dir, ckpt = _run_folder(tmp_path)
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(2))
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    for out, what in ((ckpt / "watch", "checkpoint"), (ckpt, "checkpoint"), (run_dir / "watch", "run"),
                      (run_dir, "run")):
        assert run(path, "--out", out) == 2
        assert f"inside the {what}" in one_line(capsys), out
    loose = tmp_path / "copied_checkpoint"  # a checkpoint copied out of its run is one still
    loose.mkdir()
    (loose / "manifest.json").write_text("{}")
    assert run(path, "--out", loose / "watch") == 2
    assert "inside the checkpoint" in one_line(capsys)
    trl_ckpt = tmp_path / "trl_out" / "checkpoint-500"  # a trainer rotating checkpoints deletes it whole
    trl_ckpt.mkdir(parents=True)
    (trl_ckpt / "trainer_state.json").write_text("{}")
    assert run(path, "--out", trl_ckpt / "watch") == 2
    assert "inside the checkpoint" in one_line(capsys)
    assert run(path, "--out", tmp_path / "trl_out" / "watch") in MONITORED  # beside it is fine
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


def test_an_out_inside_the_rollouts_folder_or_holding_it_is_refused(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_jsonl(logs / "r.jsonl", hacked_rows(2))
    assert run(logs, "--out", logs / "watch") == 2
    assert "inside the rollouts" in one_line(capsys)
    assert sorted(p.name for p in logs.iterdir()) == ["r.jsonl"]
    out = tmp_path / "out"
    run(logs, "--out", out)  # a monitor folder of its own, then asked to read its own files
    capsys.readouterr()
    assert run(out / "rollouts", "--out", out) == 2
    assert "holds the rollouts" in one_line(capsys)
    assert run(logs, "--out", out / "rollouts" / "nested") == 2
    assert "inside the monitor folder" in one_line(capsys)


@pytest.mark.parametrize("follow", [[], ["--follow", "--poll", "0", "--max-polls", "1"]])
def test_a_fifo_given_as_the_rollouts_is_named_as_one_not_as_missing(tmp_path, capsys, follow):
    fifo = tmp_path / "rollouts.jsonl"
    os.mkfifo(fifo)
    assert run(fifo, "--out", tmp_path / "out", *follow) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"monitor: {fifo} is not a file or a folder (a FIFO, a socket or a device): give the rollouts' " \
                      f"file or folder", err
    assert not (tmp_path / "out").exists()


def test_a_replay_does_not_depend_on_the_order_rows_are_listed_within_a_step(tmp_path):
    """The same rows, each step's rows in another order: the same patterns, since the same steps
    (before: `since` 0 against 2), and the reordered file continues the first folder."""
    import random

    rows = hacked_rows(12)
    shuffled = []
    for step in range(12):
        part = [r for r in rows if r["step"] == step]
        random.Random(step).shuffle(part)
        shuffled += part
    a, b = write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "b.jsonl", shuffled)
    assert run(a, "--out", tmp_path / "out_a", "--no-html") == run(b, "--out", tmp_path / "out_b", "--no-html")
    summary = [json.loads((tmp_path / out / "summary.json").read_text()) for out in ("out_a", "out_b")]
    assert [(p["since"], p["entered"], p["title"]) for p in summary[0]["patterns"]] == \
           [(p["since"], p["entered"], p["title"]) for p in summary[1]["patterns"]]
    assert [m["reward/mean"] for m in read_jsonl(tmp_path / "out_a" / "metrics.jsonl")] == \
           [m["reward/mean"] for m in read_jsonl(tmp_path / "out_b" / "metrics.jsonl")]
    for step_file in sorted((tmp_path / "out_a" / "rollouts").glob("step_*.jsonl")):  # the same replay, row by row
        assert step_file.read_bytes() == (tmp_path / "out_b" / "rollouts" / step_file.name).read_bytes()
    assert run(b, "--out", tmp_path / "out_a", "--no-html") in (0, LIVE_EXIT, INSUFFICIENT_EXIT)  # not "rows changed"
