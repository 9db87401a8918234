"""The monitor reads a JSONL log one step at a time (dynalize/monitor/stream.py): it holds one
step's rows whatever the run's length, and `--follow` reads only what was appended since its
last poll."""

from __future__ import annotations

import gc
import json

import dynalize.tasks.data as task_data
from dynalize.monitor.__main__ import Watch, main, parse_args
from dynalize.monitor.readers import MonitoredRollout
from dynalize.monitor.replay import Monitor
from dynalize.runlog import read_jsonl
from test_monitor import hacked_rows, write_jsonl

PER_STEP = 48  # hacked_rows: 8 prompts x 6 replies


def run(*argv) -> int:
    return main([str(a) for a in argv] + ["--no-html"])


class CountingJson:
    """dynalize.tasks.data's `json`, counting the lines it parses."""

    def __init__(self):
        self.lines = 0

    def loads(self, text, *a, **kw):
        self.lines += 1
        return json.loads(text, *a, **kw)

    def __getattr__(self, name):
        return getattr(json, name)


def test_a_one_off_replay_holds_one_steps_rows_whatever_the_runs_length(tmp_path, monkeypatch):
    def alive() -> int:
        gc.collect()  # a count of live rows, not of garbage the collector has not reached yet
        return sum(type(o) is MonitoredRollout for o in gc.get_objects())

    before = alive()  # rows an earlier test in this process may still hold
    held = []
    step = Monitor.step

    async def counting(self, s, rows):
        held.append(alive() - before)
        return await step(self, s, rows)

    monkeypatch.setattr(Monitor, "step", counting)
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(30))
    run(path, "--out", tmp_path / "out")
    assert len(held) == 30
    assert max(held) <= 2 * PER_STEP, held  # the step monitored and the next one's first row, not 30 steps


def test_a_bad_row_past_the_first_step_keeps_the_steps_before_it_and_the_fixed_log_continues(tmp_path, capsys):
    rows = hacked_rows(6)
    lines = [json.dumps(r) for r in rows]
    lines[4 * PER_STEP + 3] = lines[4 * PER_STEP + 3][:30]  # a torn line in step 4
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert run(path, "--out", tmp_path / "out") == 2
    assert f"line {4 * PER_STEP + 4}: not valid JSON" in capsys.readouterr().err.strip().splitlines()[-1]
    assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2, 3]
    write_jsonl(path, rows)
    assert run(path, "--out", tmp_path / "out") != 2
    assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]


def test_a_row_of_an_earlier_step_after_a_later_ones_is_refused_with_one_line(tmp_path, capsys):
    rows = hacked_rows(4)
    rows.append(dict(rows[0]))  # a row of step 0 after step 3's
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    assert run(path, "--out", tmp_path / "out") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"line {4 * PER_STEP + 1}: a row of step 0 after the rows of step 3" in line and "step order" in line


def test_follow_parses_only_the_lines_appended_since_its_last_poll(tmp_path, monkeypatch):
    rows = hacked_rows(9)
    path = write_jsonl(tmp_path / "r.jsonl", rows[:6 * PER_STEP])
    counting = CountingJson()
    monkeypatch.setattr(task_data, "json", counting)
    watch = Watch(parse_args([str(path), "--out", str(tmp_path / "out"), "--follow", "--poll", "0", "--no-html"]))
    try:
        watch.poll()
        assert counting.lines == 6 * PER_STEP
        assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2, 3, 4]
        counting.lines = 0
        new = "".join(json.dumps(r) + "\n" for r in rows[6 * PER_STEP:8 * PER_STEP])
        with open(path, "a", encoding="utf-8") as f:
            f.write(new + json.dumps(rows[8 * PER_STEP])[:25])  # two steps, and half a line
        watch.poll()
        assert counting.lines == 2 * PER_STEP  # not the whole log again
        assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")][-2:] == [5, 6]
        counting.lines = 0
        with open(path, "a", encoding="utf-8") as f:  # the half line completed, and the rest of step 8
            f.write(json.dumps(rows[8 * PER_STEP])[25:] + "\n"
                    + "".join(json.dumps(r) + "\n" for r in rows[8 * PER_STEP + 1:]))
        watch.poll()
        watch.poll()  # quiet: the newest step is complete
        assert counting.lines == PER_STEP
        assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == list(range(9))
    finally:
        watch.release()
