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
