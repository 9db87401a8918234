"""`python -m dynalize.eval` as a user runs it, with fake policies (no model is loaded) and judges
that are scripted or real HTTP servers on 127.0.0.1: judge settings that take effect and are
recorded, failed judgements that are judged again on a rerun, exit codes, an endpoint tried before
any generation, judging saved generations again with another judge, and step selection."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import structlog
import yaml
from structlog.testing import capture_logs

import dynalize.eval.__main__ as eval_cli
from dynalize.eval.common import BenchmarkError
from dynalize.eval.models import chat_model_from_spec, role_model
from test_eqbench import FIXTURES as EQ_FIXTURES
from test_eqbench import FakePolicy, judge_by_reply, recorded
from test_mindeval import FIXTURES as ME_FIXTURES
from test_mindeval import FakeClinician
from test_mindeval import recorded as me_recorded

ROOT = Path(__file__).parent.parent


class ChatServer:
    """Chat completions on 127.0.0.1: `reply(body)` answers; every request's body and headers are kept."""

    def __init__(self, reply):
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.bodies.append(body)
                server.headers.append(dict(self.headers))
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply(body)}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def calls(self) -> list[dict]:
        """The bodies of the real calls (the endpoint check asks for 16 tokens first)."""
        assert self.bodies and self.bodies[0]["max_tokens"] == 16
        return self.bodies[1:]


@pytest.fixture(autouse=True)
def plain_logging():
    """The CLI configures structlog for its level; later tests see every level again."""
    yield
    structlog.reset_defaults()


def sampling_of(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("model", "messages")}


def fake_run(tmp_path: Path, steps=(2,)) -> Path:
    run = tmp_path / "run"
    for step in steps:
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        (ckpt / "policy").mkdir(parents=True)
        (ckpt / "policy" / "config.json").write_text("{}")
        (ckpt / "state.json").write_text("{}")
    return run


@pytest.fixture
def loads(monkeypatch):
    """Checkpoints load as fake EQ-Bench writers; `loads` lists the paths loaded."""
    seen: list[str] = []

    def load(path, **kw):
        seen.append(path)
        return FakePolicy()

    monkeypatch.setattr(eval_cli, "load_policy", load)
    return seen


def scripted(fn: str) -> str:
    return json.dumps({"engine": "scripted", "path": f"test_eval_runs:{fn}"})


def eq_args(run: Path, judge: str, *extra: str) -> list[str]:
    return ["--run", str(run), "--bench", "eqbench", "--bench-dir", str(EQ_FIXTURES), "--judge", judge,
            "--iterations", "2", "--no-progress", "--log-level", "ERROR", *extra]


def rows(run: Path, name: str = "eqbench") -> list[dict]:
    return [json.loads(line) for line in (run / "eval" / f"{name}.jsonl").read_text().splitlines()]


# --- judge settings take effect, are checked, and are recorded --------------------------------

def test_eqbench_judge_calls_follow_the_benchmark_unless_the_spec_says_otherwise(tmp_path, loads, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run = fake_run(tmp_path)
    with ChatServer(lambda body: recorded("judge_clean")) as server:
        spec = json.dumps({"base_url": server.url, "model": "judge"})
        assert eval_cli.main(eq_args(run, spec)) == 0
        assert {json.dumps(sampling_of(b)) for b in server.calls()} == {json.dumps(
            {"temperature": 0.0, "max_tokens": 1000, "min_p": 0.1})}
        assert all("authorization" not in {k.lower() for k in h} for h in server.headers)  # local: no key
    assert rows(run)[0]["settings"]["judge"]["sampling"] == {"temperature": 0.0, "max_tokens": 1000, "min_p": 0.1}
    assert rows(run)[0]["settings"]["judge"]["timeout"] == 240.0

    run2 = fake_run(tmp_path / "b")
    with ChatServer(lambda body: recorded("judge_clean")) as server:
        spec = json.dumps({"base_url": server.url, "model": "judge", "temperature": 0.2, "max_tokens": 300,
                           "min_p": None, "top_p": 0.95, "seed": 7, "reasoning_effort": "high"})
        assert eval_cli.main(eq_args(run2, spec)) == 0
        want = {"temperature": 0.2, "max_tokens": 300, "top_p": 0.95, "seed": 7, "reasoning_effort": "high"}
        assert all(sampling_of(b) == want for b in server.calls())  # min_p: null is not sent
    assert rows(run2)[0]["settings"]["judge"]["sampling"] == {**want, "min_p": None}


def test_mindeval_patient_and_judge_calls_follow_the_benchmark(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_cli, "load_policy", lambda path, **kw: FakeClinician())
    run = fake_run(tmp_path)
    with ChatServer(lambda b: "Fine, I guess.") as patient, ChatServer(lambda b: me_recorded("judge_full")) as judge:
        args = ["--run", str(run), "--bench", "mindeval", "--bench-dir", str(ME_FIXTURES), "--no-progress",
                "--judge", json.dumps({"base_url": judge.url, "model": "j", "api_key_env": None}),
                "--patient", json.dumps({"base_url": patient.url, "model": "p", "temperature": 0.7}),
                "--log-level", "ERROR"]
        assert eval_cli.main(args) == 0
        # the benchmark's: 16000 tokens, no temperature (the server's default); a spec's value wins
        assert all(sampling_of(b) == {"max_tokens": 16000} for b in judge.calls())
        assert all(sampling_of(b) == {"max_tokens": 16000, "temperature": 0.7} for b in patient.calls())
        assert len(judge.calls()) == 2 and len(patient.calls()) == 20
    row = rows(run, "mindeval")[0]
    assert row["score"] == pytest.approx(3.7) and row["complete"] is True
    assert row["settings"]["judge"]["sampling"] == {"temperature": None, "max_tokens": 16000}
    assert row["settings"]["patient"]["sampling"] == {"temperature": 0.7, "max_tokens": 16000}


@pytest.mark.parametrize("spec, message", [
    ({"engine": "hf", "path": "tiny:chat", "base_url": "http://127.0.0.1:1/v1"},
     "--judge: base_url has no effect with the hf engine"),
    ({"engine": "hf", "path": "tiny:chat", "reasoning_effort": "high"},
     "--judge: reasoning_effort is not applied by the hf engine"),
    ({"engine": "scripted", "path": "m:f", "timeout": 5}, "--judge: timeout has no effect with the scripted engine"),
    ({"base_url": "http://127.0.0.1:1/v1", "model": "j", "max_completion_tokens": 10},
     "--judge: unknown key 'max_completion_tokens'"),
    ({"base_url": "http://127.0.0.1:1/v1", "model": "j", "temperature": -1}, "--judge: temperature:"),
    ({"base_url": "http://127.0.0.1:1/v1", "model": "j", "min_p": 2}, "--judge: min_p:"),
    ({"engine": "nope"}, "--judge: unknown engine 'nope'"),
])
def test_a_spec_value_that_would_not_take_effect_is_refused_in_one_line(spec, message):
    with pytest.raises(BenchmarkError) as e:
        role_model(json.dumps(spec), "--judge", {"temperature": 0.0}, concurrency=4, timeout=60.0)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_local_endpoint_needs_no_key_and_gets_no_warning(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for url, warned in (("http://127.0.0.1:8000/v1", False), ("http://localhost:8000/v1", False),
                        ("http://10.1.2.3:8000/v1", False), ("https://judge.example.com/v1", True)):
        with capture_logs() as logs:
            role_model(json.dumps({"base_url": url, "model": "j"}), "--judge", {}, concurrency=4, timeout=60.0)
        assert any(e["event"] == "openai.no_api_key" for e in logs) is warned, url
    with capture_logs() as logs:  # a remote endpoint without a key, said so; the audit's judge as the benchmarks'
        role_model(json.dumps({"base_url": "https://judge.example.com/v1", "model": "j", "api_key_env": None}),
                   "--judge", {}, concurrency=4, timeout=60.0)
        chat_model_from_spec(json.dumps({"base_url": "http://127.0.0.1:8000/v1", "model": "j"}), "--judge", 4)
    assert not logs
    # the official client never sends min_p to api.openai.com (which refuses it); we neither
    role = role_model(json.dumps({"base_url": "https://api.openai.com/v1", "model": "j", "api_key_env": None}),
                      "--judge", {"temperature": 0.0, "min_p": 0.1}, concurrency=4, timeout=60.0)
    assert role.sampling == {"temperature": 0.0, "min_p": None}


def test_shipped_judge_and_patient_configs_build(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for name in ("judge", "patient"):
        path = ROOT / "configs" / f"{name}.yaml"
        assert yaml.safe_load(path.read_text())["engine"] == "openai"
        role = role_model(str(path), f"--{name}", {"max_tokens": 16000}, concurrency=4, timeout=600.0)
        assert role.public["base_url"].startswith("http://127.0.0.1")
    assert "configs/judge.yaml" in (ROOT / "docs" / "evaluation.md").read_text()


# --- a failed judge is not a result ------------------------------------------------------------

JUDGE_DOWN = {"x": False}
JUDGE_CALLS: list[str] = []


def flaky_judge(messages):
    """judge_by_reply, except that the "afraid of water" piece fails while JUDGE_DOWN["x"]."""
    JUDGE_CALLS.append(messages[-1].content)
    if JUDGE_DOWN["x"] and "x" * 600 in messages[-1].content:
        raise ConnectionError("judge down")
    return judge_by_reply(messages)


def dead_judge(messages):
    raise ConnectionError("judge down")


def other_judge(messages):
    return recorded("judge_clean")


def test_failed_judgements_are_judged_again_on_a_rerun_without_generating(tmp_path, loads, capsys):
    JUDGE_CALLS.clear()
    whole = fake_run(tmp_path / "whole")
    assert eval_cli.main(eq_args(whole, scripted("flaky_judge"))) == 0

    run = fake_run(tmp_path / "cut")
    JUDGE_DOWN["x"] = True
    try:
        assert eval_cli.main(eq_args(run, scripted("flaky_judge"))) == 1
    finally:
        JUDGE_DOWN["x"] = False
    first = rows(run)[0]
    assert first["complete"] is False and first["failed"] == 1 and first["counts"]["judge_errors"] == 1
    assert "1 judge or patient call(s) failed; rerun the same command" in capsys.readouterr().err
    generated = len(loads)

    JUDGE_CALLS.clear()
    assert eval_cli.main(eq_args(run, scripted("flaky_judge"))) == 0
    assert len(loads) == generated  # nothing generated again
    assert len(JUDGE_CALLS) == 1 and "x" * 600 in JUDGE_CALLS[0]  # only the failed piece
    final = rows(run)[-1]
    assert final["complete"] is True and final["score"] == rows(whole)[0]["score"]
    saved = lambda r: (r / "eval" / "eqbench_raw" / "step_000002.jsonl").read_text()
    assert saved(run) == saved(whole)  # the same records as an evaluation that never failed
    assert eval_cli.main(eq_args(run, scripted("flaky_judge"))) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_dead_judge_stops_after_the_first_checkpoint(tmp_path, loads, capsys):
    run = fake_run(tmp_path, steps=(2, 4))
    assert eval_cli.main(eq_args(run, scripted("dead_judge"))) == 1
    assert [r["step"] for r in rows(run)] == [2] and rows(run)[0]["score"] is None
    assert len(loads) == 1  # step 4 was never generated
    assert "step 2: 3 judge or patient call(s) failed" in capsys.readouterr().err


def test_an_unreachable_judge_stops_before_any_generation(tmp_path, loads, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    run = fake_run(tmp_path)
    spec = json.dumps({"base_url": f"http://127.0.0.1:{port}/v1", "model": "j", "max_retries": 0})
    assert eval_cli.main(eq_args(run, spec)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --judge: http://127.0.0.1:{port}/v1 did not answer a test request")
    assert "\n" not in err
    assert loads == [] and not (run / "eval").exists()


def test_a_checkpoint_is_not_finished_with_another_judge(tmp_path, loads, capsys):
    run = fake_run(tmp_path)
    assert eval_cli.main(eq_args(run, scripted("dead_judge"))) == 1
    assert eval_cli.main(eq_args(run, scripted("other_judge"))) == 2
    assert "step 2 was begun with another --judge" in capsys.readouterr().err


def always_short(path, **kw):
    class Short(FakePolicy):
        async def sample(self, conversations, sampling):
            return ["<think>" + "r" * 900 + "</think>Too short." for _ in conversations]
    return Short()


def test_every_piece_too_short_is_said_loudly_and_the_text_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_cli, "load_policy", always_short)
    run = fake_run(tmp_path)
    assert eval_cli.main(eq_args(run, scripted("other_judge"))) == 1
    row = rows(run)[0]
    assert row["score"] is None and row["complete"] is True and row["counts"]["too_short"] == 4
    err = capsys.readouterr().err
    assert "eqbench step 2: no score" in err and "eqbench step 2: every piece (4) was shorter than 500" in err
    assert row["warnings"][0].startswith("every piece (4) was shorter than 500 characters")
    raw = [json.loads(line) for line in (run / "eval" / "eqbench_raw" / "step_000002.jsonl").read_text().splitlines()]
    assert {r["response"] for r in raw} == {"Too short."} and all(len(r["reasoning"]) == 907 for r in raw)


def test_steps_name_checkpoints_that_exist(tmp_path, loads, capsys):
    run = fake_run(tmp_path, steps=(2, 4))
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--steps", "3")) == 2
    assert "--steps: no complete checkpoint at step 3 (this run has: 2, 4)" in capsys.readouterr().err
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--every", "3")) == 2
    assert "--every 3: no complete checkpoint at a multiple of 3 (this run has: 2, 4)" in capsys.readouterr().err
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--steps", "4")) == 0
    assert [r["step"] for r in rows(run)] == [4]


# --- several judges on the same generations ----------------------------------------------------

def test_rejudge_rates_the_saved_pieces_with_another_judge(tmp_path, loads, monkeypatch):
    run = fake_run(tmp_path, steps=(2, 4))
    assert eval_cli.main(eq_args(run, scripted("flaky_judge"))) == 0
    generated = len(loads)
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--rejudge", "clean")) == 0
    assert len(loads) == generated
    first, again = rows(run), rows(run, "eqbench@clean")
    assert [r["step"] for r in again] == [2, 4] and first[0]["score"] != again[0]["score"]
    assert again[0]["score"] == 67.0  # judge_clean on every piece: 13.4 x 5
    assert again[0]["settings"]["judge"]["path"] == "test_eval_runs:other_judge"
    assert again[0]["settings"]["generations"] == "eval/eqbench_raw/step_000002.jsonl"
    src = [json.loads(x) for x in (run / "eval" / "eqbench_raw" / "step_000002.jsonl").read_text().splitlines()]
    new = [json.loads(x) for x in (run / "eval" / "eqbench@clean_raw" / "step_000002.jsonl").read_text().splitlines()]
    assert [r["response"] for r in new] == [r["response"] for r in src]
    assert {r["judge_raw"] for r in new if r["status"] == "scored"} == {recorded("judge_clean")}
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--rejudge", "bad label")) == 2


def test_rejudge_waits_for_a_complete_first_evaluation(tmp_path, loads, capsys):
    run = fake_run(tmp_path)
    assert eval_cli.main(eq_args(run, scripted("dead_judge"))) == 1
    assert eval_cli.main(eq_args(run, scripted("other_judge"), "--rejudge", "b")) == 2
    assert "--rejudge: the evaluation of step 2 in" in capsys.readouterr().err
    assert not (run / "eval" / "eqbench@b.jsonl").exists()


def judge_partial(messages):
    return me_recorded("judge_partial")


def test_rejudge_rates_saved_mindeval_conversations_without_the_patient(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_cli, "load_policy", lambda path, **kw: FakeClinician())
    run = fake_run(tmp_path)
    base = ["--run", str(run), "--bench", "mindeval", "--bench-dir", str(ME_FIXTURES), "--no-progress",
            "--log-level", "ERROR"]
    patient = json.dumps({"engine": "scripted", "path": "test_mindeval:patient_reply"})
    assert eval_cli.main([*base, "--judge", json.dumps({"engine": "scripted", "path": "test_mindeval:judge_full"}),
                          "--patient", patient]) == 0
    monkeypatch.setattr(eval_cli, "load_policy", lambda path, **kw: pytest.fail("nothing is generated"))
    assert eval_cli.main([*base, "--judge", scripted("judge_partial"), "--rejudge", "partial"]) == 0
    first, again = rows(run, "mindeval")[0], rows(run, "mindeval@partial")[0]
    assert first["score"] == pytest.approx(3.7) and again["score"] == pytest.approx(3.6)
    src = (run / "eval" / "mindeval_raw" / "step_000002.jsonl").read_text().splitlines()
    new = (run / "eval" / "mindeval@partial_raw" / "step_000002.jsonl").read_text().splitlines()
    assert [json.loads(x)["interaction"] for x in new] == [json.loads(x)["interaction"] for x in src]
    assert "patient" not in again["settings"]
