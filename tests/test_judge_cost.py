"""Judge cost and pacing: the tokens an OpenAI-compatible server reports (`usage`) are added up per
model and reported per role and step; requests-per-minute and tokens-per-minute limits decide
when a request may go (checked with an injected clock against a real 127.0.0.1 server)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest

from dynalize.backends.openai import OpenAIChatModel
from dynalize.backends.ratelimit import RateLimiter
from dynalize.cost import TokenMeter


class UsageServer:
    """Answers every chat request with "ok" and a `usage` of `prompt` + `completion` tokens."""

    def __init__(self, prompt: int = 40, completion: int = 20, answer=None):
        self.requests = 0
        answer = answer or (lambda body: "ok")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.requests += 1
                body = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer(request)}}],
                                   "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                             "total_tokens": prompt + completion}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeClock:
    """Time that moves only when the limiter sleeps; the sleeps it asked for."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def _calls(model: OpenAIChatModel, n: int) -> None:
    for _ in range(n):
        assert await model.chat([{"role": "user", "content": "hi"}]) == "ok"
    await model.close()


def test_usage_is_added_up_per_model_and_reported_per_role_and_step():
    with UsageServer(prompt=40, completion=20) as server:
        model = OpenAIChatModel(server.base_url, "judge", api_key_env=None)
        meter = TokenMeter({"gold judge": model, "proxy judge": None})
        anyio.run(_calls, model, 3)
        first = meter.metrics()
        anyio.run(_calls, model, 1)
        second = meter.metrics()
    assert model.usage == {"requests": 4, "prompt_tokens": 160, "completion_tokens": 80}
    assert first == {"tokens/gold_judge/prompt": 120.0, "tokens/gold_judge/prompt_total": 120.0,
                     "tokens/gold_judge/completion": 60.0, "tokens/gold_judge/completion_total": 60.0}
    assert second["tokens/gold_judge/prompt"] == 40.0 and second["tokens/gold_judge/prompt_total"] == 160.0
    resumed = TokenMeter({"gold judge": OpenAIChatModel(server.base_url, "judge", api_key_env=None)})
    resumed.load_state_dict(meter.state_dict())  # totals go on across a resume
    assert resumed.metrics()["tokens/gold_judge/completion_total"] == 80.0


def test_a_requests_per_minute_limit_holds_the_third_request_until_the_first_leaves_the_window():
    clock = FakeClock()
    with UsageServer() as server:
        model = OpenAIChatModel(server.base_url, "judge", api_key_env=None,
                                rate_limiter=RateLimiter(requests_per_minute=2, clock=clock, sleep=clock.sleep))
        anyio.run(_calls, model, 3)
        assert server.requests == 3
    assert clock.sleeps == [pytest.approx(60.0)]  # no time passed between the calls: a whole window


def test_a_tokens_per_minute_limit_waits_while_the_last_minute_used_it_up():
    clock = FakeClock()
    with UsageServer(prompt=40, completion=20) as server:  # 60 tokens a request
        model = OpenAIChatModel(server.base_url, "judge", api_key_env=None,
                                rate_limiter=RateLimiter(tokens_per_minute=100, clock=clock, sleep=clock.sleep))
        anyio.run(_calls, model, 2)  # 0 then 60 tokens in the window: both go at once
        assert clock.sleeps == []
        anyio.run(_calls, model, 1)  # 120 ≥ 100: wait for the first request's 60 to leave
        assert clock.sleeps == [pytest.approx(60.0)]


def test_the_limiter_decides_from_the_window_alone():
    lim = RateLimiter(requests_per_minute=3, tokens_per_minute=1000)
    lim.starts.extend([0.0, 10.0, 20.0])
    assert lim.wait_time(30.0) == pytest.approx(30.0)  # the start at 0 leaves at 60
    assert lim.wait_time(61.0) == 0.0
    lim.tokens.extend([(61.0, 600), (70.0, 500)])
    assert lim.wait_time(75.0) == pytest.approx(46.0)  # 1100 ≥ 1000 until the 600 leave at 121
    assert RateLimiter().wait_time(0.0) == 0.0


def test_rate_limits_are_chat_model_settings():
    from dynalize.build import build_chat_model

    model = build_chat_model({"engine": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                              "api_key_env": None, "requests_per_minute": 500, "tokens_per_minute": 200000})
    assert model.rate is not None and (model.rate.rpm, model.rate.tpm) == (500, 200000)
    assert build_chat_model({"engine": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                             "api_key_env": None}).rate is None


def test_a_rubric_run_reports_its_gold_judges_tokens_per_step_in_the_summary_and_the_report(tmp_path, capsys):
    import yaml
    from test_rubric_e2e import sample_config
    from test_rubric_trust import _strict_server_answer

    from dynalize.report import main as report_main
    from dynalize.run import main
    from dynalize.runlog import read_jsonl

    with UsageServer(prompt=300, completion=7, answer=_strict_server_answer) as server:
        data = sample_config(tmp_path, name="cost", reward_model={"enabled": False}, penalties={"enabled": False})
        data["rubric"]["gold_judge"] = {"engine": "llm", "chat": {"engine": "openai", "base_url": server.base_url,
                                                                  "model": "gold", "api_key_env": None}}
        path = tmp_path / "cost.yaml"
        path.write_text(yaml.safe_dump(data))
        assert main(["--config", str(path)]) == 0
        calls = server.requests - 1  # the preflight's one request is made before the run's first step
    metrics = read_jsonl(tmp_path / "cost" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    per_step = [m["tokens/gold_judge/prompt"] for m in metrics]
    assert per_step[0] > 0 and per_step[1] == 0 and per_step[2] > 0  # the gold judge grades at evaluations only
    assert sum(per_step) == metrics[-1]["tokens/gold_judge/prompt_total"] == 300 * calls
    assert metrics[-1]["tokens/gold_judge/completion_total"] == 7 * calls
    assert not any(k.startswith("tokens/proxy_judge") for k in metrics[-1])  # scripted: no API cost
    out = capsys.readouterr().out
    assert f"prompt {300 * calls:,}" in out and "tokens: gold judge" in out  # (rich may wrap the cell)
    assert report_main(["rubric", str(tmp_path / "cost"), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    text = (tmp_path / "rep" / "rubric_report.md").read_text()
    assert "Judge cost" in text and f"| gold judge | {300 * calls:,} | {7 * calls:,} |" in text
