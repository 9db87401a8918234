"""LLMProposer with scripted chat models: the view, the prompt, every filter, best-of-several."""

import json

import anyio
import pytest

from dynalize.backends.chat import ScriptedChatModel
from dynalize.penalties.candidate import Candidate
from dynalize.penalties.config import ProposerConfig
from dynalize.penalties.proposer import LLMProposer, parse_dedup, resolve_id
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
    assert [resolve_id(r, ids) for r in ["s01", "S2", "[s10]", "10", "s7", "x"]] == \
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
    r = propose(chat, v, max_candidates=9)
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


# --- dedup: ids, schema, regexes (issue 21) -----------------------------------------------------

ACTIVE = Penalty("p001", "Flatters the user", "Praises the user.")
RETIRED = Penalty("p002", "Ends with a question", "Last sentence asks something.", regex=r"\?\s*\Z", active=False)


def dedup_run(answer, cands=None, **kw):
    """Propose `cands` (default: two fresh ones) against ACTIVE and RETIRED; the dedup pass says `answer`."""
    v = view(active=[ACTIVE], retired=[RETIRED])
    ids = [s.id for s in v.samples]
    cands = cands or [c("Compliments the asker", [ids[0], ids[2], ids[4]]), c("Says certainly", [ids[1], ids[3]])]
    dedup_chat = ScriptedChatModel(lambda msgs: answer if isinstance(answer, str) else json.dumps(answer))
    r = anyio.run(LLMProposer(ScriptedChatModel([reply(*cands)]), ProposerConfig(**kw), dedup_chat).propose, v)
    return r, dedup_chat


@pytest.mark.parametrize("named", ["p001", "P001", "p1", "1", "p001: Flatters the user", "[p001]", "p001.",
                                   " P01 ", "Flatters the user"])
def test_dedup_reads_penalty_ids_as_loosely_as_sample_ids(named):
    r, _ = dedup_run({"duplicates": [{"candidate": "c1", "duplicate_of": named},
                                     {"candidate": "c2", "duplicate_of": None}]})
    assert r.ok and r.rejected == {"duplicate": 1} and r.accepted.title == "Says certainly"


@pytest.mark.parametrize("named", ["P002", "p2", "[p002]", "p002: Ends with a question"])
def test_dedup_naming_a_retired_penalty_loosely_revives_it(named):
    r, _ = dedup_run({"duplicates": [{"candidate": "C1", "duplicate_of": "P1"},
                                     {"candidate": "[c2]", "duplicate_of": named}]})
    assert r.ok and r.accepted.title == "Says certainly" and r.accepted.revives == "p002"


def test_resolve_id_reads_one_id_and_refuses_ambiguity():
    ids = ["p001", "p002", "p010"]
    titles = {"p001": "Flatters the user", "p002": "Ends with a question", "p010": "Ends with a question"}
    got = [resolve_id(r, ids, titles) for r in
           ["p010", "P10", "10", "p1 or p2", "p001 and p002 overlap", "both p1 and p2", "1 or 2", "s1", "p3",
            "flatters the user!", "Ends with a question", "", None, True, 2, "p002 (Ends with 2 questions)"]]
    assert got == ["p010", "p010", "p010", None, None, None, None, None, None,
                   "p001", None, None, None, None, "p002", "p002"]
    samples = ["s01", "s02", "s03", "s05"]
    assert [resolve_id(r, samples) for r in ["s03-s05", "s03, s05", "S3:", "(s05)", "s 3"]] == \
        [None, None, "s03", "s05", "s03"]


MALFORMED = [
    {"duplicates": {"c1": "p001"}},                                    # a mapping, not a list
    [{"c1": "p001"}],                                                  # no object at the top
    [["c1", "p001"]],
    [],
    {"duplicates": []},                                                # no verdict at all
    {"duplicates": [{"candidate": "c1", "duplicate_of": None}]},       # c2 has no verdict
    {"duplicates": [{"candidate": "Compliments", "duplicate_of": None},  # not a title it was given
                    {"candidate": "c2", "duplicate_of": None}]},
    {"duplicates": [{"c1": "p001"}, {"c2": None}]},                    # items off the schema
    {"duplicates": [{"candidate": "c1", "duplicate_of": None}, {"candidate": "c2", "duplicate_of": None},
                    {"candidate": "c9", "duplicate_of": "p001"}]},     # a candidate that does not exist
    {"duplicates": [{"candidate": "c1", "duplicate_of": "p777"},       # a penalty that does not exist
                    {"candidate": "c2", "duplicate_of": None}]},
    {"duplicates": [{"candidate": "c1", "duplicate_of": None}, {"candidate": "c2", "duplicate_of": None},
                    {"candidate": "c1", "duplicate_of": "p001"}]},     # two verdicts for c1
    "I could not decide.",
]


@pytest.mark.parametrize("answer", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_a_malformed_dedup_reply_fails_the_proposal_and_never_means_no_duplicates(answer):
    r, _ = dedup_run(answer)
    assert not r.ok and r.accepted is None and r.failed_at == "dedup"


def test_candidates_named_by_their_exact_titles_are_understood():
    r, _ = dedup_run({"duplicates": [{"candidate": "Compliments the asker", "duplicate_of": "p001"},
                                     {"candidate": "says certainly.", "duplicate_of": "null"}]})
    assert r.ok and r.rejected == {"duplicate": 1} and r.accepted.title == "Says certainly"


def test_a_title_with_a_number_names_its_candidate_not_the_candidate_with_that_number():
    cands = [Candidate("Says hello", "d"), Candidate("Uses 1 exclamation mark", "d")]
    raw = {"duplicates": [{"candidate": "Uses 1 exclamation mark", "duplicate_of": "p001"},
                          {"candidate": "c1", "duplicate_of": None}]}
    assert parse_dedup(raw, cands, [ACTIVE]) == [None, "p001"]


def test_dedup_sees_regexes_and_a_revival_keeps_the_regex_that_matches_its_references():
    v = view(active=[ACTIVE], retired=[RETIRED])
    ids = [s.id for s in v.samples]  # texts "g<group> r<i> Certainly! text": none ends with "?"
    cands = [c("Says certainly", [ids[0], ids[2], ids[4]], regex=r"(?i)\bcertainly\b")]
    r, dedup_chat = dedup_run({"duplicates": [{"candidate": "c1", "duplicate_of": "p002"}]}, cands)
    listing = dedup_chat.calls[0][1].content
    assert r"p002: Ends with a question. Last sentence asks something. [regex: \?\s*\Z]" in listing
    assert r"c1: Says certainly. Says certainly. [regex: (?i)\bcertainly\b]" in listing
    assert "p001: Flatters the user. Praises the user. [no regex]" in listing
    got = r.accepted
    assert got.revives == "p002" and got.keep_regex == "candidate" and got.regex == r"(?i)\bcertainly\b"
    assert "0 match the penalty's regex, 3 the candidate's" in got.regex_reason
    # the old regex matches them all: it stays
    old = Penalty("p002", "Ends with text", "d", regex=r"text\Z", active=False)
    v = view(retired=[old])
    r = anyio.run(LLMProposer(ScriptedChatModel([reply(c("Says certainly", [ids[0], ids[2]], regex="Certainly"))]),
                              dedup_chat=ScriptedChatModel([json.dumps({"duplicates": [
                                  {"candidate": "c1", "duplicate_of": "p002"}]})])).propose, v)
    assert r.accepted.revives == "p002" and r.accepted.keep_regex == "penalty"
    # a penalty without a regex, revived under the regex judge, takes the candidate's
    v = view(retired=[Penalty("p002", "Ends with text", "d", active=False)])
    r = anyio.run(LLMProposer(ScriptedChatModel([reply(c("Says certainly", [ids[0], ids[2]], regex="Certainly"))]),
                              dedup_chat=ScriptedChatModel([json.dumps({"duplicates": [
                                  {"candidate": "c1", "duplicate_of": "p002"}]})]), require_regex=True).propose, v)
    assert r.accepted.revives == "p002" and r.accepted.keep_regex == "candidate"


def test_a_candidate_with_a_retired_penalty_s_title_revives_it_without_the_pass_saying_so():
    r, _ = dedup_run({"duplicates": [{"candidate": "c1", "duplicate_of": None}]},
                     [c("Ends with a question!", [view().samples[0].id, view().samples[2].id])])
    assert r.ok and r.accepted.revives == "p002"


# --- candidates: regex type, limits, what the proposer saw (issue 21) -----------------------------

def test_a_regex_given_as_a_list_is_rejected_never_stringified():
    v = view()
    ids = [s.id for s in v.samples]
    r = propose(ScriptedChatModel([reply(c("List regex", [ids[0], ids[2]], regex=["Certainly"]),
                                         c("Number regex", [ids[0], ids[2]], regex=3))]), v)
    assert r.accepted is None and r.rejected == {"bad_regex": 2}


def test_max_candidates_is_enforced():
    v = view()
    ids = [s.id for s in v.samples]
    chat = ScriptedChatModel([reply(*[c(f"Cand {i}", [ids[0], ids[2 + i % 6]]) for i in range(8)])])
    r = propose(chat, v, max_candidates=2)
    assert r.candidates == 8 and r.rejected == {"too_many": 6, "not_best": 1} and r.accepted.title == "Cand 0"


def test_regex_is_checked_against_the_text_the_proposer_saw():
    b = Batch(step=0, groups=[[rollout(gi, f"g{gi} r{i} " + "x" * 40 + " HIDDEN tail") for i in range(4)]
                              for gi in range(6)])
    v = scored_view(b, seed=1, step=10, groups=4, per_group=2)
    ids = [s.id for s in v.samples]
    chat = ScriptedChatModel([reply(c("Says HIDDEN", [ids[0], ids[2]], regex="HIDDEN"),
                                    c("Many x", [ids[0], ids[2]], regex="x{10}"))] * 2)
    assert propose(chat, v, max_chars=500).accepted.title == "Says HIDDEN"
    r = propose(ScriptedChatModel(chat.replies), v, max_chars=30)  # "HIDDEN" is past the cut
    assert r.accepted.title == "Many x" and r.rejected == {"bad_regex": 1}


@pytest.mark.timeout(60)  # today's `re` never returns here
def test_a_catastrophic_candidate_regex_is_rejected_and_counted():
    b = Batch(step=0, groups=[[rollout(gi, ("a" * 60 + "!") if i % 2 else "aaa") for i in range(4)]
                              for gi in range(6)])
    v = scored_view(b, seed=1, step=10, groups=4, per_group=2)
    ids = [s.id for s in v.samples if s.text == "aaa"]
    r = propose(ScriptedChatModel([reply(c("Runs of a", ids[:3], regex=r"(a|aa)+$"))]), v)
    assert r.ok and r.accepted is None and r.rejected == {"slow_regex": 1} and r.regex_timeouts == 1
