"""LLMProposer with scripted chat models: the view, the prompt, every filter, best-of-several."""

import json

import anyio

from dynalize.backends.chat import ScriptedChatModel
from dynalize.penalties.config import ProposerConfig
from dynalize.penalties.proposer import LLMProposer, resolve_sample_id
from dynalize.penalties.views import build_view
from dynalize.types import Batch, Penalty, Rollout


def rollout(group, text):
    return Rollout(prompt_id=f"q{group}", group=group, prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                   loss_mask=[1], replies=[text], policy_version=0)


def batch(n_groups=6, g=4):
    return Batch(step=0, groups=[[rollout(gi, f"g{gi} r{i} Certainly! text") for i in range(g)]
                                 for gi in range(n_groups)])


def scored_view(b, **kw):
    """The view of `b` with rewards 1 ± 0.5 alternating within each group (advantages ± 0.5)."""
    adv = [[(-1) ** i * 0.5 for i in range(len(g))] for g in b.groups]
    return build_view(b, [[1.0 + a for a in g] for g in adv], adv, **kw)


def view(**kw):
    return scored_view(batch(), seed=1, step=10, groups=4, per_group=2, **kw)


def propose(chat, v, require_regex=False, **kw):
    return anyio.run(LLMProposer(chat, ProposerConfig(**kw), require_regex=require_regex).propose, v)


def reply(*cands):
    return json.dumps({"candidates": list(cands)})


def c(title, ids, regex=None):
    return {"title": title, "description": f"{title}.", "sample_ids": ids, "regex": regex}


def test_view_is_seeded_and_sized():
    b = batch(n_groups=20)
    v1 = scored_view(b, seed=3, step=5)
    v2 = scored_view(b, seed=3, step=5)
    v3 = scored_view(b, seed=3, step=6)
    assert [(s.id, s.group, s.text) for s in v1.samples] == [(s.id, s.group, s.text) for s in v2.samples]
    assert [s.text for s in v1.samples] != [s.text for s in v3.samples]
    assert len(v1.samples) == 32 and len({s.group for s in v1.samples}) == 16
    assert v1.samples[0].id == "s01" and v1.samples[-1].id == "s32"
    assert {s.sign for s in v1.samples} == {"+", "-"}
    small = scored_view(b, seed=3, step=5, groups=3, per_group=1)
    assert len(small.samples) == 3


def test_prompt_shows_scores_signs_penalties_and_domain():
    v = view(active=[Penalty("p004", "Says Certainly", "Uses the word certainly.")], domain="Short stories.")
    msgs = LLMProposer(ScriptedChatModel([])).messages(v)
    assert "Short stories." in msgs[0].content
    user = msgs[1].content
    s = v.samples[0]
    assert f"[{s.id}] group {s.group} | RM score {s.score:.3f} | advantage {s.sign}" in user
    assert "p004: Says Certainly" in user and s.text in user


def test_sample_id_resolution():
    ids = ["s01", "s02", "s10"]
    assert [resolve_sample_id(r, ids) for r in ["s01", "S2", "[s10]", "10", "s7", "x"]] == \
        ["s01", "s02", "s10", "s10", None, None]


def test_filters_each_counted_and_best_has_most_groups():
    v = view()
    g = {s.id: s.group for s in v.samples}
    ids = list(g)  # 8 samples, 2 per group, 4 groups
    assert g[ids[0]] == g[ids[1]] != g[ids[2]]
    chat = ScriptedChatModel([reply(
        c("Cites unknown", [ids[0], ids[2], "s99"]),
        c("One group only", [ids[0], ids[1]]),
        c("Bad regex", [ids[0], ids[2]], regex="(unclosed"),
        c("Empty regex", [ids[0], ids[2]], regex="x*"),
        c("Regex misses its samples", [ids[0], ids[2]], regex=r"\bzebra\b"),
        c("Two groups", [ids[0], ids[2]], regex=r"(?i)\bcertainly\b"),
        c("Three groups", [ids[0], ids[2], ids[4]]),
        c("Three groups, more refs", [ids[0], ids[1], ids[2], "S" + ids[4][1:].lstrip("0")]),
        {"title": "", "description": "no title", "sample_ids": [ids[0]]},
    )])
    r = propose(chat, v)
    assert r.ok and r.candidates == 9
    assert r.accepted is not None and r.accepted.title == "Three groups, more refs"
    assert r.accepted.groups == 3 and r.accepted.references == [ids[0], ids[1], ids[2], ids[4]]
    assert r.rejected == {"unknown_refs": 1, "few_groups": 1, "bad_regex": 3, "malformed": 1, "not_best": 2}
    assert len(chat.calls) == 1  # no dedup pass without known penalties


def test_tie_goes_to_first():
    v = view()
    ids = [s.id for s in v.samples]
    r = propose(ScriptedChatModel([reply(c("First", [ids[0], ids[2]]), c("Second", [ids[3], ids[5]]))]), v)
    assert r.accepted.title == "First"


def test_dedup_pass_drops_duplicate_of_active_and_marks_revival():
    active = Penalty("p001", "Flatters the user", "Praises the user.")
    retired = Penalty("p002", "Ends with a question", "Last sentence asks something.", active=False)
    v = view(active=[active], retired=[retired])
    ids = [s.id for s in v.samples]
    proposer_chat = ScriptedChatModel([reply(
        c("Compliments the asker", [ids[0], ids[2], ids[4], ids[6]]),
        c("Asks a closing question", [ids[0], ids[2]]),
        c("Says certainly", [ids[1], ids[3]]),
        c("Flatters the user!", [ids[0], ids[2], ids[4], ids[6]]),  # caught locally by its title
    )])
    dedup_chat = ScriptedChatModel([json.dumps({"duplicates": [
        {"candidate": "c1", "duplicate_of": "p001"},
        {"candidate": "c2", "duplicate_of": "p002"},
        {"candidate": "c3", "duplicate_of": None},
        {"candidate": "c9", "duplicate_of": "p001"},  # invented candidate: ignored
        {"candidate": "c3", "duplicate_of": "p777"},  # invented penalty: ignored
    ]})])
    r = anyio.run(LLMProposer(proposer_chat, dedup_chat=dedup_chat).propose, v)
    assert r.ok and r.rejected == {"duplicate": 2, "not_best": 1}
    assert r.accepted.title == "Asks a closing question" and r.accepted.revives == "p002"
    listing = dedup_chat.calls[0][1].content
    assert "p001: Flatters the user" in listing and "p002: Ends with a question" in listing
    assert "c1: Compliments the asker" in listing and "Flatters the user!" not in listing


def test_require_regex():
    v = view()
    ids = [s.id for s in v.samples]
    r = propose(ScriptedChatModel([reply(c("No regex", [ids[0], ids[2]]))]), v, require_regex=True)
    assert r.accepted is None and r.rejected == {"no_regex": 1}


def test_failures_are_results_not_exceptions():
    v = view()
    r = propose(ScriptedChatModel(["not json at all", "still no", "nope"]), v)
    assert not r.ok and r.accepted is None and "ChatJSONError" in r.error
    r = propose(ScriptedChatModel([RuntimeError("endpoint down")]), v)
    assert not r.ok and "endpoint down" in r.error
    ids = [s.id for s in v.samples]
    chat = ScriptedChatModel([reply(c("X", [ids[0], ids[2]])), RuntimeError("dedup down")])
    r = propose(chat, view(active=[Penalty("p001", "Y", "y")]))
    assert not r.ok and r.accepted is None and "dedup down" in r.error


def test_repaired_json_is_accepted():
    v = view()
    ids = [s.id for s in v.samples]
    raw = "Here you go:\n```json\n" + reply(c("Fenced", [ids[0], ids[2]]))[:-1] + ",]}\n```"
    r = propose(ScriptedChatModel([raw]), v)
    assert r.ok and r.accepted.title == "Fenced"
