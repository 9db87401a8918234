"""One writer per folder: two processes started together on one run folder (two new runs of one
name, two resumes of one run) or one monitor folder, both standing past the "is it in use?" point
at once (tests/racer.py): exactly one writes, the other stops with one line and exit 2 naming the
holder's pid. A process killed with -9 leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynalize.folderlock import FolderInUse, hold_folder
from dynalize.monitor.summary import INSUFFICIENT_EXIT, LIVE_EXIT
from dynalize.runlog import read_jsonl

REPO = Path(__file__).resolve().parent.parent
RACER = Path(__file__).parent / "racer.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
       "TOKENIZERS_PARALLELISM": "false"}


def toy(root: Path, name: str = "run", steps: int = 2) -> list[str]:
    return [f"output_dir={root}", f"name={name}", f"steps={steps}", "batch_size=8", "group_size=4",
            "progress=false", "generator.max_new_tokens=8", "trainer.micro_batch_size=8",
            "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=1",
            "policy.path=tiny:policy", "penalties.enabled=false", "eval_every=0", "export_final=false"]


def race(barrier: Path, target: str, command: str, *argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """Start one racer per argv at once, each waiting at `target`; once every one has arrived or some
    have ended (refused before that point), let them go; their results, in order."""
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, str(RACER), str(barrier), target, command, *argv], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    deadline = time.monotonic() + 300
    while len(list(barrier.glob("*.arrived"))) + sum(p.poll() is not None for p in procs) < len(procs):
        assert time.monotonic() < deadline, "the racers neither arrived nor ended"
        time.sleep(0.05)
    (barrier / "go").touch()
    results = []
    for p, argv in zip(procs, argvs):
        out, err = p.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return results


def one_winner(results: list[subprocess.CompletedProcess], what: str, done: tuple[int, ...] = (0,)) -> None:
    """Exactly one racer exits 2 with one line: `what` in use, by the winner's pid; the other ends
    as a finished command does (`done`: 0, or a monitor's verdicts)."""
    codes = [r.returncode for r in results]
    assert sorted(c == 2 for c in codes) == [False, True] and set(codes) - {2} <= set(done), \
        [(r.returncode, r.stderr[-2000:]) for r in results]
    loser = next(r for r in results if r.returncode == 2)
    lines = loser.stderr.strip().splitlines()
    assert "in use by another process (pid" in lines[-1] and what in lines[-1], lines[-3:]
    assert "Traceback" not in loser.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_two_new_runs_of_one_name_started_together_write_one_run(tmp_path):
    results = race(tmp_path / "barrier", "dynalize.build.build_parts", "dynalize.run",
                   *[["--log-level", "ERROR", *toy(tmp_path / "runs")]] * 2)
    one_winner(results, "run folder")
    steps = [r["step"] for r in read_jsonl(tmp_path / "runs" / "run" / "metrics.jsonl")]
    assert steps == sorted(set(steps)) and len(steps) == 2


@pytest.mark.slow
@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_two_resumes_of_one_run_started_together_continue_it_once(tmp_path):
    root = tmp_path / "runs"
    first = subprocess.run([sys.executable, "-m", "dynalize.run", "--log-level", "ERROR", *toy(root, steps=1)],
                           env=ENV, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    resume = ["--log-level", "ERROR", "--resume", str(root / "run"), "steps=2"]
    one_winner(race(tmp_path / "barrier", "dynalize.build.build_parts", "dynalize.run", resume, resume),
               "run folder")
    assert [r["step"] for r in read_jsonl(root / "run" / "metrics.jsonl")] == [1, 2]  # each step once


@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_two_monitors_on_one_out_started_together_monitor_once(tmp_path):
    rows = [{"step": s, "prompt": f"question {g}", "completion": f"reply {g} {i} at {s}", "reward": float(i)}
            for s in range(3) for g in range(4) for i in range(4)]
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    argv = [str(source), "--out", str(tmp_path / "mon"), "--no-html"]
    one_winner(race(tmp_path / "barrier", "dynalize.monitor.replay.Monitor.start", "dynalize.monitor.__main__",
                    argv, argv), "monitor folder", done=(0, LIVE_EXIT, INSUFFICIENT_EXIT))
    assert [r["step"] for r in read_jsonl(tmp_path / "mon" / "metrics.jsonl")] == [0, 1, 2]


HOLD = "import sys; from dynalize.folderlock import hold_folder; hold_folder(sys.argv[1]); print('held', flush=True); " \
       "sys.stdin.read()"


def test_a_lock_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "runs" / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"in use by another process \(pid {holder.pid}\)"):
            hold_folder(folder)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    lock = hold_folder(folder)  # the kernel dropped the dead process's lock
    assert lock.held
    lock.release()


def test_a_folder_made_for_a_refused_run_is_removed_and_one_holding_files_is_kept(tmp_path):
    with pytest.raises(ValueError), hold_folder(tmp_path / "a" / "b"):
        raise ValueError("bad input")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError), hold_folder(tmp_path / "c"):
        (tmp_path / "c" / "metrics.jsonl").write_text("{}\n")
        raise ValueError("failed after writing")
    assert (tmp_path / "c" / "metrics.jsonl").is_file()


def test_overwrite_keeps_the_fresh_folder_locked(tmp_path):
    from dynalize.runlog import move_aside

    lock = hold_folder(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    moved = lock.replace_aside(move_aside)
    assert (moved / "metrics.jsonl").is_file() and not any((tmp_path / "run").iterdir())
    with pytest.raises(FolderInUse):
        hold_folder(tmp_path / "run")
    lock.release()
    hold_folder(tmp_path / "run").release()


def test_dynalize_train_on_a_folder_another_holds_raises_folder_in_use(tmp_path):
    import dynalize

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "runs" / "run")], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        overrides = dict(o.split("=", 1) for o in toy(tmp_path / "runs"))
        with pytest.raises(FolderInUse, match=rf"run folder .* is in use by another process \(pid {holder.pid}\)"):
            dynalize.train(None, log_level=None, **overrides)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)


def test_a_file_system_that_cannot_lock_a_folder_is_used_with_a_warning(tmp_path, monkeypatch):
    import errno
    import fcntl

    from structlog.testing import capture_logs

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with capture_logs() as logs:
        lock = hold_folder(tmp_path / "nfs")
    assert [e["event"] for e in logs] == ["folderlock.unsupported"] and (tmp_path / "nfs").is_dir()
    lock.release()
