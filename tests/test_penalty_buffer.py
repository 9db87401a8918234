"""PenaltyBuffer: one add per step, retire on zero hits, revive with old id and history, JSON."""

import json

import pytest

from dynalize.penalties.buffer import PenaltyBuffer, PenaltyBufferError
from dynalize.penalties.candidate import Candidate


def cand(title, regex=None, refs=("s01", "s03"), revives=None):
    return Candidate(title, f"{title} (description)", list(refs), regex, groups=2, revives=revives)


def test_add_assigns_ids_and_bumps_version():
    buf = PenaltyBuffer()
    p1 = buf.add(cand("Opens with Okay"), step=3)
    p2 = buf.add(cand("Ends with a question"), step=4)
    assert (p1.id, p2.id) == ("p001", "p002")
    assert p1.created_step == 3 and p1.history == [
        {"step": 3, "event": "add", "description": "Opens with Okay (description)", "regex": None,
         "references": ["s01", "s03"], "groups": 2}]
    assert buf.version == 2
    assert [p.id for p in buf.active()] == ["p001", "p002"] and len(buf) == 2


def test_at_most_one_add_per_step():
    buf = PenaltyBuffer()
    buf.add(cand("A"), step=5)
    with pytest.raises(PenaltyBufferError, match="step 5"):
        buf.add(cand("B"), step=5)
    assert [p.title for p in buf.active()] == ["A"] and buf.version == 1
    buf.add(cand("B"), step=6)
    assert len(buf) == 2


def test_duplicate_of_active_is_refused():
    buf = PenaltyBuffer()
    buf.add(cand("Opens with 'Okay,'", regex=r"(?i)\Aokay"), step=1)
    with pytest.raises(PenaltyBufferError, match="duplicates active penalty p001"):
        buf.add(cand("opens with okay"), step=2)
    with pytest.raises(PenaltyBufferError):
        buf.add(cand("Other title", regex=r"(?i)\Aokay"), step=3)


def test_end_step_retires_untriggered_and_records_prevalence():
    buf = PenaltyBuffer()
    buf.add(cand("A"), step=0)
    buf.add(cand("B"), step=1)
    v = buf.version
    retired = buf.end_step(2, {"p001": 3, "p002": 0}, n_judged=12)
    assert retired == ["p002"]
    assert [p.id for p in buf.active()] == ["p001"] and [p.id for p in buf.retired()] == ["p002"]
    assert buf.version == v + 1
    stats = [e for e in buf.drain_events() if e["event"] == "stats"]
    assert stats[-1] == {"step": 2, "event": "stats", "n_judged": 12, "triggers": {"p001": 3, "p002": 0},
                         "prevalence": {"p001": 0.25, "p002": 0.0}}
    assert buf.get("p002").history[-1]["event"] == "retire"


def test_no_retire_without_observations():
    buf = PenaltyBuffer()
    buf.add(cand("A"), step=0)
    # every verdict for p001 failed: nothing observed, so nothing retired
    assert buf.end_step(1, {}, n_judged=8, judged={"p001": 0}) == []
    assert buf.end_step(2, {}, n_judged=0) == []
    assert buf.end_step(3, {}, n_judged=8, judged={"p001": 8}) == ["p001"]


@pytest.mark.parametrize("how", ["title", "regex", "dedup"])
def test_revive_keeps_id_and_history(how):
    buf = PenaltyBuffer()
    buf.add(cand("Uses the word zorbly", regex=r"(?i)\bzorbly\b"), step=0)
    buf.add(cand("Something else"), step=1)
    buf.end_step(2, {"p002": 1}, n_judged=4)
    assert not buf.get("p001").active
    again = {"title": cand("uses the WORD zorbly!", refs=("s02", "s09")),
             "regex": cand("Zorbly marker", regex=r"(?i)\bzorbly\b", refs=("s02", "s09")),
             "dedup": cand("Says zorbly a lot", refs=("s02", "s09"), revives="p001")}[how]
    p = buf.add(again, step=7)
    assert p.id == "p001" and p.active and p.title == "Uses the word zorbly"
    assert [h["event"] for h in p.history] == ["add", "retire", "revive"]
    assert p.history[-1]["step"] == 7 and p.references == ["s02", "s09"]
    assert len(buf.all()) == 2  # no new penalty
    with pytest.raises(PenaltyBufferError):
        buf.add(cand("New one"), step=7)  # the revival used step 7's add


def test_json_round_trip():
    buf = PenaltyBuffer()
    buf.add(cand("A", regex=r"\bfoo\b"), step=0)
    buf.add(cand("B"), step=1)
    buf.end_step(1, {"p001": 2}, n_judged=4)
    data = json.loads(json.dumps(buf.to_json()))
    back = PenaltyBuffer.from_json(data)
    assert back.to_json() == buf.to_json()
    assert back.version == buf.version and [p.id for p in back.active()] == ["p001"]
    assert back.add(cand("C"), step=2).id == "p003"  # id counter restored
    with pytest.raises(PenaltyBufferError):
        back.add(cand("D"), step=2)
    data["penalties"][0]["history"].append({"step": 99})
    assert len(back.get("p001").history) == 1  # no aliasing with the source dict


def test_events_are_json_lines_drained_once():
    buf = PenaltyBuffer()
    buf.add(cand("A"), step=0, proposed_at=0)
    buf.end_step(0, {"p001": 0}, n_judged=4)
    buf.add(cand("a"), step=5)
    lines = [json.loads(json.dumps(e)) for e in buf.drain_events()]
    assert buf.drain_events() == []
    assert [(x["step"], x["event"]) for x in lines] == [(0, "add"), (0, "stats"), (0, "retire"), (5, "revive")]
    assert lines[0]["id"] == "p001" and lines[0]["title"] == "A" and lines[0]["proposed_at"] == 0
    assert lines[1]["prevalence"] == {"p001": 0.0}
    assert all(x.get("id") == "p001" for x in lines if x["event"] != "stats")


def test_a_revival_takes_the_candidate_regex_only_when_the_proposer_chose_it_and_says_so():
    buf = PenaltyBuffer()
    buf.add(cand("Ends with a question", regex=r"\?\Z"), step=1)
    buf.retire("p001", step=2)
    new = cand("Asks back", regex=r"(?i)\bcertainly\b", revives="p001")
    new.keep_regex, new.regex_reason = "candidate", "of the 3 references, 0 match the penalty's regex, 3 the candidate's"
    p = buf.add(new, step=3)
    assert p.id == "p001" and p.regex == r"(?i)\bcertainly\b"
    revive = buf.drain_events()[-1]
    assert revive["event"] == "revive" and revive["regex"] == r"(?i)\bcertainly\b"
    assert revive["previous_regex"] == r"\?\Z" and revive["regex_from"] == "candidate"
    assert revive["regex_reason"].startswith("of the 3 references")
    buf.end_step(3, {"p001": 2}, 8)  # the new regex triggers: it stays
    assert buf.get("p001").active
    buf.retire("p001", step=4)
    kept = buf.add(cand("Asks back", regex=r"other", revives="p001"), step=5)  # keep_regex defaults to "penalty"
    assert kept.regex == r"(?i)\bcertainly\b" and buf.drain_events()[-1]["regex_from"] == "penalty"


def test_preview_shows_queued_candidates_with_the_ids_they_will_get():
    buf = PenaltyBuffer()
    buf.add(cand("A"), step=1)
    buf.add(cand("B"), step=2)
    buf.retire("p002", step=3)
    active, retired = buf.preview([cand("C"), cand("B again", revives="p002"), cand("A")])  # the last is refused
    assert [(p.id, p.title) for p in active] == [("p001", "A"), ("p002", "B"), ("p003", "C")] and retired == []
    assert [p.id for p in buf.active()] == ["p001"] and buf.version == 3  # the buffer itself is unchanged
    assert buf.add(cand("C"), step=4).id == "p003"
