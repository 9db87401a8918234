"""docs/llm_backends.md as written: its YAML runs an LLM proposer and judge against a local
OpenAI-compatible server (here a fake on 127.0.0.1 that answers the JSON the page describes), the
judge is called only for penalties without a regex, and penalties.jsonl starts with the first add."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from dynalize.config import load_config
from dynalize.run import train
from dynalize.runlog import read_jsonl
from test_eval_runs import ChatServer

DOC = Path(__file__).resolve().parent.parent / "docs" / "llm_backends.md"


def doc_yaml() -> str:
    [block] = re.findall(r"<!-- config: llm-penalties.yaml -->\n```yaml\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    return block


class PenaltyLLM:
    """Answers proposer, duplicate-check and judge prompts (told apart by their system message)
    with the JSON the doc gives: first a candidate with a regex, then one without; every verdict true."""

    def __init__(self):
        self.roles: list[str] = []

    def __call__(self, body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You review the outputs"):
            ids = re.findall(r"^\[(s\d+)\] group", user, re.M)
            candidate = ({"title": "Writes anything at all", "regex": r"\S"} if "proposer" not in self.roles
                         else {"title": "Sounds unsure", "regex": None})
            role, answer = "proposer", {"candidates": [{**candidate, "description": "Flag every reply.",
                                                         "sample_ids": ids}]}
        elif system.startswith("You keep a list of penalties"):
            role, answer = "dedup", {"duplicates": [{"candidate": c, "duplicate_of": None}
                                                    for c in dict.fromkeys(re.findall(r"^- (c\d+):", user, re.M))]}
        elif system.startswith("You are a careful, literal classifier"):
            keys = user.rsplit("exactly these keys: ", 1)[1].split(" (values")[0].split(", ")
            role, answer = "judge", dict.fromkeys(keys, True)
        else:
            raise AssertionError(system[:80])
        self.roles.append(role)
        return json.dumps(answer)


@pytest.mark.slow
def test_doc_yaml_runs_llm_proposer_and_judge_against_a_local_server(toy_overrides, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / "llm.yaml").write_text(doc_yaml(), encoding="utf-8")
    llm = PenaltyLLM()
    with ChatServer(llm) as server:
        cfg = load_config(tmp_path / "llm.yaml", [
            *toy_overrides, "name=llm", "steps=4", "penalties.every=1",
            f"penalties.proposer.chat.base_url={server.url}", f"penalties.judge.chat.base_url={server.url}"])
        assert cfg.penalties.judge.chat.api_key_env is None and cfg.penalties.proposer.engine == "llm"
        anyio.run(train, cfg, False)
    run = tmp_path / "llm"
    events = read_jsonl(run / "penalties.jsonl")
    adds = [e for e in events if e["event"] == "add"]
    assert events[0]["event"] == "add" and [(a["id"], a["regex"]) for a in adds] == [("p001", r"\S"), ("p002", None)]
    metrics = read_jsonl(run / "metrics.jsonl")
    for m in metrics:  # the LLM judge is called exactly at the steps where a penalty without a regex is active
        without_regex = any(a["step"] <= m["step"] and a["regex"] is None for a in adds)
        assert (m["judge/calls"] > 0) == without_regex, m["step"]
    assert any(m["penalties/active"] == 1 and m["judge/calls"] == 0 for m in metrics)  # the regex alone: no calls
    assert metrics[0]["judge/calls"] == 0 and metrics[-1]["judge/calls"] > 0
    assert {"proposer", "dedup", "judge"} <= set(llm.roles)
    for headers, body in zip(server.headers, server.bodies):
        assert "Authorization" not in headers and body["model"] == "local"  # api_key_env: null sends no key
        assert body["response_format"]["type"] == "json_schema"
