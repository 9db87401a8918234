"""Fault injection: whole training runs against a local OpenAI-compatible judge and proposer
(tests/faultserver.py, 127.0.0.1 only) that fail in every way a hosted API does.

What is asserted (docs/reliability.md has the table):
- a flaky API (500, 429 + Retry-After, hangs, resets, malformed and multi-MB bodies, slow
  trickles, cut JSON, invented and missing verdicts): the run finishes; exactly the verdicts the
  server never gave fail, their rollouts are `unscored` and their groups left out of the update,
  every count in metrics matches the rollout files; no bad reply is sent back whole;
- the judge down, hanging or refusing the key: the run stops after `failure_window` judged steps
  with one line, exit 3 and a checkpoint; a hanging judge is cut by its time budget; resuming
  with a working judge continues the run;
- a proposer that always fails stops the run after exactly `max_failed_proposals` failures.

Every assertion is on what the code decided (counts, verdicts, files), never on how fast it ran:
the fault plan is fixed by what is asked and how often, not by timing.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dynalize.run import main
from dynalize.runlog import read_jsonl
from faultserver import FaultServer

pytestmark = pytest.mark.slow

JUDGE_IDS = re.compile(r"exactly these keys: (.*?) \(values")
REPLY = re.compile(r"<reply-([0-9a-f]{16})>\n(.*)\n</reply-\1>", re.S)
SAMPLE = re.compile(r"^\[(s\d+)\] group (\d+) \|", re.M)
CANDIDATE = re.compile(r"^- (c\d+):", re.M)
TRANSIENT = ["500", "429", "hang", "reset", "malformed", "huge", "huge_unsized", "trickle", "big_text", "cut_json"]
PERSISTENT_EVERY = 10


def u(text: str, salt: str) -> float:
    """A uniform number in [0, 1) fixed by `text` and `salt`."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{text}".encode()).digest()[:8], "big") / 2**64


def kind(body: dict) -> str:
    required = body.get("response_format", {}).get("json_schema", {}).get("schema", {}).get("required", [])
    return {"candidates": "proposer", "duplicates": "dedup"}.get(required[0] if required else "", "judge")


def judged_reply(body: dict) -> str:
    return REPLY.search(body["messages"][1]["content"]).group(2)


class SaneModel:
    """Answers judge, proposer and dedup requests as a well-behaved model would."""

    def __init__(self):
        self.proposals = 0

    def __call__(self, body: dict) -> str:
        user = body["messages"][1]["content"]
        what = kind(body)
        if what == "judge":
            ids = JUDGE_IDS.search(user).group(1).split(", ")
            return json.dumps({i: u(judged_reply(body), i) < 0.3 for i in ids})
        if what == "dedup":
            return json.dumps({"duplicates": [{"candidate": c, "duplicate_of": None} for c in CANDIDATE.findall(user)]})
        self.proposals += 1
        by_group = {}
        for sid, group in SAMPLE.findall(user):
            by_group.setdefault(group, sid)
        n = self.proposals
        return json.dumps({"candidates": [{"title": f"Pattern number {n}", "description": f"Shows pattern {n}.",
                                           "sample_ids": list(by_group.values())[:2], "regex": None}]})


class FaultPlan:
    """Which fault a request gets, decided by what was asked and how often, never by timing. The
    judged replies are numbered in the order they first reach the server; every
    `PERSISTENT_EVERY`-th one from the first on (`persistent`) fails on every attempt (missing or
    invented verdicts, alternately), so a judged run always holds one. Any other request fails
    only the first time it is seen (the `scripted` faults first, then at `rate`), so a retry
    always goes through."""

    def __init__(self, answer: SaneModel, scripted: list[str], rate: float, seed: int = 0):
        self.answer, self.scripted, self.rate = answer, list(scripted), rate
        self.rng = random.Random(seed)
        self.seen: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.judged: dict[str, int] = {}  # judged reply → its number, in order of first arrival
        self.persistent: set[str] = set()  # the judged replies that never get a verdict

    def __call__(self, body: dict) -> str | None:
        judge = kind(body) == "judge"
        key = judged_reply(body) if judge else json.dumps(body["messages"][:2])
        self.seen[key] += 1
        if judge:
            n = self.judged.setdefault(key, len(self.judged))
            if n % PERSISTENT_EVERY == 0:
                self.persistent.add(key)
                self.injected["persistent"] += 1
                return "{}" if (n // PERSISTENT_EVERY) % 2 == 0 else '{"p999": true}'
        if self.seen[key] > 1:
            return None
        fault = self.scripted.pop(0) if self.scripted else (
            self.rng.choice(TRANSIENT) if self.rng.random() < self.rate else None)
        if fault is not None:
            self.injected[fault] += 1
        if fault == "big_text":
            return "Sure! " + "no json here " * 12_000  # ~150 KB, under the size cap, not JSON
        if fault == "cut_json":
            return self.answer(body)[:-3]
        return fault


def toy(tmp_path: Path, steps: int, *extra: str) -> list[str]:
    return [f"output_dir={tmp_path}", "name=run", f"steps={steps}", "batch_size=16", "group_size=4",
            "progress=false", "generator.max_new_tokens=12", "trainer.lr=1e-3", "trainer.micro_batch_size=16",
            "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=0", "eval_every=0",
            "policy.path=tiny:policy", "torch_threads=1", "penalties.enabled=true", "penalties.view_groups=4",
            "penalties.view_per_group=2", "preflight=false", *extra]  # these faults start in the run


def chat(role: str, url: str, **kw) -> list[str]:
    settings = {"engine": "openai", "base_url": url, "model": "fault", "api_key_env": None, "timeout": 20.0,
                "max_retries": 3, "retry_wait": 0.05, "max_response_bytes": 200_000, **kw}
    prefix = f"penalties.{role}"
    return [f"{prefix}.engine=llm", *(f"{prefix}.chat.{k}={json.dumps(v)}" for k, v in settings.items())]


@contextmanager
def closed_port_url() -> Iterator[str]:
    """A URL whose port refuses connections: bound for the whole `with`, never listening, so no
    other process (or test) can take the port meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def stopped(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("stopped: "), err[-5:]
    return err[-1]


# --- a flaky API: the run finishes, and every failure is accounted for ------------------------------

def test_flaky_api_run_finishes_and_counts_exactly_the_verdicts_never_given(tmp_path, capsys):
    answer = SaneModel()
    plan = FaultPlan(answer, TRANSIENT, rate=0.1)
    # hangs and trickles far past the 5 s deadline, so the deadline cuts them however loaded the machine
    with FaultServer(answer, plan, hang_s=60, trickle_s=60, huge_bytes=1_000_000) as server:
        # One step whose end waits for its proposal (through the scripted faults): the last
        # checkpoint holds the accepted penalty, so the extended run judges from its first step
        # on, however fast the proposer was against the steps.
        argv = toy(tmp_path, 1, "penalties.every=1", "penalties.judge.max_failure_rate=0.6",
                   "penalties.finish_timeout=600", "max_left_out_rate=null",
                   *chat("judge", server.base_url, timeout=5.0), *chat("proposer", server.base_url, timeout=5.0))
        assert main(argv) == 0, capsys.readouterr().err[-3000:]
        run = tmp_path / "run"
        assert read_jsonl(run / "metrics.jsonl")[-1]["proposer/pending"] == 1
        capsys.readouterr()
        assert main(["--resume", str(run), "steps=6"]) == 0, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert all(m["judge/verdicts"] > 0 for m in metrics[1:])
    assert all(plan.injected[f] >= 1 for f in TRANSIENT) and plan.injected["persistent"] >= 1, plan.injected

    judged = failed_total = 0
    for m in metrics:
        rollouts = read_jsonl(run / "rollouts" / f"step_{m['step']:06d}.jsonl")
        for r in rollouts:
            if not r["verdicts"]:
                continue
            judged += 1
            never_given = r["replies"][0] in plan.persistent
            assert bool(r["judge_failed"]) == never_given, r["replies"][0]  # a retry recovered every other fault
            failed_total += len(r["judge_failed"])
        failing = [r for r in rollouts if r["judge_failed"]]
        assert all(r["unscored"] == ["penalties"] for r in failing)
        assert all(not r.get("unscored") for r in rollouts if not r["judge_failed"])
        failing_groups = {r["group"] for r in failing}
        left_out = [r for r in rollouts if r.get("left_out")]
        assert {r["group"] for r in left_out} == failing_groups and len(left_out) == 4 * len(failing_groups)
        assert m.get("left_out", 0) == len(left_out)
        assert m["judge/failed_verdicts"] == sum(len(r["judge_failed"]) for r in rollouts)
        if failing_groups and len(failing_groups) < 4:  # the update used the other groups only
            assert m["advantage/abs_mean"] >= 0 and "loss" in m
    last = metrics[-1]
    assert judged >= 32 and failed_total >= 1
    assert last["judge/failed_verdicts_total"] == failed_total
    assert last["left_out_total"] == sum(m.get("left_out", 0) for m in metrics) > 0
    assert f"{failed_total} of {int(last['judge/verdicts_total'])}" in out  # the summary table
    assert max(r["size"] for r in server.requests) < 40_000  # a 150 KB bad reply went back cut


def test_nothing_the_proposer_accepted_is_lost_under_latency(tmp_path):
    answer = SaneModel()
    plan = FaultPlan(answer, [], rate=0.3, seed=1)
    with FaultServer(answer, plan, hang_s=1.2, trickle_s=1.2, huge_bytes=1_000_000) as server:
        argv = toy(tmp_path, 10, "penalties.every=1", "penalties.judge.max_failure_rate=null", "max_left_out_rate=null",
                   "penalties.finish_timeout=600",  # the end waits: at least one proposal lands
                   "task.args.rm_delay=0.25", *chat("judge", server.base_url), *chat("proposer", server.base_url))
        assert main(argv) == 0
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    total = {k: sum(m.get(k, 0) for m in metrics) for k in
             ("proposer/accepted", "penalties/adds", "penalties/revives", "proposer/apply_refused")}
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_000010" / "state.json").read_text())
    pending = state["terms"]["penalties"].get("pending")
    waiting = len(pending) if isinstance(pending, list) else int(pending is not None)
    assert total["proposer/accepted"] >= 1  # how many land during the run depends on timing: not asserted
    assert total["proposer/accepted"] == (total["penalties/adds"] + total["penalties/revives"]
                                          + total["proposer/apply_refused"] + waiting), total


# --- the judge down, hanging, or refusing the key: stop, with a bounded step time -------------------

def judged_steps(run: Path) -> list[dict]:
    return [m for m in read_jsonl(run / "metrics.jsonl") if m.get("judge/verdicts")]


def test_judge_down_stops_the_run_within_a_bounded_step_time_then_resumes(tmp_path, capsys):
    with FaultServer(SaneModel()) as proposer_server, closed_port_url() as down:
        judge = chat("judge", down, max_retries=2, retry_wait=0.2, max_concurrency=2)
        argv = toy(tmp_path, 6, "penalties.every=4", "penalties.sync=true", "penalties.judge.failure_window=2",
                   "penalties.judge.reasks=0",  # one call's retry schedule (a re-ask runs a second one)
                   *judge, *chat("proposer", proposer_server.base_url))
        assert main(argv) == 3
        line = stopped(capsys)
        run = tmp_path / "run"
        steps = judged_steps(run)
        assert len(steps) == 2 and read_jsonl(run / "metrics.jsonl")[-1]["step"] == steps[-1]["step"]
        assert line.startswith("stopped: the judge failed 32 of 32 verdicts (100%) over the last 2 judged steps")
        assert f"last error: EngineError: chat request to {down}/chat/completions failed after 3 attempt(s)" in line
        for m in steps:
            assert m["left_out"] == 16 and "loss" not in m  # no update from unjudged rollouts
            assert m["judge/failed_verdicts"] == 16
        ckpt = run / "checkpoints" / f"step_{steps[-1]['step']:06d}"  # the row's step: steps completed
        assert (ckpt / "manifest.json").exists()

        fixed = f"penalties.judge.chat.base_url={json.dumps(proposer_server.base_url)}"
        assert main(["--resume", str(run), fixed]) == 0
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert all(m.get("left_out", 0) == 0 for m in metrics if m["step"] > steps[-1]["step"])


def test_a_hanging_judge_is_cut_by_its_time_budget(tmp_path, capsys):
    with FaultServer(SaneModel()) as proposer_server, FaultServer(SaneModel(), lambda b: "hang", hang_s=20) as hung:
        argv = toy(tmp_path, 4, "penalties.every=4", "penalties.sync=true", "penalties.judge.failure_window=1",
                   "penalties.judge.time_budget_s=1.0", *chat("judge", hung.base_url, timeout=30.0),
                   *chat("proposer", proposer_server.base_url))
        assert main(argv) == 3
        line = stopped(capsys)
    [m] = judged_steps(tmp_path / "run")
    # the budget cut them: a judge that waited out the 20 s hang (its timeout is 30 s) would have had
    # 16 valid answers
    assert m["judge/timed_out"] == 16 and m["judge/failed_verdicts"] == 16
    assert "last error: no verdict within the judge's time budget (1.0s per step)" in line


def test_a_missing_api_key_stops_the_run_naming_the_401(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DYNALIZE_MISSING_KEY", raising=False)
    with FaultServer(SaneModel()) as proposer_server, FaultServer(SaneModel(), api_key="sk-real") as guarded:
        argv = toy(tmp_path, 4, "penalties.every=4", "penalties.sync=true", "penalties.judge.failure_window=1",
                   *chat("judge", guarded.base_url, api_key_env="DYNALIZE_MISSING_KEY"),
                   *chat("proposer", proposer_server.base_url))
        assert main(argv) == 3
        err = capsys.readouterr().err
    assert "openai.no_api_key" in err and "DYNALIZE_MISSING_KEY" in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("stopped: the judge failed 16 of 16 verdicts") and "HTTP 401" in line, line


def test_a_proposer_that_always_fails_stops_the_run(tmp_path, capsys):
    with FaultServer(SaneModel(), lambda b: "500") as broken:
        argv = toy(tmp_path, 10, "penalties.every=1", "penalties.proposer.max_failed_proposals=2",
                   *chat("proposer", broken.base_url, max_retries=1, retry_wait=0.01))
        assert main(argv) == 3
        line = stopped(capsys)
    assert line.startswith("stopped: the proposer failed its last 2 proposals "
                           "(penalties.proposer.max_failed_proposals=2); last error: EngineError: chat request to")
    assert "failed after 2 attempt(s): HTTP 500" in line
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    # exact: the run stops at the end of the step in which the second failure landed, and no
    # proposal starts after it, however fast the proposer fails against the steps
    assert metrics[-1]["proposer/failed_total"] == 2 == metrics[-1]["proposer/finished_total"]
    assert sum(m.get("proposer/started", 0) for m in metrics) == 2
