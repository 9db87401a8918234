"""Rubric runs a user can trust: a gold judge that failed makes the run end with exit status 4 and a
line naming it; the saved held-out replies are graded again (`eval --bench rubric`), also by a second
gold judge; every judge warning names its role."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from dynalize.eval.__main__ import main as eval_main
from dynalize.report import main as report_main
from dynalize.run import main
from dynalize.runlog import read_jsonl

from test_rubric_e2e import sample_config

REPO = Path(__file__).resolve().parent.parent


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def gold_down_config(tmp_path: Path, name: str = "down") -> dict:
    data = sample_config(tmp_path, name=name, reward_model={"enabled": False}, penalties={"enabled": False})
    data["rubric"]["gold_judge"] = {"engine": "llm", "chat": {
        "engine": "openai", "base_url": closed_port_url(), "model": "gold", "api_key_env": None,
        "timeout": 2.0, "max_retries": 0}}
    return data


def test_a_run_whose_gold_judge_is_down_ends_with_status_4_naming_the_judge(tmp_path, capsys):
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump(gold_down_config(tmp_path)))
    assert main(["--config", str(path)]) == 4
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("incomplete: ") and "gold judge (rubric.gold_judge) failed on" in last
    evals = read_jsonl(tmp_path / "down" / "eval" / "task.jsonl")
    n = int(sum(e["rubric/unscored_gold"] for e in evals))
    assert f"failed on {n} of {n} held-out replies" in last and n > 0
    assert "--bench rubric" in last
    assert "INCOMPLETE" in captured.out  # the summary says it too
    assert "role='gold judge'" in captured.err or "role=gold judge" in captured.err  # judge.call_failed


def test_a_complete_measurement_ends_with_status_0(tmp_path, capsys):
    data = sample_config(tmp_path, name="ok", reward_model={"enabled": False}, penalties={"enabled": False})
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--config", str(path)]) == 0
    assert "held-out measurement" in capsys.readouterr().out


def _strict_server_answer(body: dict) -> str:
    from rubricjudge import strict

    from dynalize.types import as_messages

    messages = as_messages(body["messages"])
    if "<reply-" not in messages[-1].content:  # the endpoint check before grading
        return "OK"
    return strict(messages)


def test_a_run_whose_gold_judge_was_down_is_graded_again_and_by_a_second_gold_judge(tmp_path, capsys):
    from faultserver import FaultServer

    from dynalize.run import incomplete_measurements

    down = {"on": True}
    server = FaultServer(_strict_server_answer, lambda body: "500" if down["on"] else None)
    with server:
        data = gold_down_config(tmp_path, "again")
        data["rubric"]["gold_judge"]["chat"]["base_url"] = server.base_url
        path = tmp_path / "again.yaml"
        path.write_text(yaml.safe_dump(data))
        assert main(["--config", str(path)]) == 4
        run = tmp_path / "again"
        assert incomplete_measurements(run)
        down["on"] = False  # the gold judge is back: grade what it failed on
        calls_before = len(server.requests)
        assert eval_main(["--run", str(run), "--bench", "rubric"]) == 0
        rows = read_jsonl(run / "eval" / "rubric.jsonl")
        evals = read_jsonl(run / "eval" / "task.jsonl")
        assert [r["step"] for r in rows] == [e.get("step", e["version"]) for e in evals]
        assert all(r["complete"] and r["rubric/unscored"] == 0 and "rubric/gold" in r for r in rows)
        replies = int(sum(r["rubric/replies"] for r in rows))
        assert len(server.requests) - calls_before == replies + 1  # each failed reply once, and the check
        assert incomplete_measurements(run) == []  # run.py no longer counts it missing
        # the verdicts are the scripted strict judge's own
        raw = read_jsonl(run / "eval" / "rubric_raw" / f"step_{rows[-1]['step']:06d}.jsonl")
        assert all(rec["gold_failed"] == [] and rec["proxy_failed"] == [] for rec in raw)
        # nothing failed now: a rerun grades nothing
        n = len(server.requests)
        assert eval_main(["--run", str(run), "--bench", "rubric"]) == 0
        assert len(server.requests) == n + 1  # the endpoint check only
    # a second, independent gold judge on the same replies (here: the lenient proxy's rule as gold)
    spec = json.dumps({"engine": "scripted", "path": "rubricjudge:lenient"})
    assert eval_main(["--run", str(run), "--bench", "rubric", "--rejudge", "lenient", "--judge", spec]) == 0
    second = read_jsonl(run / "eval" / "rubric@lenient.jsonl")
    assert [r["step"] for r in second] == [r["step"] for r in rows]
    assert all(r["rubric/gap"] == pytest.approx(0.0) for r in second)  # same rule as the proxy: no gap
    assert report_main(["rubric", str(run), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    text = (tmp_path / "rep" / "rubric_report.md").read_text()
    assert "Gold per judge" in text
    own = f"{rows[-1]['rubric/gold']:.3f}"
    lenient = f"{second[-1]['rubric/gold']:.3f}"
    table = text.split("Gold per judge")[1].split("##")[0]
    assert "the run's gold judge" in table and "| lenient" in table and own in table and lenient in table
