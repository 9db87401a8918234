"""`python -m dynalize.rm pairs` on hand-built runs whose RM scores and verdicts are known: the pair
rule (clean and above the prompt's 75th percentile over penalised), failed verdicts skipped,
the run-wide percentile, pairs per prompt, steps, dedup, re-judging against every penalty, and
one-line errors."""

import json
from pathlib import Path

import anyio

from dynalize.judge.judge import RegexJudge
from dynalize.rm.__main__ import main as rm_main
from dynalize.rm.config import PairsConfig
from dynalize.rm.pairfile import read_pairs
from dynalize.rm.pairs import make_pairs, parse_steps, percentile, rejudge, replies_of_row
from dynalize.types import Penalty

QUESTION = r"\?\s*\Z"
OKAY = r"(?i)\A\s*okay\b"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(prompt_id, reply, rm, verdicts=None, **extra):
    """One single-turn rollout line, as the loop writes it (verdicts only when penalties are on)."""
    r = {"prompt_id": prompt_id, "prompt": [{"role": "user", "content": f"Write about {prompt_id}."}],
         "turns": [{"role": "assistant", "content": reply}], "replies": [reply], "rm_scores": [rm],
         "rm_score": rm, "scores": {"rm": rm}}
    if verdicts is not None:
        r |= {"verdicts": verdicts, "violations": sum(verdicts.values()), "judge_failed": []}
    return r | extra


def make_run(root: Path, steps: dict[int, list[dict]], penalties=(("p001", "Ends with a question", QUESTION),)) -> Path:
    for step, rows in steps.items():
        write_jsonl(root / "rollouts" / f"step_{step:06d}.jsonl", rows)
    write_jsonl(root / "penalties.jsonl", [{"step": 1, "event": "add", "id": pid, "title": title, "description": "",
                                            "regex": rx, "references": []} for pid, title, rx in penalties])
    return root


def sea_rows():
    """Prompt `sea`: eight replies with RM scores 1..8. The 75th percentile of 1..8 is 6.25, so the
    clean replies above it are those scoring 7 and 8; replies 3 and 6 trigger p001."""
    q = {"p001": True}
    clean = {"p001": False}
    return [row("sea", "one.", 1, clean), row("sea", "two.", 2, clean), row("sea", "three?", 3, q),
            row("sea", "four.", 4, clean), row("sea", "five.", 5, clean), row("sea", "six?", 6, q),
            row("sea", "seven.", 7, clean), row("sea", "eight.", 8, clean)]


def cfg(run, **kw):
    return PairsConfig(run=str(run), out=str(Path(run) / "pairs.jsonl"), **kw)


def pairs_of(run, **kw):
    c = cfg(run, **kw)
    assert rm_main(["pairs", "--run", c.run, "--out", c.out, *[a for k, v in kw.items() for a in _flag(k, v)]]) == 0
    return read_pairs(c.out)


def _flag(key, value):
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if key == "dedup":
        return [] if value else ["--no-dedup"]
    return [name, str(value)]


def test_percentile_is_numpys_linear_interpolation():
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8], 75) == 6.25
    assert percentile([5.0], 75) == 5.0
    assert percentile([1, 3], 50) == 2.0


def test_chosen_is_clean_and_above_the_prompts_75th_percentile_rejected_triggers_a_penalty(tmp_path):
    run = make_run(tmp_path / "run", {0: sea_rows()})
    pairs = pairs_of(run, pairs_per_prompt=10)
    assert {p.chosen for p in pairs} == {"seven.", "eight."}  # clean and above 6.25 ("six?" is penalised)
    assert {p.rejected for p in pairs} == {"three?", "six?"}
    assert len(pairs) == 2  # lcm(2 chosen, 2 rejected) = 2 distinct pairs in turn: each reply once
    assert len({(p.chosen, p.rejected) for p in pairs}) == 2
    p = pairs[0]
    assert p.prompt[0].content == "Write about sea." and p.prompt_id == "sea"
    assert p.source["penalties"] == ["p001"] and p.source["run"] == "run"
    assert p.source["chosen_rm"] > 6.25


def test_a_failed_verdict_is_neither_clean_nor_penalised(tmp_path):
    rows = sea_rows() + [row("sea", "nine.", 9, {"p001": False}, judge_failed=["p001"], unscored=["penalties"]),
                         row("sea", "ten?", 10, {"p001": True}, judge_failed=["p002"])]
    run = make_run(tmp_path / "run", {0: rows})
    replies = [r for x in rows for r in replies_of_row(x, 0)]
    pairs, stats = make_pairs(replies, cfg(run, pairs_per_prompt=10))
    assert stats.failed == 2
    assert {p.chosen for p in pairs} == {"seven.", "eight."}  # 9 and 10 do not enter the percentile either
    assert "ten?" not in {p.rejected for p in pairs}


def test_the_run_wide_percentile_is_one_cut_for_every_prompt(tmp_path):
    low = [row("moon", f"moon {i}.", i / 10, {"p001": False}) for i in range(1, 9)] + [
        row("moon", "moon?", 0.05, {"p001": True})]
    run = make_run(tmp_path / "run", {0: sea_rows() + low})
    by_prompt = pairs_of(run, pairs_per_prompt=10)
    assert {p.prompt_id for p in by_prompt} == {"sea", "moon"}
    assert {p.chosen for p in by_prompt if p.prompt_id == "moon"} == {"moon 7.", "moon 8."}
    run_wide = pairs_of(run, pairs_per_prompt=10, scope="run")
    assert {p.prompt_id for p in run_wide} == {"sea"}  # every moon reply is below the run's 75th percentile


def test_pairs_per_prompt_and_a_percentile_option(tmp_path):
    run = make_run(tmp_path / "run", {0: sea_rows()})
    assert len(pairs_of(run, pairs_per_prompt=1)) == 1
    wider = pairs_of(run, pairs_per_prompt=10, percentile=25)  # above 2.75: four, five, seven, eight
    assert {p.chosen for p in wider} == {"four.", "five.", "seven.", "eight."}
    assert len(wider) == 4 and len({p.chosen for p in wider[:4]}) == 4  # each chosen once before any repeats


def test_highest_rejected_first(tmp_path):
    run = make_run(tmp_path / "run", {0: sea_rows()})
    assert pairs_of(run, pairs_per_prompt=1, rejected="highest")[0].rejected == "six?"


def test_steps_select_which_rollout_files_are_read(tmp_path):
    late = [row("sea", "late?", 1, {"p001": True}), row("sea", "late.", 2, {"p001": False}),
            row("sea", "later.", 3, {"p001": False})]
    run = make_run(tmp_path / "run", {0: sea_rows(), 5: late})
    assert {p.chosen for p in pairs_of(run, steps="5-")} == {"later."}
    assert {p.chosen for p in pairs_of(run, steps="0", pairs_per_prompt=10)} == {"seven.", "eight."}
    assert parse_steps("0,5,7-9", [0, 5, 6, 7, 8, 9, 10]) == [0, 5, 7, 8, 9]
    assert parse_steps("6-", [0, 5, 6, 7]) == [6, 7]


def test_dedup_counts_a_reply_text_once(tmp_path):
    rows = sea_rows() + [row("sea", "eight.", 8, {"p001": False})] * 6 + [row("sea", "six?", 6, {"p001": True})] * 3
    run = make_run(tmp_path / "run", {0: rows})
    deduped = pairs_of(run, pairs_per_prompt=10)
    assert {p.chosen for p in deduped} == {"seven.", "eight."}  # the percentile is still over the 8 distinct replies
    assert len(deduped) == len({(p.chosen, p.rejected) for p in deduped}) == 2
    replies = [r for x in rows for r in replies_of_row(x, 0)]
    copies, stats = make_pairs(replies, cfg(run, pairs_per_prompt=10, dedup=False))
    assert stats.distinct == 17 and copies == [] and stats.chosen_pool == 0  # six more 8s: the 75th percentile is 8


def test_rejudging_applies_every_penalty_the_run_ever_accepted(tmp_path, capsys):
    # step 0 ran before any penalty: its verdicts are empty, so by the records "Okay, nine." is clean
    clean = {"p001": False, "p002": False}
    step5 = [row("sea", f"{w}.", i, clean) for i, w in enumerate("one two three four five six seven".split(), 1)]
    step5 += [row("sea", "eight?", 8, {"p001": True, "p002": False}), row("sea", "ten.", 10, clean)]
    run = make_run(tmp_path / "run", {0: [row("sea", "Okay, nine.", 9, {})], 5: step5},
                   penalties=[("p001", "Ends with a question", QUESTION), ("p002", "Opens with Okay", OKAY)])
    recorded = pairs_of(run, pairs_per_prompt=10)  # 1..10: the 75th percentile is 7.75
    assert {p.chosen for p in recorded} == {"Okay, nine.", "ten."} and {p.rejected for p in recorded} == {"eight?"}
    rejudged = pairs_of(run, rejudge=True, pairs_per_prompt=10)
    assert {p.chosen for p in rejudged} == {"ten."}
    assert {p.rejected: p.source["penalties"] for p in rejudged} == {"eight?": ["p001"], "Okay, nine.": ["p002"]}
    assert "re-judged" in capsys.readouterr().err


def test_no_pairs_is_a_one_line_error_and_writes_nothing(tmp_path, capsys):
    run = make_run(tmp_path / "run", {0: [row("sea", f"{i}.", i, {"p001": False}) for i in range(8)]})
    assert rm_main(["pairs", "--run", str(run), "--out", str(run / "p.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no pairs") and "--rejudge" in err and len(err.splitlines()) == 1
    assert not (run / "p.jsonl").exists()


def test_a_penalised_multi_turn_rollout_names_no_reply_unless_rejudged(tmp_path):
    def mt(pid, first, second, rm, hit):
        r = row(pid, first, rm, {"p001": hit})
        r["turns"] = [{"role": "assistant", "content": first}, {"role": "user", "content": "More?"},
                      {"role": "assistant", "content": second}]
        r["replies"], r["rm_scores"] = [first, second], [rm, rm]
        return r

    rows = [mt("sea", f"first {i}.", f"second {i}.", i, False) for i in range(1, 8)]
    rows.append(mt("sea", "first 8.", "why?", 8, True))
    replies = [x for r in rows for x in replies_of_row(r, 0)]
    assert [x.penalties for x in replies[-2:]] == ["unattributed", "unattributed"]
    assert replies[1].context[-1].content == "More?"  # a later reply is compared with replies to its own conversation
    run = make_run(tmp_path / "run", {0: rows})
    _, stats = make_pairs(replies, cfg(run))
    assert stats.unattributed == 2
    penalty = Penalty("p001", "Ends with a question", "", regex=QUESTION)
    anyio.run(lambda: rejudge(replies, [penalty], RegexJudge()))  # each reply judged on its own
    assert [x.penalties for x in replies[-2:]] == [frozenset(), frozenset({"p001"})]


def test_runs_without_penalties_or_verdicts_are_one_line_errors(tmp_path, capsys):
    bare = tmp_path / "bare"
    write_jsonl(bare / "rollouts" / "step_000000.jsonl", [row("sea", "one.", 1)])
    assert rm_main(["pairs", "--run", str(bare), "--out", str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert "accepted no penalties" in err and len(err.splitlines()) == 1
    write_jsonl(bare / "penalties.jsonl", [{"step": 1, "event": "add", "id": "p001", "title": "t", "regex": QUESTION}])
    assert rm_main(["pairs", "--run", str(bare), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "carry no penalty verdicts" in capsys.readouterr().err
    assert rm_main(["pairs", "--run", str(bare), "--out", str(tmp_path / "p.jsonl"), "--steps", "3-4"]) == 2
    assert "selects none" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


def test_a_penalty_without_regex_needs_a_judge_to_rejudge(tmp_path, capsys):
    run = make_run(tmp_path / "run", {0: sea_rows()}, penalties=[("p001", "Sounds smug", None)])
    assert rm_main(["pairs", "--run", str(run), "--out", str(run / "p.jsonl"), "--rejudge"]) == 2
    assert "pass --judge" in capsys.readouterr().err


def test_counts_are_printed(tmp_path, capsys):
    run = make_run(tmp_path / "run", {0: sea_rows()})
    assert rm_main(["pairs", "--run", str(run), "--out", str(run / "p.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "prompts used" in err and "per-penalty coverage" in err and "Ends with a question" in err


def test_rejudging_with_an_llm_judge_skips_the_replies_it_fails_on(tmp_path):
    from dynalize.backends.chat import ScriptedChatModel
    from dynalize.judge.judge import Judge
    from dynalize.rm.pairs import pairs_from_run

    def llm(messages):
        text = "\n".join(m.content for m in messages)  # a retry's messages hold the first request too
        if "five." in text:
            return "I cannot tell."  # no verdict, after the retries too: a failed verdict
        return json.dumps({"p001": "three?" in text or "six?" in text})

    run = make_run(tmp_path / "run", {0: sea_rows()}, penalties=[("p001", "Sounds unsure", None)])
    pairs, stats = anyio.run(lambda: pairs_from_run(cfg(run, rejudge=True, pairs_per_prompt=10),
                                                    Judge(ScriptedChatModel(llm))))
    assert stats.failed == 1  # "five." is neither clean nor penalised; the rest: 75th percentile of 7 scores = 6.5
    assert {p.chosen for p in pairs} == {"seven.", "eight."} and {p.rejected for p in pairs} == {"three?", "six?"}
