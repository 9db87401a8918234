"""Reports against hand-built run directories: Peak / End / Final and Δ numbers computed by hand,
the per-axis table, the task-eval fallback, penalty history, pattern prevalence, audits, plots."""

import json
from pathlib import Path

import anyio
import pytest

from dynalize.analysis.audit import audit, replies_of
from dynalize.analysis.patterns import patterns, prevalence
from dynalize.analysis.penalties import penalty_history
from dynalize.analysis.runs import (
    Metric,
    ReportError,
    Run,
    default_metrics,
    judge_metrics,
    judge_name,
    parse_metric,
)
from dynalize.analysis.tables import axis_table, judges_table, table1
from dynalize.judge.judge import Judge, RegexJudge
from dynalize.report import main as report_main


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rollout(replies, reasoning=(), turns=None, prompt="Say something."):
    return {"step": 1, "prompt": [{"role": "user", "content": prompt}], "replies": list(replies),
            "reasoning": list(reasoning), "turns": turns or [{"role": "assistant", "content": r} for r in replies]}


@pytest.fixture
def runs(tmp_path):
    """Three runs. base and dyn are evaluated in the window 150-200; short only at 50 and 100."""
    base, dyn, short = tmp_path / "base", tmp_path / "dyn", tmp_path / "short"
    write_jsonl(base / "metrics.jsonl", [{"step": s, "rm/mean": v} for s, v in
                                         ((100, 0.1), (150, 0.5), (175, 0.7), (200, 0.9))])
    write_jsonl(base / "eval" / "eqbench.jsonl", [
        {"step": 50, "score": 40.0}, {"step": 100, "score": 52.0}, {"step": 150, "score": 50.0},
        {"step": 200, "score": 46.0, "ci_low": 44.0, "ci_high": 48.0}])
    write_jsonl(base / "eval" / "mindeval.jsonl", [
        {"step": 150, "score": 3.0, "criteria": {"A": 3.0, "B": 2.0}},
        {"step": 200, "score": 3.4, "criteria": {"A": 4.0, "B": 3.0}}])
    write_jsonl(base / "rollouts" / "step_000001.jsonl", [rollout([r]) for r in
                                                          ("Okay sure.", "No.", "okay then", "Hello")])
    write_jsonl(dyn / "metrics.jsonl", [{"step": 150, "rm/mean": 0.2}, {"step": 200, "rm/mean": 0.4},
                                        {"step": 40, "penalty/p001/prevalence": 0.9}])
    write_jsonl(dyn / "eval" / "eqbench.jsonl", [
        {"step": 50, "score": 41.0}, {"step": 150, "score": 55.0}, {"step": 175, "score": 57.0},
        {"step": 200, "score": 10.0}, {"step": 200, "score": 56.0}])  # step 200 redone: the last line wins
    write_jsonl(dyn / "eval" / "mindeval.jsonl", [{"step": 150, "score": 3.5, "criteria": {"A": 5.0, "B": 2.0}}])
    write_jsonl(dyn / "penalties.jsonl", [
        {"step": 5, "event": "add", "id": "p001", "title": "Opens with Okay", "description": "d1",
         "regex": r"(?i)\A\s*okay\b", "references": ["s1"]},
        {"step": 5, "event": "stats", "n_judged": 10, "triggers": {"p001": 5}, "prevalence": {"p001": 0.5}},
        {"step": 10, "event": "add", "id": "p002", "title": "Says hello", "description": "greets", "regex": None},
        {"step": 10, "event": "stats", "n_judged": 10, "triggers": {"p001": 2, "p002": 1},
         "prevalence": {"p001": 0.2, "p002": 0.1}},
        {"step": 20, "event": "retire", "id": "p001", "title": "Opens with Okay", "reason": "no_triggers"},
        {"step": 30, "event": "revive", "id": "p001", "title": "Opens with Okay"}])
    write_jsonl(dyn / "rollouts" / "step_000001.jsonl", [
        rollout(["Okay, here is a galactic tale."], ["Okay, let me think."]),
        rollout(["Once upon an intergalactic time."], [""]),
        rollout(["*Okay* fine"], ["galactic plan"]),
        rollout(["okayish start galactic"], [""])])
    write_jsonl(dyn / "rollouts" / "step_000002.jsonl", [
        rollout(["Okay one", "two galactic"], turns=[
            {"role": "assistant", "content": "Okay one"}, {"role": "user", "content": "go on"},
            {"role": "assistant", "content": "two galactic"}]),
        rollout(["Fine."])])
    write_jsonl(short / "eval" / "eqbench.jsonl", [{"step": 50, "score": 45.0}, {"step": 100, "score": 60.0}])
    return [Run(base), Run(dyn), Run(short)]


def test_table1_by_hand(runs):
    t = table1(runs, parse_metric("eqbench"), window=(150, 200))
    base, dyn, short = t.rows
    # base: peak 52 @100; End (50 + 46) / 2 = 48; final 46 @200; RM (0.5 + 0.7 + 0.9) / 3 = 0.7
    assert (base.peak, base.peak_step, base.end, base.end_steps, base.final, base.final_step) == \
        (52.0, 100, 48.0, [150, 200], 46.0, 200)
    assert base.rm_end == pytest.approx(0.7) and base.rm_n == 3
    # dyn: peak 57 @175; End (55 + 57 + 56) / 3 = 56; final 56 @200 (the redone line); RM 0.3
    assert (dyn.peak, dyn.peak_step, dyn.end, dyn.final) == (57.0, 175, 56.0, 56.0)
    assert dyn.rm_end == pytest.approx(0.3)
    assert dyn.delta == pytest.approx({"peak": 5.0, "end": 8.0, "final": 10.0, "rm_end": -0.4})
    # short: nothing in the window, no metrics: End and RM are n/a, and notes say so
    assert (short.peak, short.end, short.final, short.rm_end) == (60.0, None, 60.0, None)
    assert short.delta == {"peak": 8.0, "end": None, "final": 14.0, "rm_end": None}
    assert any("short: no evaluated checkpoint in steps 150–200 (it has steps 50, 100)" in n for n in t.notes)
    assert any("short: no rm/mean" in n for n in t.notes)
    assert any("End averages different checkpoints" in n for n in t.notes)


def test_held_out_evaluations_off_the_schedule_of_an_extended_run_are_left_out(tmp_path):
    run = tmp_path / "extended"  # 30 steps with eval_every 20, then resumed with steps=60
    (run / "config.yaml").parent.mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 60\neval_every: 20\n")
    write_jsonl(run / "eval" / "task.jsonl", [{"version": v, "gold": g} for v, g in
                                              ((0, 0.1), (20, 0.5), (30, 0.9), (40, 0.3), (60, 0.2))])
    gold = {20: 0.5, 30: 0.9, 40: 0.3}  # metrics.jsonl: the evaluation after step s, as eval/task.jsonl
    write_jsonl(run / "metrics.jsonl", [{"step": s, "rm/mean": 1.0, **({"eval/gold": gold[s]} if s in gold else {})}
                                        for s in range(1, 61)])
    t = table1([Run(run)], Metric("eval/task", "gold"), window=(30, 60))
    [row] = t.rows
    assert (row.peak, row.peak_step, row.end, row.end_steps) == (0.5, 20, pytest.approx(0.25), [40, 60])
    assert any("left out eval/task:gold at step(s) 30" in n for n in t.notes)
    assert Run(run).series(Metric("metrics", "eval/gold")) == [(20, 0.5), (40, 0.3)]
    assert Run(run).off_schedule(Metric("metrics", "rm/mean")) == []


def test_baseline_and_window_options(runs):
    t = table1(runs[:2], parse_metric("eqbench"), window=(100, 150), baseline=1)
    assert t.baseline == "dyn"
    assert t.rows[0].end == pytest.approx(51.0) and t.rows[0].delta["end"] == pytest.approx(51.0 - 55.0)


def test_axis_table_by_hand(runs):
    a = axis_table(runs[:2], parse_metric("mindeval"), window=(150, 200))
    assert a.axes == ["A", "B"]
    assert a.rows["base"] == {"A": 3.5, "B": 2.5} and a.rows["dyn"] == {"A": 5.0, "B": 2.0}


def test_metric_parsing_and_task_fallback(tmp_path, runs):
    assert parse_metric("eval/task:gold") == Metric("eval/task", "gold")
    assert parse_metric("eval/mindeval:criteria.A").label == "eval/mindeval:criteria.A"
    with pytest.raises(ReportError, match="--metric"):
        parse_metric("gold")
    assert [m.label for m in default_metrics(runs)] == ["eqbench", "mindeval"]
    sb = tmp_path / "sandbox"
    write_jsonl(sb / "eval" / "task.jsonl", [{"version": 0, "gold": 0.1, "rm": 1.0}, {"version": 160, "gold": 0.4},
                                             {"version": 200, "gold": 0.3}])
    (m,) = default_metrics([Run(sb)])
    assert m == Metric("eval/task", "gold")
    row = table1([Run(sb)], m).rows[0]
    assert (row.peak, row.peak_step, row.end, row.final) == (0.4, 160, pytest.approx(0.35), 0.3)
    assert Run(runs[1].path).series(parse_metric("eval/mindeval:criteria.A")) == [(150, 5.0)]


def test_penalty_history(runs):
    h = penalty_history(runs[1])
    assert list(h.penalties) == ["p001", "p002"]
    assert h.intervals == {"p001": [(5, 20), (30, None)], "p002": [(10, None)]}
    assert h.prevalence == {"p001": [(5, 0.5), (10, 0.2)], "p002": [(10, 0.1)]}
    assert [p.id for p in h.select("active")] == ["p001", "p002"]
    assert h.penalties["p001"].regex == r"(?i)\A\s*okay\b"


def test_pattern_prevalence_by_hand(runs):
    pts = prevalence(runs[1], patterns(["Okay"], ["galactic"]))
    got = {(p.step, p.field, p.pattern): (p.share, p.n) for p in pts}
    # step 1 replies: "Okay, ..." and "*Okay* fine" start with Okay (not "okayish"); "galactic" in 2 of 4
    assert got[(1, "reply", 'starts with "Okay"')] == (0.5, 4)
    assert got[(1, "reply", 'contains "galactic"')] == (0.5, 4)  # "intergalactic" does not count
    assert got[(1, "reasoning", 'starts with "Okay"')] == (0.5, 2)  # empty traces are left out
    assert got[(2, "reply", 'starts with "Okay"')] == (pytest.approx(1 / 3), 3)  # each reply of a multi-turn rollout
    assert (2, "reasoning", 'starts with "Okay"') not in got


def test_audit_with_regex_and_llm_judge(runs):
    from dynalize.backends.chat import ScriptedChatModel

    penalties = penalty_history(runs[1]).select("all")
    r = anyio.run(lambda: audit(penalties, "dyn", runs[0], RegexJudge()))
    # "Okay sure." and "okay then" trigger p001; p002 has no regex: undecided without an LLM judge
    assert (r.step, r.n_replies, r.share_any, r.mean_count, r.undecided) == (1, 4, 0.5, 0.5, 4)
    assert r.per_penalty["p001"]["rate"] == 0.5 and r.per_penalty["p002"]["rate"] is None

    def llm(messages):
        return json.dumps({"p002": "<reply" in messages[-1].content and "\nHello\n" in messages[-1].content})

    r = anyio.run(lambda: audit(penalties, "dyn", runs[0], Judge(ScriptedChatModel(llm))))
    assert (r.share_any, r.mean_count, r.undecided) == (0.75, 0.75, 0)
    assert r.per_penalty["p002"]["rate"] == 0.25


def test_replies_and_contexts_of_multiturn_rows(runs):
    rows = [json.loads(line) for line in (runs[1].path / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    texts, contexts = replies_of(rows)
    assert texts == ["Okay one", "two galactic", "Fine."]
    # each reply with the conversation up to it: reply 2 answers "go on", after reply 1
    assert contexts == ["[user]\nSay something.", "[user]\nSay something.\n\n[assistant]\nOkay one\n\n[user]\ngo on",
                        "[user]\nSay something."]


def test_report_cli_writes_tables_and_plots(runs, tmp_path):
    out = tmp_path / "report"
    argv = [str(r.path) for r in runs] + ["--out", str(out), "--starts-with", "Okay", "--contains", "galactic"]
    assert report_main(argv) == 0
    md = (out / "report.md").read_text()
    assert "| dyn | 57.00 (175) | 56.00 (3) | 56.00 (200) | 0.300 | +5.00 | +8.00 | +10.00 | -0.400 |" in md
    assert "| short | 60.00 (100) | n/a | 60.00 (100) | n/a | +8.00 | n/a | +14.00 | n/a |" in md
    assert "| dyn | 5.00 (+1.50) | 2.00 (-0.50) |" in md  # the MindEval per-axis table
    data = json.loads((out / "report.json").read_text())
    assert data["tables"][0]["rows"][1]["end"] == 56.0
    for name in ("scores_eqbench.png", "scores_mindeval.png", "penalties_dyn.png", "patterns.png"):
        assert (out / name).stat().st_size > 1000, name


def judged(step, score, model, complete=True):
    return {"step": step, "score": score, "complete": complete, "settings": {"judge": {"model": model}}}


def test_judges_side_by_side(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_jsonl(a / "eval" / "mindeval.jsonl", [judged(150, 3.0, "j1"), judged(200, 3.4, "j1")])
    write_jsonl(a / "eval" / "mindeval@second.jsonl", [judged(150, 4.0, "j2"), judged(200, 3.0, "j2")])
    write_jsonl(b / "eval" / "mindeval.jsonl", [judged(150, 3.5, "j1"), judged(200, 3.7, "j1", complete=False)])
    write_jsonl(b / "eval" / "mindeval@second.jsonl", [judged(150, 3.9, "j2")])
    runs = [Run(a), Run(b)]
    assert parse_metric("mindeval@second") == Metric("eval/mindeval@second", "score")
    metrics = judge_metrics(runs, "mindeval")
    assert [m.source for m in metrics] == ["eval/mindeval", "eval/mindeval@second"]
    header, body, _ = judges_table(runs, metrics, [judge_name(runs, m) for m in metrics], window=(150, 200))
    assert header == ["run", "j1 Peak (step)", "j1 End (n)", "j1 Final (step)", "second (j2) Peak (step)",
                      "second (j2) End (n)", "second (j2) Final (step)"]
    # a, j1: (3.0 + 3.4) / 2; j2: peak 4.0 at 150, End (4.0 + 3.0) / 2, final 3.0; b, j2: only step 150
    assert body == [["a", "3.40 (200)", "3.20 (2)", "3.40 (200)", "4.00 (150)", "3.50 (2)", "3.00 (200)"],
                    ["b", "3.70 (200)", "3.60 (2)", "3.70 (200)", "3.90 (150)", "3.90 (1)", "3.90 (150)"]]
    out = tmp_path / "report"
    assert report_main([str(a), str(b), "--out", str(out), "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "## mindeval: the same generations under each judge" in md
    assert "| a | 3.40 (200) | 3.20 (2) | 3.40 (200) | 4.00 (150) | 3.50 (2) | 3.00 (200) |" in md
    assert "b: mindeval at step 200 is not complete" in md
    assert json.loads((out / "report.json").read_text())["judges"][0]["judges"] == ["j1", "second (j2)"]


def test_audit_cli(runs, tmp_path, capsys):
    out = tmp_path / "audit"
    assert report_main(["audit", "--penalties", str(runs[1].path), "--rollouts", str(runs[0].path),
                        str(runs[1].path), "--step", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "audit_dyn_all.json").read_text())
    assert [(r["target"], r["share_any"]) for r in rows] == [("base", 0.5), ("dyn", 0.25)]  # "*Okay*" fails the regex
    assert "pass --judge" in capsys.readouterr().out
    assert report_main(["audit", "--penalties", str(runs[0].path), "--rollouts", str(runs[1].path)]) == 2
    assert "has no penalties" in capsys.readouterr().err


def test_report_errors_are_one_line(tmp_path, capsys):
    assert report_main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().endswith("is not a run directory")
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2
    assert "evaluate first" in capsys.readouterr().err


def test_penalties_from_the_last_checkpoint_without_events(tmp_path):
    from dynalize.penalties.buffer import PenaltyBuffer
    from dynalize.penalties.candidate import Candidate

    buf = PenaltyBuffer()
    buf.add(Candidate("Opens with Okay", "d", ["a"], r"(?i)\Aokay"), step=5)
    buf.add(Candidate("Mentions stars", "d", ["b"]), step=10)
    buf.end_step(12, {"p002": 3}, n_judged=10)  # p001 untriggered: retired at 12
    ckpt = tmp_path / "run" / "checkpoints" / "step_000020"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 20, "penalties": {"buffer": buf.to_json()}}))
    # per-step prevalence lives in the metrics (the buffer keeps no per-step history)
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({"step": 12, "penalty/p001/prevalence": 0.0, "penalty/p002/prevalence": 0.3}) + "\n")
    h = penalty_history(Run(tmp_path / "run"))
    assert h.intervals == {"p001": [(5, 12)], "p002": [(10, None)]}
    assert h.prevalence == {"p001": [(12, 0.0)], "p002": [(12, 0.3)]}
    assert [p.id for p in h.select("all")] == ["p001", "p002"] and [p.id for p in h.select("active")] == ["p002"]


def test_audit_compare_matches_new_penalties_to_old_ones_by_regex_or_verdicts(tmp_path, capsys):
    def add(pid, title, regex):
        return {"step": 1, "event": "add", "id": pid, "title": title, "description": "", "regex": regex}

    old, new = tmp_path / "old", tmp_path / "new"
    write_jsonl(old / "penalties.jsonl", [add("p001", "Opens with Okay", r"(?i)\A\s*okay\b"),
                                          add("p002", "Ends with a question", r"\?\s*\Z"),
                                          add("p003", "Says crimson", r"\bcrimson\b")])
    write_jsonl(new / "penalties.jsonl", [add("p001", "Asks at the end", r"\?\s*\Z"),  # the same regex as old p002
                                          add("p002", "Starts with okay", r"\AOkay"),  # other regex, same replies
                                          add("p003", "Says galactic", r"galactic")])  # nothing old fires with it
    write_jsonl(old / "rollouts" / "step_000003.jsonl", [rollout([r]) for r in
                                                         ("Okay, the sea.", "Okay, the moon?", "The stars?", "okay then")])
    write_jsonl(new / "rollouts" / "step_000004.jsonl", [rollout([r]) for r in ("A galactic tale.", "Plain words.")])
    out = tmp_path / "audit"
    assert report_main(["audit", "--penalties", str(new), "--compare", str(old), "--rollouts", str(old), str(new),
                        "--out", str(out)]) == 0
    got = json.loads((out / "audit_new_all.json").read_text())["compare"]
    by = {m["new"]: m for m in got["matches"]}
    assert got["replies"] == 6
    assert by["p001"]["old"] == "p002" and by["p001"]["same_regex"] and by["p001"]["matched"]
    # \AOkay fires on 2 replies, old p001 also on "okay then": overlap 2 / 3
    assert by["p002"]["old"] == "p001" and by["p002"]["jaccard"] == pytest.approx(2 / 3) and by["p002"]["matched"]
    assert not by["p003"]["matched"] and by["p003"]["new_hits"] == 1 and by["p003"]["both"] == 0
    assert got["not_found_again"] == ["p003"]
    assert "Says galactic" in capsys.readouterr().out
    assert report_main(["audit", "--penalties", str(new), "--compare", str(old), "--rollouts", str(old), str(new),
                        "--match-threshold", "0.7", "--out", str(out)]) == 0  # 2/3 < 0.7
    by = {m["new"]: m for m in json.loads((out / "audit_new_all.json").read_text())["compare"]["matches"]}
    assert not by["p002"]["matched"] and by["p001"]["matched"]
