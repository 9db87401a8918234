"""OpenAIChatModel against a real local HTTP server that injects faults from a script."""

from __future__ import annotations

import json
import threading
import time

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
from faultserver import FaultServer

KEY = "sk-test-SECRET-0123456789abcdef"
MSGS = [Message("system", "You are terse."), Message("user", "Say hi.")]


class FakeServer(FaultServer):
    """Chat-completions on 127.0.0.1; `script` holds one fault per request, then plain replies "reply <n>"."""

    def __init__(self):
        self.script: list[str] = []
        super().__init__(lambda body: f"reply {len(self.requests)}",
                         lambda body: self.script.pop(0) if self.script else None, hang_s=1.0)


@pytest.fixture
def server():
    with FakeServer() as s:
        yield s


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("DYNALIZE_TEST_KEY", KEY)


def make(server: FakeServer, **kw) -> OpenAIChatModel:
    # a generous deadline, so a loaded machine never turns a test of something else into a timeout;
    # the tests of the deadline itself pass a short one
    args = dict(api_key_env="DYNALIZE_TEST_KEY", timeout=20.0, max_retries=3, retry_wait=0.01)
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


@pytest.mark.parametrize("fault", ["500", "malformed", "hang", "reset"])
def test_transient_fault_then_ok(server, fault):
    server.script = [fault]
    server.hang_s = 60.0  # a hang far past the 10 s deadline; the retry has all of it
    assert call(make(server, timeout=10.0)) == "reply 2"
    assert len(server.requests) == 2


def test_429_honours_retry_after(server):
    server.script = ["429"]
    assert call(make(server)) == "reply 2"
    first, second = server.requests
    assert second["t"] - first["t"] >= 0.95  # the server's clock: the retry came after Retry-After (1 s)


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
    server.script = ["500", "malformed"]
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

    monkeypatch.setattr(server, "answer", lambda body: '{"reply": 3}')
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

    two = threading.Event()  # the first request waits for a second (never on a clock: a loaded machine is slow)

    def slow(h, fault, body):
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
            if active == 2:
                two.set()
        two.wait(10)
        with lock:
            active -= 1
        original(h, fault, body)

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


# --- deadlines, back-pressure, size caps (issue 12) ------------------------------------------------

def test_timeout_is_a_deadline_for_the_whole_request_so_a_trickle_fails(server):
    server.trickle_s = 1.5  # every byte arrives well within the 0.3 s read timeout
    server.fault = lambda body: "trickle"
    with pytest.raises(EngineError, match=r"after 2 attempt\(s\): no complete response within 0.3s"):
        call(make(server, max_retries=1, timeout=0.3))  # the deadline cut both attempts, each still trickling


def test_a_call_waiting_out_its_backoff_holds_no_concurrency_slot(server):
    """One slot, two calls whose first attempts fail: B's first attempt goes out while A waits to
    retry (a slot held through the backoff would make B wait for A's whole retry schedule)."""
    seen: set[str] = set()

    def first_sight_fails(body):
        who = body["messages"][-1]["content"]
        fault = None if who in seen else "500"
        seen.add(who)
        return fault

    server.fault = first_sight_fails
    model = make(server, max_concurrency=1, retry_wait=3.0)  # B goes out well within A's backoff

    async def main():
        async with anyio.create_task_group() as tg:
            for who in ("A", "B"):
                tg.start_soon(model.chat, [Message("user", who)])
                await anyio.sleep(0.01)
        await model.close()

    anyio.run(main)
    order = [r["body"]["messages"][-1]["content"] for r in server.requests]
    assert order[:2] == ["A", "B"] and sorted(order) == ["A", "A", "B", "B"], order


@pytest.mark.parametrize("fault", ["huge", "huge_unsized"])
def test_a_reply_over_max_response_bytes_is_abandoned_and_retried(server, fault):
    server.huge_bytes = 3_000_000
    server.script = [fault]
    assert call(make(server, max_response_bytes=100_000)) == "reply 2"
    server.script = [fault] * 2
    with pytest.raises(EngineError, match="max_response_bytes=100000"):
        call(make(server, max_response_bytes=100_000, max_retries=1))


@pytest.mark.parametrize("pasted", ["sk-proj-0123456789abcdefABCDEF", "0123456789abcdef0123456789abcdef", "a b"])
def test_a_pasted_key_is_refused_as_api_key_env_and_never_echoed(pasted):
    with pytest.raises(EngineError) as err:
        OpenAIChatModel("http://127.0.0.1:9/v1", "m", api_key_env=pasted)
    assert pasted not in str(err.value) and "NAME of an environment variable" in str(err.value)
    with pytest.raises(Exception) as err:
        ChatModelConfig(engine="openai", base_url="http://x/v1", model="m", api_key_env=pasted)
    assert pasted not in str(err.value)
    assert ChatModelConfig(api_key_env="MY_PROVIDER_API_KEY_2").api_key_env == "MY_PROVIDER_API_KEY_2"
