"""chat_json (repair, schema check, retries), ScriptedChatModel, LimitedChatModel and the factory."""

from __future__ import annotations

import sys
import types

import anyio
import pytest

from dynalize.backends.base import ChatModel, EngineError
from dynalize.backends.chat import (
    ECHO_CHARS,
    REPAIR_MAX_CHARS,
    ChatJSONError,
    LimitedChatModel,
    ScriptedChatModel,
    chat_json,
    parse_json,
    schema_problem,
)
from dynalize.backends.config import ChatModelConfig
from dynalize.build import build_chat_model
from dynalize.types import Message

MSGS = [Message("user", "Judge this.")]
VERDICT = {"type": "object", "required": ["violations"]}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("raw, expected", [
    ('{"a": 1}', {"a": 1}),
    ('{"a": [1, 2,], "b": "x",}', {"a": [1, 2], "b": "x"}),  # trailing commas
    ('```json\n{"a": 1}\n```', {"a": 1}),  # code fence
    ('Sure! Here is my verdict:\n```\n{"a": true}\n```\nLet me know.', {"a": True}),  # prose + fence
    ("The answer is {'a': 2} as requested.", {"a": 2}),  # prose, single quotes
    ("[1, 2, 3]", [1, 2, 3]),
])
def test_parse_json_repairs(raw, expected):
    assert parse_json(raw) == expected


@pytest.mark.parametrize("raw", ["", "no json here at all", "yes"])
def test_parse_json_rejects_nothing_usable(raw):
    with pytest.raises(ValueError, match="no JSON found"):
        parse_json(raw)


def test_parse_json_schema_picks_fitting_object_from_prose():
    raw = 'Draft: {"note": 1}. Final: {"violations": []}'
    assert parse_json(raw, VERDICT) == {"violations": []}


def test_schema_problem():
    assert schema_problem({"violations": []}, VERDICT) is None
    assert "missing required key(s) 'violations'" in schema_problem({"v": 1}, VERDICT)
    assert "expected a JSON object, got list" in schema_problem([1], VERDICT)
    assert schema_problem(True, {"type": "integer"}) is not None  # a bool is not a number in JSON
    assert schema_problem(3, {"type": ["string", "integer"]}) is None


@pytest.mark.anyio
async def test_chat_json_retries_garbage_then_succeeds():
    model = ScriptedChatModel(["I cannot answer that.", 'ok: {"violations": ["p1",],}'])
    assert await chat_json(model, MSGS, VERDICT, temperature=0) == {"violations": ["p1"]}
    assert len(model.calls) == 2
    first, second = model.calls
    assert first == MSGS
    # the retry shows the model its bad reply and asks again
    assert second[:2] == [MSGS[0], Message("assistant", "I cannot answer that.")]
    assert second[2].role == "user" and "no JSON found" in second[2].content
    assert model.sampling == [{"temperature": 0}, {"temperature": 0}]  # no json_schema: unsupported


@pytest.mark.anyio
async def test_chat_json_retries_schema_failure():
    model = ScriptedChatModel(['{"verdict": 1}', '{"violations": []}'])
    assert await chat_json(model, MSGS, VERDICT) == {"violations": []}
    assert "missing required key(s) 'violations'" in model.calls[1][-1].content


@pytest.mark.anyio
async def test_chat_json_raises_after_exhausting_retries():
    model = ScriptedChatModel(["nope", "still nope", "[1, 2]", "never asked"])
    with pytest.raises(ChatJSONError, match=r"after 3 attempt\(s\): expected a JSON object") as err:
        await chat_json(model, MSGS, VERDICT, retries=3)
    assert err.value.raw == "[1, 2]"
    assert isinstance(err.value, EngineError)
    assert len(model.calls) == 3
    # retries never pile up: each retry is the original conversation + the last bad reply + a fix
    assert [len(c) for c in model.calls] == [1, 3, 3]


@pytest.mark.anyio
async def test_chat_json_passes_schema_when_supported():
    model = ScriptedChatModel(['{"violations": []}'], supports_json_schema=True)
    await chat_json(model, MSGS, VERDICT, max_tokens=50)
    assert model.sampling == [{"max_tokens": 50, "json_schema": VERDICT}]


@pytest.mark.anyio
async def test_chat_json_propagates_engine_errors():
    model = ScriptedChatModel([EngineError("HTTP 401")])
    with pytest.raises(EngineError, match="HTTP 401"):
        await chat_json(model, MSGS)
    assert len(model.calls) == 1


@pytest.mark.anyio
async def test_scripted_with_function_and_exhaustion():
    async def reply(msgs):
        return msgs[-1].content.upper()

    fn = ScriptedChatModel(reply)
    assert await fn.chat([{"role": "user", "content": "hi"}]) == "HI"
    assert fn.calls == [[Message("user", "hi")]]
    assert await ScriptedChatModel(lambda m: str(len(m))).chat(MSGS * 2) == "2"
    listed = ScriptedChatModel(["one"])
    assert await listed.chat(MSGS) == "one"
    with pytest.raises(EngineError, match="no reply left for call 2"):
        await listed.chat(MSGS)


@pytest.mark.anyio
async def test_limited_chat_model_caps_concurrency():
    active = peak = 0

    async def reply(msgs):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await anyio.sleep(0.02)
        active -= 1
        return "ok"

    model = LimitedChatModel(ScriptedChatModel(reply), max_concurrency=3)
    assert isinstance(model, ChatModel) and model.supports_json_schema is False
    results = []

    async def one():
        results.append(await model.chat(MSGS))

    async with anyio.create_task_group() as tg:
        for _ in range(9):
            tg.start_soon(one)
    assert results == ["ok"] * 9 and peak == 3  # never more than 3 at once, and 3 at once were reached


def test_build_chat_model_engines(monkeypatch):
    mod = types.ModuleType("fake_chat_script")
    mod.REPLIES = ['{"x": 1}']
    monkeypatch.setitem(sys.modules, "fake_chat_script", mod)
    model = build_chat_model({"engine": "scripted", "path": "fake_chat_script:REPLIES"})
    assert anyio.run(chat_json, model, MSGS) == {"x": 1}

    oa = build_chat_model(ChatModelConfig(engine="openai", base_url="http://h:1/v1/", model="m",
                                          temperature=0.3, max_tokens=10, api_key_env=None))
    assert (oa.url, oa.model, oa.default_sampling) == ("http://h:1/v1/chat/completions", "m",
                                                       {"temperature": 0.3, "max_tokens": 10})


@pytest.mark.parametrize("cfg, message", [
    ({"engine": "claude"}, "chat model config: engine: unknown chat engine 'claude'; known: openai, hf, vllm, "
                           "scripted"),
    ({"engine": "vllm"}, "chat model config: the vllm engine needs path"),
    ({"engine": "openai", "model": "m"}, "chat model config: the openai engine needs both base_url and model"),
    ({"engine": "hf"}, "chat model config: the hf engine needs path"),
    ({"engine": "scripted", "path": "no_colon"}, "path must be 'module:attr'"),
    ({"engine": "openai", "api_key": "sk-x"}, "chat model config: api_key: unknown key"),
    ({"engine": "openai", "timeout": 0}, "chat model config: timeout: Input should be greater than 0"),
])
def test_build_chat_model_errors_are_one_line(cfg, message):
    with pytest.raises(ValueError) as err:
        build_chat_model(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_fields_are_documented():
    assert set(ChatModelConfig.model_fields) == {
        "engine", "model", "base_url", "api_key_env", "path", "timeout", "max_retries",
        "max_concurrency", "temperature", "max_tokens", "retry_wait", "max_response_bytes", "requests_per_minute",
        "tokens_per_minute"}
    assert all(f.description for f in ChatModelConfig.model_fields.values())
    assert ChatModelConfig().model_dump()["api_key_env"] == "OPENAI_API_KEY"


# --- huge and hostile replies ---------------------------------------------------------------------

def test_a_bad_multi_megabyte_reply_is_cut_in_the_correction_retry():
    huge = '{"violations": "' + "spam " * 400_000  # 2 MB, unterminated
    model = ScriptedChatModel([huge, '{"violations": []}'])
    assert anyio.run(chat_json, model, MSGS, VERDICT) == {"violations": []}
    echoed = model.calls[1][-2]
    assert echoed.role == "assistant" and len(echoed.content) < ECHO_CHARS + 100
    assert echoed.content.startswith(huge[:100]) and "more characters cut" in echoed.content


@pytest.mark.parametrize("raw", ['{"a": "' + "x y, " * 100_000, "[" * 200_000], ids=["unterminated", "deep"])
def test_too_long_or_too_deep_json_fails_as_unusable_not_as_a_crash(raw, monkeypatch):
    import json_repair

    def no_repair(*args, **kwargs):  # repairing this would take seconds: it must not be tried
        raise AssertionError("json_repair was asked to repair a reply over REPAIR_MAX_CHARS")

    monkeypatch.setattr(json_repair, "loads", no_repair)
    with pytest.raises(ValueError, match="too long to repair"):
        parse_json(raw)
    assert len(raw) > REPAIR_MAX_CHARS


def test_json_is_parsed_off_the_event_loop(monkeypatch):
    """A slow parse (a big reply to repair) must not stall the loop: training runs on it too."""
    import threading

    import dynalize.backends.chat as chat

    parsed_on: list[threading.Thread] = []

    def recording_parse(text, schema=None):
        parsed_on.append(threading.current_thread())
        return {"violations": []}

    monkeypatch.setattr(chat, "parse_json", recording_parse)

    async def main():
        loop_thread = threading.current_thread()
        await chat_json(ScriptedChatModel(['{"violations": []}']), MSGS, VERDICT)
        return loop_thread

    loop_thread = anyio.run(main)
    assert parsed_on and all(t is not loop_thread for t in parsed_on)  # a worker thread, never the loop's


# --- the judge's time budget holds against JSON repair -------------------------------------------------

def test_a_long_reply_that_is_not_json_is_never_handed_to_json_repair(monkeypatch):
    import json_repair

    repaired = []
    monkeypatch.setattr(json_repair, "loads", lambda text, *a, **k: repaired.append(len(text)) or {})
    prose = "{ note: a, b } " * 6_300  # 94 KB of prose full of braces: json-repair takes minutes on it
    with pytest.raises(ValueError, match="too long to repair"):
        parse_json(prose)
    assert repaired == [] and len(prose) > REPAIR_MAX_CHARS
    parse_json('{"p001": tru')  # a short cut answer is still repaired
    assert repaired == [len('{"p001": tru')]


def test_a_json_answer_inside_long_prose_is_still_read_without_repair(monkeypatch):
    import json_repair

    monkeypatch.setattr(json_repair, "loads", lambda *a, **k: pytest.fail("repair was called"))
    reply = "Let me think. " * 5_000 + '```json\n{"p001": true, "p002": false}\n```'
    assert parse_json(reply, VERDICT | {"required": ["p001"]}) == {"p001": True, "p002": False}


def test_the_judge_time_budget_abandons_a_parse_still_running(monkeypatch):
    """The verdicts of a call whose answer is still being parsed when the budget ends are failed
    by the budget: the step does not wait for the parse thread."""
    import threading

    import dynalize.backends.chat as chat
    from dynalize.judge.config import JudgeConfig
    from dynalize.judge.judge import Judge
    from dynalize.types import Penalty

    release, started = threading.Event(), threading.Event()
    real = chat._parse_checked

    def slow_parse(raw, schema, check):  # a repair that takes far longer than the budget
        started.set()
        release.wait(60)
        return real(raw, schema, check)

    monkeypatch.setattr(chat, "_parse_checked", slow_parse)
    penalty = Penalty("p001", "Flatters", "Praises the user.")
    judge = Judge(ScriptedChatModel(lambda msgs: '{"p001": true}'), JudgeConfig(time_budget_s=5.0, retries=1))
    try:
        out = anyio.run(judge.assess, ["a reply", "another"], [penalty], 1)
        still_parsing = started.is_set() and not release.is_set()
    finally:
        release.set()
    assert still_parsing  # assess returned while the parse thread was still blocked
    assert [j.failed for j in out] == [{"p001"}, {"p001"}]
    assert judge.stats.timed_out == 2 and "time budget" in judge.last_error
