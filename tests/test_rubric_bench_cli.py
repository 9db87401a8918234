"""`python -m dynalize.eval --bench healthbench|researchqa` on a tiny policy's checkpoints with a
fake grader on 127.0.0.1: the official data file, every grader reply kept, a failed grading
redone alone on a rerun, exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import dynalize.eval.__main__ as eval_cli
from dynalize import tiny
from test_eval_runs import ChatServer, plain_logging  # noqa: F401 - the fixture resets logging

FIXTURES = Path(__file__).parent / "fixtures"
DOWN = {"on": False}


def tiny_run(tmp_path: Path, steps=(2,)) -> Path:
    run = tmp_path / "run"
    for step in steps:
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        shutil.copytree(tiny.resolve("tiny:policy"), ckpt / "policy")
        (ckpt / "state.json").write_text("{}")
    return run


def hb_reply(body):
    user = body["messages"][-1]["content"]
    if "# Rubric item" not in user:
        return "OK"  # the endpoint check
    if DOWN["on"] and "dismissive" in user:
        return "not json"
    item = user.split("# Rubric item\n", 1)[1].split("\n", 1)[0]
    return json.dumps({"explanation": "scripted", "criteria_met": item.startswith("[-") is False})


def rq_reply(body):
    if "Questions:" not in body["messages"][-1]["content"]:
        return "OK"
    n = body["messages"][-1]["content"].split("Questions:\n", 1)[1].split("\n\nOutput:", 1)[0].count("\n") + 1
    return "\n".join(["Mostly"] * n)


def args(run, bench, url, *extra):
    data = FIXTURES / ("healthbench/examples.jsonl" if bench == "healthbench" else "researchqa/test.json")
    judge = json.dumps({"engine": "openai", "base_url": url, "model": "grader", "max_retries": 0})
    return ["--run", str(run), "--bench", bench, "--data", str(data), "--judge", judge, "--max-tokens", "4",
            "--no-progress", "--log-level", "ERROR", *extra]


@pytest.mark.slow
def test_healthbench_on_tiny_checkpoints_with_a_grader_on_localhost(tmp_path, capsys):
    run = tiny_run(tmp_path)
    with ChatServer(hb_reply) as server:
        DOWN["on"] = True
        try:
            assert eval_cli.main(args(run, "healthbench", server.url, "--attempts", "2")) == 1
        finally:
            DOWN["on"] = False
        assert "rerun the same command" in capsys.readouterr().err
        first = [json.loads(x) for x in (run / "eval" / "healthbench.jsonl").read_text().splitlines()][-1]
        assert first["complete"] is False and first["counts"]["failed_items"] == 1
        assert first["score"] == 1.0  # hb-a alone: every positive met, the pitfall not: 8 / 8
        calls = len(server.calls())
        assert eval_cli.main(args(run, "healthbench", server.url, "--attempts", "2")) == 0
        assert len(server.bodies) - 1 - calls == 2  # the endpoint check, then the one failed item
    row = [json.loads(x) for x in (run / "eval" / "healthbench.jsonl").read_text().splitlines()][-1]
    # hb-b: 2 + 4.0 met of 6, the pitfall not: 1.0; both examples 1.0
    assert row["complete"] and row["score"] == 1.0 and row["metrics"]["overall_score:n_samples"] == 2
    assert row["settings"]["judge"]["sampling"] == {"temperature": 0.5, "max_tokens": 2048}
    raw = [json.loads(x) for x in (run / "eval" / "healthbench_raw" / "step_000002.jsonl").read_text().splitlines()]
    item = next(i for r in raw for i in r["rubric_items"] if "dismissive" in i["criterion"])
    assert item["grader_replies"][:2] == ["not json", "not json"] and item["criteria_met"] is False
    assert all(isinstance(r["completion"], str) for r in raw)
    body = server.bodies[1]
    assert body["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}


@pytest.mark.slow
def test_researchqa_on_tiny_checkpoints_with_a_grader_on_localhost(tmp_path):
    run = tiny_run(tmp_path)
    with ChatServer(rq_reply) as server:
        assert eval_cli.main(args(run, "researchqa", server.url)) == 0
        bodies = server.calls()
    row = json.loads((run / "eval" / "researchqa.jsonl").read_text().splitlines()[-1])
    assert row["score"] == 0.75 and row["counts"]["scored"] == 4 and row["complete"]
    assert len(bodies) == 2 + 1 + 1 + 1  # rq-1's 10 items in 8 + 2
    assert all(b["temperature"] == 0 and "max_tokens" not in b and len(b["messages"]) == 1 for b in bodies)


def test_data_benches_need_data(capsys):
    with pytest.raises(SystemExit):
        eval_cli.main(["--run", "x", "--bench", "healthbench", "--judge", "{}"])
    assert "needs --data" in capsys.readouterr().err


def test_heldout_grades_a_rubric_runs_saved_replies_without_a_policy(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    rows = [{"prompt_id": "hb-a", "prompt": [{"role": "user", "content": "headache?"}], "replies": ["Rest."],
             "reasoning": ["hm"]},
            {"prompt_id": "hb-a", "prompt": [{"role": "user", "content": "headache?"}], "replies": ["Sleep."]},
            {"prompt_id": "hb-b", "prompt": [{"role": "user", "content": "chest?"}], "replies": ["See a doctor."]},
            {"prompt_id": "other", "prompt": [{"role": "user", "content": "?"}], "replies": ["x"]}]
    (run / "rollouts" / "eval_000004.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ChatServer(hb_reply) as server:
        assert eval_cli.main(args(run, "healthbench", server.url, "--heldout")) == 1  # a prompt not graded: an error
        bodies = server.calls()
    assert "1 held-out prompts of the run are not in the data file" in capsys.readouterr().err
    row = json.loads((run / "eval" / "healthbench_heldout.jsonl").read_text())
    assert row["step"] == 4 and row["complete"] and row["counts"]["examples"] == 3 and row["score"] == 1.0
    assert row["metrics"]["overall_score:n_samples"] == 3 and row["settings"]["heldout"] is True
    raw = [json.loads(x) for x in (run / "eval" / "healthbench_heldout_raw" / "step_000004.jsonl").read_text().splitlines()]
    assert [(r["prompt_id"], r["sample"], r["completion"]) for r in raw] == \
        [("hb-a", 0, "Rest."), ("hb-a", 1, "Sleep."), ("hb-b", 0, "See a doctor.")]
    assert len(bodies) == 3 + 3 + 3
    assert any("# Conversation\nuser: headache?\n\nassistant: Rest.\n" in b["messages"][1]["content"] for b in bodies)
