"""Rubric runs a user can trust: a gold judge that failed makes the run end with exit status 4 and a
line naming it; the saved held-out replies are graded again (`eval --bench rubric`), also by a second
gold judge; every judge warning names its role."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from dynalize.eval.__main__ import main as eval_main
from dynalize.report import main as report_main
from dynalize.run import main
from dynalize.runlog import read_jsonl

from test_rubric_e2e import sample_config

REPO = Path(__file__).resolve().parent.parent


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def gold_down_config(tmp_path: Path, name: str = "down") -> dict:
    data = sample_config(tmp_path, name=name, reward_model={"enabled": False}, penalties={"enabled": False})
    data["rubric"]["gold_judge"] = {"engine": "llm", "chat": {
        "engine": "openai", "base_url": closed_port_url(), "model": "gold", "api_key_env": None,
        "timeout": 30.0, "max_retries": 0}}
    data["preflight"] = False  # a judge that goes down after the start (the preflight stops one down at it: exit 2)
    return data


def test_a_run_whose_gold_judge_is_down_ends_with_status_4_naming_the_judge(tmp_path, capsys):
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump(gold_down_config(tmp_path)))
    assert main(["--config", str(path)]) == 4
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("incomplete: ") and "gold judge (rubric.gold_judge) failed on" in last
    evals = read_jsonl(tmp_path / "down" / "eval" / "task.jsonl")
    n = int(sum(e["rubric/unscored_gold"] for e in evals))
    assert f"failed on {n} of {n} held-out replies" in last and n > 0
    assert "--bench rubric" in last
    assert "INCOMPLETE" in captured.out  # the summary says it too
    assert "role='gold judge'" in captured.err or "role=gold judge" in captured.err  # judge.call_failed


def test_a_complete_measurement_ends_with_status_0(tmp_path, capsys):
    data = sample_config(tmp_path, name="ok", reward_model={"enabled": False}, penalties={"enabled": False})
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--config", str(path)]) == 0
    assert "held-out measurement" in capsys.readouterr().out


def _strict_server_answer(body: dict) -> str:
    from rubricjudge import strict

    from dynalize.types import as_messages

    messages = as_messages(body["messages"])
    if "<reply-" not in messages[-1].content:  # the endpoint check before grading
        return "OK"
    return strict(messages)


def test_a_run_whose_gold_judge_was_down_is_graded_again_and_by_a_second_gold_judge(tmp_path, capsys):
    from faultserver import FaultServer

    from dynalize.run import incomplete_measurements

    down = {"on": True}
    server = FaultServer(_strict_server_answer, lambda body: "500" if down["on"] else None)
    with server:
        data = gold_down_config(tmp_path, "again")
        data["rubric"]["gold_judge"]["chat"]["base_url"] = server.base_url
        path = tmp_path / "again.yaml"
        path.write_text(yaml.safe_dump(data))
        assert main(["--config", str(path)]) == 4
        run = tmp_path / "again"
        assert incomplete_measurements(run)
        down["on"] = False  # the gold judge is back: grade what it failed on
        calls_before = len(server.requests)
        assert eval_main(["--run", str(run), "--bench", "rubric"]) == 0
        rows = read_jsonl(run / "eval" / "rubric.jsonl")
        evals = read_jsonl(run / "eval" / "task.jsonl")
        assert [r["step"] for r in rows] == [e.get("step", e["version"]) for e in evals]
        assert all(r["complete"] and r["rubric/unscored"] == 0 and "rubric/gold" in r for r in rows)
        replies = int(sum(r["rubric/replies"] for r in rows))
        assert len(server.requests) - calls_before == replies + 1  # each failed reply once, and the check
        assert incomplete_measurements(run) == []  # run.py no longer counts it missing
        # the verdicts are the scripted strict judge's own
        raw = read_jsonl(run / "eval" / "rubric_raw" / f"step_{rows[-1]['step']:06d}.jsonl")
        assert all(rec["gold_failed"] == [] and rec["proxy_failed"] == [] for rec in raw)
        # nothing failed now: a rerun grades nothing
        n = len(server.requests)
        assert eval_main(["--run", str(run), "--bench", "rubric"]) == 0
        assert len(server.requests) == n + 1  # the endpoint check only
    # a second, independent gold judge on the same replies (here: the lenient proxy's rule as gold)
    spec = json.dumps({"engine": "scripted", "path": "rubricjudge:lenient"})
    assert eval_main(["--run", str(run), "--bench", "rubric", "--rejudge", "lenient", "--judge", spec]) == 0
    second = read_jsonl(run / "eval" / "rubric@lenient.jsonl")
    assert [r["step"] for r in second] == [r["step"] for r in rows]
    assert all(r["rubric/gap"] == pytest.approx(0.0) for r in second)  # same rule as the proxy: no gap
    assert report_main(["rubric", str(run), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    text = (tmp_path / "rep" / "rubric_report.md").read_text()
    assert "Gold per judge" in text
    own = f"{rows[-1]['rubric/gold']:.3f}"
    lenient = f"{second[-1]['rubric/gold']:.3f}"
    table = text.split("Gold per judge")[1].split("##")[0]
    assert "the run's gold judge" in table and "| lenient" in table and own in table and lenient in table


# --- rubric data and settings checked ---------------------------------------------------------------

def _rar_train(tmp_path: Path, **dropout) -> dict:
    data = sample_config(tmp_path, name="rar", reward_model={"enabled": False}, penalties={"enabled": False})
    data["task"]["args"].update(train_file=str(REPO / "examples/data/rubric_rar_sample.jsonl"), format="rar", eval_format=None)
    data["rubric"]["dropout"].update(dropout)
    return data


def test_a_dropout_tag_or_id_that_matches_no_criterion_stops_the_run_in_one_line(tmp_path, capsys):
    for field, value, expect in (
            ("protected_tags", ["category:essentail"], "tag 'category:essentail' matches no criterion of the "
                                                       "training data (tags match case-insensitively); closest "
                                                       "there: category:essential"),
            ("protected_ids", ["nope#1"], "id 'nope#1' matches no criterion"),
            ("tag_rates", {"axis:accuracy": 0.1}, "tag 'axis:accuracy' matches no criterion"),
            ("id_rates", {"x": 0.1}, "id 'x' matches no criterion")):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(_rar_train(tmp_path, **{field: value})))
        assert main(["--config", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == f"error: config error: rubric.dropout.{field}: {expect}" or \
            (err.startswith(f"error: config error: rubric.dropout.{field}: ") and expect in err), err


def test_rar_tags_are_protected_whatever_their_case(tmp_path):
    import anyio

    from dynalize.config import validate
    from dynalize.run import train

    data = _rar_train(tmp_path, f=0.6, min_keep=1, protected_tags=["category:Essential"])
    data["steps"] = 2
    anyio.run(train, validate(data), False, "test")
    rows = [r for p in sorted((tmp_path / "rar" / "rollouts").glob("step_*.jsonl")) for r in read_jsonl(p)]
    from dynalize.tasks.rubric import load_rubric_prompts
    from dynalize.rubrics.criteria import rubric_from_meta

    essential = {c.id for p in load_rubric_prompts(str(REPO / "examples/data/rubric_rar_sample.jsonl"), "rar")
                 for c in rubric_from_meta(p.meta) if "category:essential" in c.tags}
    dropped = {d for r in rows for d in r["rubric_dropped"]}
    assert essential and dropped and not dropped & essential


@pytest.mark.parametrize(("points", "message"), [
    (0, "weight (field 'points') is 0"),
    ("5", "weight '5' is not a number (field 'points' holds a string: write the number unquoted)"),
    ("lots", "weight 'lots' is not a number"),
])
def test_zero_or_quoted_points_are_refused_with_file_row_and_field(tmp_path, points, message):
    from dynalize.tasks.data import DataError
    from dynalize.tasks.rubric import load_rubric_prompts

    good = {"prompt_id": "a", "prompt": [{"role": "user", "content": "hi"}],
            "rubrics": [{"criterion": "Greets back.", "points": 3}]}
    bad = {**good, "prompt_id": "b", "rubrics": [good["rubrics"][0], {"criterion": "Waves.", "points": points}]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError) as e:
        load_rubric_prompts(str(path), "healthbench")
    assert str(e.value) == f"data error: {path} line 2: rubrics[1]: {message}" or \
        str(e.value).startswith(f"data error: {path} line 2: rubrics[1]: {message}")


def test_left_out_rollouts_are_written_with_a_null_reward(tmp_path):
    import anyio

    from dynalize.config import validate
    from dynalize.run import train

    data = sample_config(tmp_path, name="lo", reward_model={"enabled": False}, penalties={"enabled": False})
    data["rubric"]["judge"] = {"engine": "llm", "max_failure_rate": None,
                               "chat": {"engine": "scripted", "path": "rubricjudge:lenient_or_nothing"}}
    anyio.run(train, validate(data), False, "test")
    rows = read_jsonl(tmp_path / "lo" / "rollouts" / "step_000001.jsonl") + \
        read_jsonl(tmp_path / "lo" / "rollouts" / "step_000002.jsonl")
    left = [r for r in rows if r.get("left_out")]
    assert left and all(r["reward"] is None and r["advantage"] is None and r["scores"]["rubric"] is None
                        and r["rubric_score"] is None for r in left)
    kept = [r for r in rows if not r.get("left_out")]
    assert kept and all(isinstance(r["reward"], float) for r in kept)


def test_an_unknown_config_key_names_the_closest_known_one():
    from dynalize.config import validate
    from dynalize.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^config error: rubric.dropout.protected_tag: unknown key "
                                          r"\(did you mean 'protected_tags'\?\)$"):
        validate({"rubric": {"dropout": {"protected_tag": ["x"]}}})
    with pytest.raises(ConfigError, match=r"^config error: stpes: unknown key \(did you mean 'steps'\?\)$"):
        validate({"stpes": 3})
    with pytest.raises(ConfigError, match=r"^config error: zzzz: unknown key$"):
        validate({"zzzz": 3})


# --- docs/llm_backends.md: the rubric judge's contract ------------------------------------------------

def test_the_backends_doc_gives_the_rubric_judges_prompt_layout_and_reply_as_the_code_has_them():
    import re

    from dynalize.judge.judge import RUBRIC_PROMPT, Judge
    from dynalize.judge.verdicts import parse_verdicts, verdict_schema
    from dynalize.rubrics.criteria import Criterion

    doc = (REPO / "docs" / "llm_backends.md").read_text()
    section = doc.split("## The rubric judge: its prompt and its reply")[1].split("\n## ")[0]
    assert "counts its verdicts as not triggered" not in doc  # what the code never did
    assert 'never read\nas "not triggered"' in doc or "never read as \"not triggered\"" in doc
    criteria = [Criterion("hb#1", "Advises rest.", 5.0), Criterion("hb#2", "Claims a cure.", -3.0)]
    system, user = Judge(None, prompt=RUBRIC_PROMPT).messages("Rest it.", criteria, "[user]\nhelp")
    assert "- c1: Advises rest.\n- c2: Claims a cure." in user.content  # as the doc lists them
    for tag in ("<rubric-", "<context-", "<reply-"):
        assert tag in user.content and tag + "NONCE>" in section
    [example] = re.findall(r"```json\n(.*?)\n```", section, re.S)
    verdicts, failed = parse_verdicts(json.loads(example), ["c1", "c2", "c3"])
    assert not failed and verdicts == {"c1": True, "c2": False, "c3": True}
    schema = verdict_schema(["c1"])
    assert set(schema) == {"type", "properties", "required", "additionalProperties"}
    assert '"additionalProperties": false' in section and '{"type": "boolean"}' in section


def test_the_trackers_sample_table_has_rubric_columns_and_no_rm_column_without_an_rm():
    from dynalize.trackers import sample_columns, sample_rows

    rows = [{"prompt_id": p, "prompt": [{"role": "user", "content": f"about {p}"}], "replies": ["r"],
             "scores": {"rubric": 0.5}, "rubric_verdicts": [{"a": True, "b": False, "c": True}],
             "rubric_dropped": ["c"], "rubric_score": 0.5, "rubric_full": 0.75, "reward": 0.5} for p in ("x", "y")]
    assert sample_columns(rows) == ["step", "prompt", "reply", "rubric (masked)", "rubric (full)", "criteria met",
                                    "dropped", "reward"]
    assert sample_rows(4, rows, n=1) == [[4, "about x", "r", 0.5, 0.75, "1 of 2", "c", 0.5]]


def test_the_summarys_first_evaluation_is_the_one_before_training(tmp_path):
    import anyio

    from dynalize.config import validate
    from dynalize.run import summary_table, train

    data = sample_config(tmp_path, name="first", reward_model={"enabled": False}, penalties={"enabled": False})
    data["steps"], data["eval_every"] = 3, 3
    cfg = validate(data)
    history = anyio.run(train, cfg, False, "test")
    step0 = read_jsonl(tmp_path / "first" / "metrics.jsonl")[0]
    assert step0["step"] == 0 and "eval/rubric/proxy" in step0 and "eval/rubric/proxy" not in history[0]
    t = summary_table(cfg, history)
    names, first, last = (list(c._cells) for c in t.columns)
    row = names.index("eval/rubric/proxy")
    assert first[row] == f"{step0['eval/rubric/proxy']:.3f}" and last[row] == f"{history[-1]['eval/rubric/proxy']:.3f}"


def test_the_html_held_out_view_reads_re_graded_verdicts_reply_by_reply(tmp_path):
    from dynalize.analysis.html_rubric import held_out
    from dynalize.analysis.runs import Run
    from dynalize.runlog import write_jsonl_atomic

    crit = [{"id": "a", "text": "Says a.", "weight": 1.0, "tags": []}, {"id": "b", "text": "Says b.", "weight": 1.0, "tags": []}]
    row = {"prompt_id": "p", "group": 0, "prompt": [{"role": "user", "content": "q"}], "rubric_criteria": crit,
           "proxy_verdicts": [{"a": True, "b": True}], "proxy_failed": [[]], "gold_verdicts": [{"a": False, "b": False}],
           "gold_failed": [["a", "b"]], "proxy_score": [None], "gold_score": [None]}
    (tmp_path / "r" / "rollouts").mkdir(parents=True)
    (tmp_path / "r" / "eval" / "rubric_raw").mkdir(parents=True)
    write_jsonl_atomic(tmp_path / "r" / "rollouts" / "eval_000002.jsonl",
                       [{**row, "replies": ["one"]}, {**row, "replies": ["two"]}])  # two samples, one group
    raw = [{"prompt_id": "p", "group": 0, "reply": 0, "proxy": {"a": True, "b": True}, "proxy_failed": [],
            "gold": gold, "gold_failed": []} for gold in ({"a": True, "b": False}, {"a": False, "b": True})]
    write_jsonl_atomic(tmp_path / "r" / "eval" / "rubric_raw" / "step_000002.jsonl", raw)
    [step] = held_out(Run(tmp_path / "r"))
    assert step["step"] == 2 and [x["reply"] for x in step["replies"]] == ["one", "two"]
    assert [x["disagree"] for x in step["replies"]] == [["b"], ["a"]]  # each reply its own re-graded verdicts
