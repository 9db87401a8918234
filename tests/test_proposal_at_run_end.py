"""A proposal still running when a run ends is awaited: its result is in the last metrics and
checkpoint, and a resumed run applies it (the loop awaits every term's `finish`)."""

import json
import re

import anyio
import pytest

from dynalize.config import load_config
from dynalize.run import main, train
from dynalize.runlog import read_jsonl

CALLS = []


async def proposer(msgs):
    """The proposer and dedup chat: the first proposal comes at once, the second (the last step's) late."""
    if "You keep a list of penalties" in msgs[0].content:  # the dedup pass: nothing repeats
        n = len(re.findall(r"^- c\d+:", msgs[1].content, re.M))
        return json.dumps({"duplicates": [{"candidate": f"c{i + 1}", "duplicate_of": None} for i in range(n)]})
    CALLS.append(len(CALLS))
    if len(CALLS) > 1:
        await anyio.sleep(1.0)
    first = {}
    for sid, group in re.findall(r"^\[(s\d+)\] group (\d+)", msgs[1].content, re.M):
        first.setdefault(group, sid)
    refs = list(first.values())[:2]
    k = len(CALLS)
    return json.dumps({"candidates": [{"title": f"Pattern {k}", "description": f"Has {k} characters.",
                                       "sample_ids": refs, "regex": f"(?s).{{{k}}}"}]})


@pytest.mark.slow
def test_a_proposal_in_flight_at_the_end_lands_in_the_last_checkpoint(toy_overrides, tmp_path):
    CALLS.clear()
    chat = "penalties.proposer.chat.engine=scripted", "penalties.proposer.chat.path=test_proposal_at_run_end:proposer"
    cfg = load_config(None, toy_overrides + ["name=end", "steps=3", "penalties.enabled=true", "penalties.every=2",
                                             "penalties.proposer.engine=llm", *chat])
    anyio.run(train, cfg, False)
    run = tmp_path / "end"
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last["step"] == 3 and len(CALLS) == 2
    assert last["proposer/accepted"] == 1 and last["proposer/pending"] == 1 and last["proposer/in_flight"] == 0
    state = json.loads((run / "checkpoints" / "step_000003" / "state.json").read_text())
    assert [p["candidate"]["title"] for p in state["terms"]["penalties"]["pending"]] == ["Pattern 2"]

    assert main(["--resume", str(run), "steps=4"]) == 0
    adds = [e for e in read_jsonl(run / "penalties.jsonl") if e["event"] == "add"]
    assert [(e["title"], e["step"], e["proposed_at"]) for e in adds][-1] == ("Pattern 2", 4, 3)  # proposed in step 3
