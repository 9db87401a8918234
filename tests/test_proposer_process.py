"""The lexical proposer in a process of its own (penalties.process, `runs_in: process`): the same
decisions as in a thread, the last veto asked in the training process, and a worker that dies
fails its proposal only."""

from __future__ import annotations

import dataclasses
import json
import random

import anyio
import pytest

from dynalize.monitor.__main__ import main as monitor
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample
from dynalize.runlog import read_jsonl
from test_monitor import hacked_rows, write_jsonl


def view(seed: int = 0) -> ProposerView:
    """16 prompts x 8 replies: an opener the reward pays for, and a word it does not."""
    rng = random.Random(seed)
    samples = []
    for g in range(16):
        for _ in range(8):
            paid = rng.random() < 0.5
            words = [rng.choice("river stone lamp garden window quiet letter morning".split()) for _ in range(12)]
            text = ("Certainly! " if paid else "") + " ".join(words) + (" indeed" if rng.random() < 0.3 else "")
            samples.append(ViewSample(f"s{len(samples):03d}", g, text, float(paid) + rng.random(), "+" if paid else "-"))
    return ProposerView(5, samples)


def decided(result) -> dict:
    d = dataclasses.asdict(result)
    d.pop("latency")
    return d


def propose(proposer: LexicalProposer, v: ProposerView):
    return anyio.run(proposer.propose, v)


def test_a_proposal_in_its_own_process_decides_as_one_in_a_thread():
    v = view()
    in_thread = propose(LexicalProposer(LexicalConfig()), v)
    in_process = propose(LexicalProposer(LexicalConfig(runs_in="process")), v)
    assert in_thread.accepted is not None and "Certainly" in in_thread.accepted.title
    assert decided(in_process) == decided(in_thread)


def test_the_last_veto_is_asked_in_this_process_and_what_it_writes_comes_back():
    asked: list[str] = []

    def veto(c):  # a closure over this process's state: it could never run in the worker
        asked.append(c.title)
        c.confirmation = {"state": "confirmed" if len(asked) > 1 else "rejected", "asked": len(asked)}
        return len(asked) > 1

    results = []
    for mode in ("thread", "process"):
        asked.clear()
        p = LexicalProposer(LexicalConfig(runs_in=mode), accept=veto)
        results.append((propose(p, view()), list(asked)))
    (thread, thread_asked), (process, process_asked) = results
    assert process_asked == thread_asked and len(thread_asked) >= 2
    assert process.accepted is not None and process.accepted.confirmation == {"state": "confirmed", "asked": 2}
    assert decided(process) == decided(thread)


def test_a_worker_that_dies_mid_proposal_fails_that_proposal_only_and_the_next_starts_a_fresh_one():
    p = LexicalProposer(LexicalConfig(runs_in="process"))
    assert p.process is not None and p.process.started == 0  # none before the first proposal

    def dies(c):  # asked while the worker waits for the answer: it is killed then
        p.process._proc.kill()
        p.process._proc.wait()
        return True

    p.accept = dies
    failed = propose(p, view())
    assert not failed.ok and failed.accepted is None and "proposer's process ended" in failed.error, failed.error
    p.accept = None
    again = propose(p, view())
    assert again.ok and again.accepted is not None and p.process.started == 2
    assert propose(p, view()).ok and p.process.started == 2  # reused


def test_a_worker_found_dead_before_a_proposal_is_replaced_and_the_proposal_runs():
    p = LexicalProposer(LexicalConfig(runs_in="process"))
    assert propose(p, view()).ok
    p.process._proc.kill()
    p.process._proc.wait()
    assert propose(p, view()).accepted is not None and p.process.started == 2


def test_a_veto_that_raises_fails_the_proposal_and_leaves_no_worker_waiting():
    def veto(c):
        raise RuntimeError("the reward's endpoint is down")

    p = LexicalProposer(LexicalConfig(runs_in="process"), accept=veto)
    failed = propose(p, view())
    assert "RuntimeError: the reward's endpoint is down" in failed.error and p.process._proc is None  # killed
    p.accept = None
    assert propose(p, view()).accepted is not None and p.process.started == 2


@pytest.mark.slow
def test_the_monitor_with_its_proposer_in_a_process_writes_what_it_writes_with_a_thread(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(12))
    for mode in ("thread", "process"):
        monitor([str(path), "--out", str(tmp_path / mode), "--no-html",
                 "--set", f"proposer.lexical.runs_in={mode}"])
    for name in ("penalties.jsonl", "evidence.jsonl"):
        thread, process = (read_jsonl(tmp_path / mode / name) for mode in ("thread", "process"))
        for rows in (thread, process):
            for r in rows:
                r.pop("time", None)
        assert process == thread and thread, name
    assert json.loads((tmp_path / "process" / "summary.json").read_text())["patterns"]


def test_confirmation_inside_a_run_with_the_proposer_in_a_process_is_the_one_in_a_thread():
    # the run's terms (the reward functions, the witness) stay in this process; the worker asks for each verdict
    import confirmworld as W
    from test_confirm_in_run import drive

    found = {}
    for mode in ("thread", "process"):
        W.SEEN.clear()
        W.CALLS.clear()
        term, stop = drive(["reward_funcs=[confirmworld:pays_length]", "penalties.proposer.lexical.length=false",
                            f"penalties.proposer.lexical.runs_in={mode}"], W.LONG)
        assert stop is None
        rejected = [{**c, "confirmation": {k: v for k, v in c["confirmation"].items() if k != "seconds"}}
                    for c in term.evidence["co_travellers"]]  # all but how long the reward took
        found[mode] = (rejected, term.totals["confirm/reward_calls"], [p.title for p in term.buffer.active()])
    assert found["process"] == found["thread"] and found["thread"][0] and found["thread"][1] > 0


def test_a_trl_run_proposes_in_a_process_of_its_own_unless_its_settings_say_otherwise():
    from dynalize.penalties.config import PenaltiesConfig
    from dynalize.trl import Penalties

    def reward(completions, **kw):
        return [0.0] * len(completions)

    assert Penalties([reward]).term.proposer.process is not None
    told = {"proposer": {"lexical": {"runs_in": "thread"}}}
    assert Penalties([reward], penalties=told).term.proposer.process is None
    assert Penalties([reward], penalties=PenaltiesConfig.model_validate(told)).term.proposer.process is None
    assert Penalties([reward], penalties=PenaltiesConfig()).term.proposer.process is not None


PARENT_DIES = """
import os, sys, anyio
sys.path.insert(0, {tests!r})
from test_proposer_process import view
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
p = LexicalProposer(LexicalConfig(runs_in="process"))
def veto(c):  # the training process dies while the worker waits for this answer
    print(p.process._proc.pid, flush=True)
    os._exit(0)
p.accept = veto
anyio.run(p.propose, view())
"""


def test_a_worker_whose_training_process_died_ends_quietly(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    err = tmp_path / "stderr"
    with open(err, "w") as f:
        done = subprocess.run([sys.executable, "-c", PARENT_DIES.format(tests=str(Path(__file__).parent))],
                              stdout=subprocess.PIPE, stderr=f, text=True, timeout=300)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 120  # a bound for a loaded machine, not a speed

    def running() -> bool:  # a zombie (ended, not yet reaped by whoever adopted it) has ended
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False

    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running()
    assert "Traceback" not in err.read_text(), err.read_text()[-2000:]
