"""The monitor's state grows with the step, not with the run: saving step t writes what step t
holds (its view and a digest line, beside a small state file), the proposer's window is all the
views kept on disk, and a replay interrupted at any step and continued equals one made in one go."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest

from dynalize.monitor.__main__ import main
from dynalize.monitor.readers import read_rollouts, by_step
from dynalize.monitor.replay import Monitor
from dynalize.monitor.state import STATE_DIR
from dynalize.penalties.config import PenaltiesConfig
from dynalize.runlog import read_jsonl
from test_monitor import hacked_rows, write_jsonl

IO = Path("/proc/self/io")


def written_bytes() -> int:
    """Bytes this process has handed to write() so far (Linux: /proc/self/io `wchar`)."""
    return int(dict(line.split(": ") for line in IO.read_text().splitlines())["wchar"])


def _counted() -> bool:
    try:
        return written_bytes() >= 0
    except (OSError, KeyError, ValueError):
        return False


@pytest.mark.skipif(not _counted(), reason="counts the bytes written through /proc/self/io (Linux)")
def test_saving_a_step_writes_what_that_step_holds_however_long_the_run(tmp_path):
    rows = hacked_rows(40)
    steps = by_step(read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows)))
    m = Monitor(tmp_path / "out", PenaltiesConfig(enabled=True, every=5, view_steps=5, view_groups=64,
                                                  view_per_group=64))
    m.start({"rollouts": "r.jsonl"})
    per_save: dict[int, int] = {}
    save = m.save

    def measured(step=None):
        before = written_bytes()
        save(step)
        per_save[step] = written_bytes() - before

    m.save = measured

    async def replay():
        for s, members in steps.items():
            await m.step(s, members)

    anyio.run(replay)
    step_size = {s: (tmp_path / "out" / "rollouts" / f"step_{s:06d}.jsonl").stat().st_size for s in (12, 35, 39)}
    # a step's save: its own view (written once, about the size of its rollouts) and a small state,
    # not the proposer's window of five views
    assert all(per_save[s] < step_size[s] * 1.5 for s in (12, 35, 39)), (per_save, step_size)
    # and what it writes does not grow with the steps already monitored
    assert abs(per_save[39] - per_save[12]) < 0.1 * step_size[39], per_save
    kept = sorted(p.name for p in (tmp_path / "out" / STATE_DIR / "views").iterdir())
    assert kept == [f"step_{s:06d}.json" for s in range(35, 40)]


def _decided(folder: Path, name: str) -> list[dict]:
    """A file's lines without what is measured rather than decided (latencies)."""
    return [{k: v for k, v in r.items() if "latency" not in k} for r in read_jsonl(folder / name)]


def test_a_replay_interrupted_at_several_steps_and_continued_equals_one_made_in_one_go(tmp_path):
    rows = hacked_rows(24, seed=5)
    full = write_jsonl(tmp_path / "full.jsonl", rows)
    assert main([str(full), "--out", str(tmp_path / "once"), "--no-html"]) != 2
    grow = tmp_path / "grow.jsonl"
    for upto in (1, 4, 5, 9, 13, 20, 24):  # before, at and after proposals (every 5 steps)
        write_jsonl(grow, [r for r in rows if r["step"] < upto])
        assert main([str(grow), "--out", str(tmp_path / "twice"), "--no-html"]) != 2
    once, twice = tmp_path / "once", tmp_path / "twice"
    for name in ("metrics.jsonl", "penalties.jsonl", "evidence.jsonl", "rollouts/step_000023.jsonl"):
        assert _decided(once, name) == _decided(twice, name), name
    assert json.loads((once / "summary.json").read_text()) == json.loads((twice / "summary.json").read_text())
    assert any(e["event"] == "add" for e in read_jsonl(once / "penalties.jsonl"))
    # the same state on disk: the window's views and the steps' digests
    for part in ("views/step_000023.json", "views/step_000019.json", "reference.json", "steps.jsonl"):
        assert (once / STATE_DIR / part).read_bytes() == (twice / STATE_DIR / part).read_bytes(), part
    assert len(os.listdir(twice / STATE_DIR / "views")) == 5


def test_a_crash_between_a_steps_files_and_its_state_monitors_that_step_again(tmp_path):
    """The view and digest line of a step whose state was never saved (the disk filled up at its
    state file) are not taken for it: the step is monitored again, from its rows as they are then."""
    rows = hacked_rows(8)
    path = write_jsonl(tmp_path / "r.jsonl", [r for r in rows if r["step"] < 6])
    out = tmp_path / "out"
    main([str(path), "--out", str(out), "--no-html"])
    write_jsonl(path, rows)
    (out / ".monitor_state.json.tmp").symlink_to("/dev/full")
    assert main([str(path), "--out", str(out), "--no-html"]) == 2
    (out / ".monitor_state.json.tmp").unlink()
    assert (out / STATE_DIR / "views" / "step_000006.json").exists()
    changed = [dict(r, reward=r["reward"] + (1.0 if r["step"] == 6 else 0.0)) for r in rows]
    write_jsonl(path, changed)
    main([str(path), "--out", str(out), "--no-html"])
    main([str(path), "--out", str(tmp_path / "once"), "--no-html"])
    for name in ("metrics.jsonl", "penalties.jsonl"):
        assert _decided(out, name) == _decided(tmp_path / "once", name), name
    assert [r["step"] for r in read_jsonl(out / STATE_DIR / "steps.jsonl")] == list(range(8))
    for s in (6, 7):
        assert (out / STATE_DIR / "views" / f"step_{s:06d}.json").read_bytes() == \
            (tmp_path / "once" / STATE_DIR / "views" / f"step_{s:06d}.json").read_bytes()


def test_a_folder_of_the_previous_state_version_continues_exactly(tmp_path):
    """monitor_state.json version 1 held everything inline; a continued monitor reads it, then
    saves apart, and ends where one made in one go does."""
    from dynalize.rewards.penalties import view_state

    rows = hacked_rows(12, seed=2)
    path = write_jsonl(tmp_path / "r.jsonl", [r for r in rows if r["step"] < 7])
    out = tmp_path / "out"
    main([str(path), "--out", str(out), "--no-html"])
    m = Monitor.load(out)
    state = json.loads((out / "monitor_state.json").read_text())
    term = m.term.state_dict()
    state.update(version=1, done={str(k): v for k, v in m.done.items()}, term=term)
    del state["last"], state["steps"]
    assert term["recent"] == [view_state(v) for v in m.term.recent]
    (out / "monitor_state.json").write_text(json.dumps(state))
    shutil.rmtree(out / STATE_DIR)
    write_jsonl(path, rows)
    main([str(path), "--out", str(out), "--no-html"])
    main([str(path), "--out", str(tmp_path / "once"), "--no-html"])
    for name in ("metrics.jsonl", "penalties.jsonl", "evidence.jsonl"):
        assert _decided(out, name) == _decided(tmp_path / "once", name), name


def test_a_rollout_the_judge_could_not_score_is_recorded_as_unscored_by_the_penalties(tmp_path):
    """A verdict the judge failed to give: the step's rollouts file says which term left it unscored
    (before, the monitor stored True where a run stores term names, and writing the step raised)."""
    from dynalize.rewards.base import TermScores

    steps = by_step(read_rollouts(write_jsonl(tmp_path / "r.jsonl", hacked_rows(2))))
    m = Monitor(tmp_path / "out", PenaltiesConfig(enabled=True, every=5, view_steps=5, view_groups=64,
                                                  view_per_group=64))
    m.start({"rollouts": "r.jsonl"})

    async def judge_fails_on_the_first(batch):
        n = len(batch.rollouts)
        return TermScores([0.0] * n, [{} for _ in range(n)], unscored=[True] + [False] * (n - 1))

    m.term.score = judge_fails_on_the_first

    async def replay():
        for s, members in steps.items():
            await m.step(s, members)

    anyio.run(replay)
    first = read_jsonl(tmp_path / "out" / "rollouts" / f"step_{min(steps):06d}.jsonl")
    assert [r["unscored"] for r in first if r.get("unscored")] == [["penalties"]], first[0]
