"""OpenAIChatModel against a real local HTTP server that injects faults from a script."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from dynalize.backends.base import EngineError
from dynalize.backends.chat import chat_json
from dynalize.backends.config import ChatModelConfig
from dynalize.build import build_chat_model
from dynalize.backends.openai import OpenAIChatModel
from dynalize.types import Message

KEY = "sk-test-SECRET-0123456789abcdef"
MSGS = [Message("system", "You are terse."), Message("user", "Say hi.")]


class FakeServer:
    """Chat-completions on 127.0.0.1; `script` holds one fault per request, then plain OK replies."""

    def __init__(self):
        self.script: list[str] = []
        self.requests: list[dict] = []  # {"t", "headers", "body"}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(n)
                server.requests.append({"t": time.monotonic(), "path": self.path,
                                        "headers": dict(self.headers), "body": json.loads(raw)})
                action = server.script.pop(0) if server.script else "ok"
                try:
                    server.respond(self, action)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def respond(self, h: BaseHTTPRequestHandler, action: str) -> None:
        if action == "hang":
            time.sleep(1.0)
            action = "ok"
        if action == "ok":
            n = len(self.requests)
            payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"reply {n}"}}]})
            self._send(h, 200, payload)
        elif action == "badjson":
            self._send(h, 200, '{"choices": [{"message": {"content": "trunc')
        elif action == "500":
            self._send(h, 500, '{"error": "boom"}')
        elif action == "429":
            self._send(h, 429, '{"error": "slow down"}', {"Retry-After": "1"})
        elif action == "400":  # a hostile server that echoes the Authorization header back
            self._send(h, 400, json.dumps({"error": f"bad request; you sent {h.headers.get('Authorization')}"}))
        else:
            raise AssertionError(action)

    @staticmethod
    def _send(h, status: int, body: str, headers: dict | None = None) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)


@pytest.fixture
def server():
    s = FakeServer()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("DYNALIZE_TEST_KEY", KEY)


def make(server: FakeServer, **kw) -> OpenAIChatModel:
    args = dict(api_key_env="DYNALIZE_TEST_KEY", timeout=0.3, max_retries=3, retry_wait=0.01)
    return OpenAIChatModel(server.base_url, "tiny-judge", **{**args, **kw})


def call(model: OpenAIChatModel, **sampling) -> str:
    async def main():
        try:
            return await model.chat(MSGS, **sampling)
        finally:
            await model.close()
    return anyio.run(main)


def test_ok_request_shape_and_auth(server):
    model = make(server, default_sampling={"temperature": 0.0, "max_tokens": 99})
    assert call(model, temperature=0.7, top_p=0.9, min_p=0.05, seed=7) == "reply 1"
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    body = req["body"]
    assert body["model"] == "tiny-judge"
    assert body["messages"] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    sampled = (body["temperature"], body["top_p"], body["min_p"], body["seed"], body["max_tokens"])
    assert sampled == (0.7, 0.9, 0.05, 7, 99)
    assert "response_format" not in body


def test_no_key_env_sends_no_authorization(server):
    model = make(server, api_key_env=None)
    assert call(model) == "reply 1"
    assert "Authorization" not in server.requests[0]["headers"]


@pytest.mark.parametrize("fault", ["500", "badjson", "hang"])
def test_transient_fault_then_ok(server, fault):
    server.script = [fault]
    assert call(make(server)) == "reply 2"
    assert len(server.requests) == 2


def test_429_honours_retry_after(server):
    server.script = ["429"]
    t0 = time.monotonic()
    assert call(make(server)) == "reply 2"
    first, second = server.requests
    assert second["t"] - first["t"] >= 0.95
    assert time.monotonic() - t0 < 5


def test_400_raises_at_once_without_leaking_key(server):
    server.script = ["400"]
    with capture_logs() as logs, pytest.raises(EngineError) as err:
        call(make(server))
    assert len(server.requests) == 1
    text = str(err.value)
    assert "HTTP 400" in text and "\n" not in text
    assert "Bearer ***" in text and KEY not in text
    assert KEY not in repr(logs)


def test_gives_up_after_max_retries(server):
    server.script = ["500"] * 10
    with capture_logs() as logs, pytest.raises(EngineError, match=r"failed after 3 attempt\(s\): HTTP 500"):
        call(make(server, max_retries=2))
    assert len(server.requests) == 3
    retries = [e for e in logs if e["event"] == "openai.retry"]
    assert [e["attempt"] for e in retries] == [1, 2]
    assert KEY not in repr(logs)


def test_key_never_in_repr_logs_or_config(server):
    server.script = ["500", "badjson"]
    model = make(server)
    with capture_logs() as logs:
        assert call(model) == "reply 3"
    assert len(logs) >= 2  # the two retries were logged
    assert KEY not in repr(logs) and KEY not in str(model) and KEY not in repr(model)
    assert KEY not in repr(vars(model))
    cfg = ChatModelConfig(engine="openai", base_url=server.base_url, model="m", api_key_env="DYNALIZE_TEST_KEY")
    assert KEY not in json.dumps(cfg.model_dump())


def test_json_schema_goes_into_response_format(server):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    model = make(server)
    call(model, json_schema=schema)
    rf = server.requests[0]["body"]["response_format"]
    assert rf == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": True}}


def test_chat_json_over_http_uses_schema(server, monkeypatch):
    schema = {"type": "object", "required": ["reply"]}

    def ok_json(h, action):
        FakeServer._send(h, 200, json.dumps({"choices": [{"message": {"content": '{"reply": 3}'}}]}))

    monkeypatch.setattr(server, "respond", ok_json)
    model = build_chat_model({"engine": "openai", "base_url": server.base_url, "model": "m",
                              "api_key_env": "DYNALIZE_TEST_KEY", "temperature": 0.0, "max_tokens": 64})

    async def main():
        try:
            return await chat_json(model, MSGS, schema)
        finally:
            await model.close()

    assert anyio.run(main) == {"reply": 3}
    body = server.requests[0]["body"]
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert (body["temperature"], body["max_tokens"]) == (0.0, 64)


def test_concurrency_limit(server, monkeypatch):
    active, peak = 0, 0
    lock = threading.Lock()
    original = server.respond

    def slow(h, action):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1
        original(h, action)

    monkeypatch.setattr(server, "respond", slow)
    model = make(server, max_concurrency=2)

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(model.chat, MSGS)
        await model.close()

    anyio.run(main)
    assert len(server.requests) == 6 and peak == 2


def test_connection_refused_is_retried_then_fails():
    model = OpenAIChatModel("http://127.0.0.1:9/v1", "m", api_key_env=None, max_retries=1, retry_wait=0.01)
    with pytest.raises(EngineError, match=r"failed after 2 attempt\(s\)"):
        call(model)


def test_structlog_output_has_no_key(server, capsys):
    saved = structlog.get_config()
    structlog.reset_defaults()  # print at all levels, as an unconfigured program would
    try:
        server.script = ["500"]
        call(make(server))
    finally:
        structlog.configure(**saved)
    out = capsys.readouterr()
    assert "openai.retry" in out.out + out.err
    assert KEY not in out.out + out.err
