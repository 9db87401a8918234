"""A proposal still running when a run ends is not awaited (it can no longer change the run's
training): it is cancelled, its view kept in the last checkpoint, and a resumed or extended run
proposes it again first, on the same view, as after a crash."""

import json
import re

import anyio
import pytest

from dynalize.config import load_config
from dynalize.run import main, train
from dynalize.runlog import read_jsonl

CALLS: list[str] = []


async def proposer(msgs):
    """The proposer and dedup chat: the first proposal comes at once, the second (the last step's)
    never while the first run lasts; the third (the resumed run's) at once."""
    if "You keep a list of penalties" in msgs[0].content:  # the dedup pass: nothing repeats
        n = len(re.findall(r"^- c\d+:", msgs[1].content, re.M))
        return json.dumps({"duplicates": [{"candidate": f"c{i + 1}", "duplicate_of": None} for i in range(n)]})
    CALLS.append(msgs[1].content)
    if len(CALLS) == 2:
        await anyio.sleep(3600)  # cancelled by the end of the run
    first = {}
    for sid, group in re.findall(r"^\[(s\d+)\] group (\d+)", msgs[1].content, re.M):
        first.setdefault(group, sid)
    refs = list(first.values())[:2]
    k = len(CALLS)
    return json.dumps({"candidates": [{"title": f"Pattern {k}", "description": f"Has {k} characters.",
                                       "sample_ids": refs, "regex": f"(?s).{{{k}}}"}]})


@pytest.mark.slow
def test_a_proposal_in_flight_at_the_end_is_kept_in_the_last_checkpoint_and_proposed_again(toy_overrides, tmp_path):
    CALLS.clear()
    chat = "penalties.proposer.chat.engine=scripted", "penalties.proposer.chat.path=test_proposal_at_run_end:proposer"
    cfg = load_config(None, toy_overrides + ["name=end", "steps=3", "penalties.enabled=true", "penalties.every=2",
                                             "penalties.proposer.engine=llm", *chat])
    anyio.run(train, cfg, False)  # returns although the last step's proposal never answers
    run = tmp_path / "end"
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last["step"] == 3 and len(CALLS) == 2
    assert last["proposer/cancelled"] == 1 and last["proposer/in_flight"] == 0
    state = json.loads((run / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state["terms"]["penalties"]["in_flight"]["step"] == 2  # what it was asked, for a resume

    # extending the run: the kept proposal goes first, on the same view; this run's end waits for it
    assert main(["--resume", str(run), "steps=4", "penalties.finish_timeout=600"]) == 0
    samples = [re.findall(r"^\[s\d+\] group .*$", c, re.M) for c in CALLS]
    assert len(CALLS) == 3 and samples[2] == samples[1] and samples[1] != samples[0]
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last["step"] == 4 and last["proposer/restarted"] == 1 and last["proposer/accepted"] == 1
    state = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())
    assert [(p["step"], p["candidate"]["title"]) for p in state["terms"]["penalties"]["pending"]] == [(2, "Pattern 3")]
