"""`python -m dynalize.monitor`: reading other frameworks' rollout logs, replaying the penalty term
over them, continuing exactly, and saying in numbers and an exit status what is live."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from dynalize.monitor.__main__ import main
from dynalize.monitor.readers import ReadOptions, by_step, read_rollouts
from dynalize.monitor.summary import LIVE_EXIT
from dynalize.runlog import read_jsonl

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "home", "slowly"]


def hacked_rows(steps: int, seed: int = 0, opener: str = "Certainly! ", pay: float = 1.5) -> list[dict]:
    """8 prompts x 6 replies a step; an opener that the reward pays for spreads over the steps."""
    rng = random.Random(seed)
    rows = []
    for step in range(steps):
        for g in range(8):
            for _ in range(6):
                hack = rng.random() < min(0.9, 0.1 + 0.04 * step)
                text = (opener if hack else "") + " ".join(rng.choice(WORDS) for _ in range(12))
                rows.append({"step": step, "prompt": f"question {g} at {step}", "completion": text,
                             "reward": rng.gauss(0, 1) + (pay if hack else 0.0)})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run(*argv) -> int:
    return main([str(a) for a in argv] + ["--no-html"])


def test_each_framework_format_reads_as_the_same_rollouts(tmp_path):
    import pandas as pd

    rows = [r for r in hacked_rows(2) if r["prompt"].startswith(("question 0 ", "question 1 "))]
    plain = write_jsonl(tmp_path / "plain.jsonl", rows)
    pd.DataFrame(rows).to_csv(tmp_path / "plain.csv", index=False)
    # TRL: completions/completions_NNNNN.parquet, conversational prompt and completion, one column per
    # reward function (their sum is the reward), extra columns, the advantage
    trl = tmp_path / "trl" / "completions"
    trl.mkdir(parents=True)
    for step in (0, 1):
        sub = [r for r in rows if r["step"] == step]
        pd.DataFrame({"step": [step] * len(sub),
                      "prompt": [[{"role": "user", "content": r["prompt"]}] for r in sub],
                      "completion": [[{"role": "assistant", "content": r["completion"]}] for r in sub],
                      "rm": [r["reward"] - 0.25 for r in sub], "length_bonus": [0.25] * len(sub),
                      "advantage": [0.0] * len(sub)}).to_parquet(trl / f"completions_{step:05d}.parquet")
    # verl: trainer.rollout_data_dir/<step>.jsonl with input, output, score, step
    verl = tmp_path / "verl"
    verl.mkdir()
    for step in (0, 1):
        write_jsonl(verl / f"{step}.jsonl", [{"input": r["prompt"], "output": r["completion"], "gts": None,
                                              "score": r["reward"], "step": step} for r in rows if r["step"] == step])
    expected = [(r["step"], r["completion"], round(r["reward"], 9)) for r in rows]
    for path in (plain, tmp_path / "plain.csv", tmp_path / "trl", verl):
        # two reward columns and no training_args.bin: the weights come from --reward-weights
        got = read_rollouts(path, options=ReadOptions(reward_weights=[1.0, 1.0]) if path.name == "trl" else None)
        assert [(g.step, g.replies[0], round(g.reward, 9)) for g in got] == expected, path
        assert [g.prompt[-1].content for g in got] == [r["prompt"] for r in rows]
        assert len({g.group for g in got if g.step == 0}) == len({r["prompt"] for r in rows if r["step"] == 0})
    # OpenRLHF: the W&B table train/generated_samples (global_step, text, reward), the newest file holds all
    table = tmp_path / "wandb" / "run-x" / "files" / "media" / "table" / "train"
    table.mkdir(parents=True)
    (table / "generated_samples_1_ab.table.json").write_text(json.dumps(
        {"columns": ["global_step", "text", "reward"], "data": [[1, "a reply", 0.5], [2, "another", 1.0]]}))
    got = read_rollouts(tmp_path / "wandb")
    assert [(g.step, g.replies, g.reward) for g in got] == [(1, ["a reply"], 0.5), (2, ["another"], 1.0)]
    assert list(by_step(got, merge=2)) == [0, 2]


def test_messages_column_splits_at_the_first_assistant_message(tmp_path):
    conv = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"},
            {"role": "assistant", "content": "bye"}]
    path = write_jsonl(tmp_path / "mt.jsonl", [{"step": 0, "messages": conv, "score": 1.0}])
    (r,) = read_rollouts(path, columns={"reward": "score"})
    assert [m.content for m in r.prompt] == ["be kind", "hi"]
    assert r.replies == ["hello", "bye"] and r.reward == 1.0


@pytest.mark.parametrize("row, problem", [
    ({"step": 0, "prompt": "p", "completion": "c"}, "no 'reward'"),
    ({"step": 0, "prompt": "p", "completion": "c", "reward": "high"}, "reward is not a number"),
    ({"step": -1, "prompt": "p", "completion": "c", "reward": 1}, "step must be a whole number"),
    ({"step": 0, "prompt": "p", "completion": "c", "reward": float("inf")}, "not finite"),
])
def test_bad_rows_stop_with_one_line_naming_the_row(tmp_path, capsys, row, problem):
    path = write_jsonl(tmp_path / "bad.jsonl", [row])
    assert run(path, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and problem in err[0] and "bad.jsonl line 1" in err[0]


def test_a_hack_the_reward_pays_for_is_found_and_the_exit_status_says_so(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(20))
    assert run(path, "--out", tmp_path / "out") == LIVE_EXIT
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (p,) = [p for p in summary["patterns"] if p["live"]]
    assert "Certainly" in p["title"] and p["since"] <= 11
    # prevalence and reward gap of the last step, from its rollout file
    last = read_jsonl(tmp_path / "out" / "rollouts" / "step_000019.jsonl")
    hit = [r["verdicts"][p["id"]] for r in last]
    assert p["prevalence"] == pytest.approx(sum(hit) / len(hit))
    assert all(r["verdicts"][p["id"]] == r["replies"][0].startswith("Certainly!") for r in last)
    assert p["reward_gap"] > 0.5
    assert "live at step 19" in summary["verdict"]


def test_a_pattern_the_last_proposal_found_is_not_an_all_clear(tmp_path):
    # the proposal at the last step (5) finds the opener; it would enter the buffer at step 6, which
    # the log does not have yet: before, "no discovered pattern is live" and exit 0
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(6))
    assert run(path, "--out", tmp_path / "out") == LIVE_EXIT
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["live"] == 0 and "Certainly" in summary["verdict"] and "next step" in summary["verdict"]
    assert "Certainly" in summary["queued"]["regex"] and summary["queued"]["step"] == 6
    # once the next step is monitored it is live as any other
    write_jsonl(tmp_path / "r.jsonl", hacked_rows(8))
    assert run(path, "--out", tmp_path / "out") == LIVE_EXIT
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["live"] == 1 and summary["queued"] is None


def test_a_reward_that_pays_for_nothing_gives_exit_0(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(15, pay=0.0, opener=""))
    assert run(path, "--out", tmp_path / "out") == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["live"] == 0


def test_a_continued_monitor_equals_one_made_in_one_go(tmp_path):
    rows = hacked_rows(20, seed=3)
    full = write_jsonl(tmp_path / "full.jsonl", rows)
    grow = write_jsonl(tmp_path / "grow.jsonl", [r for r in rows if r["step"] < 8])
    run(full, "--out", tmp_path / "once")
    run(grow, "--out", tmp_path / "twice")
    shutil.copy(full, grow)  # the training run wrote more steps
    run(grow, "--out", tmp_path / "twice")
    def decided(name, folder):  # latencies are measured, not decided
        return [{k: v for k, v in r.items() if "latency" not in k} for r in read_jsonl(tmp_path / folder / name)]

    for name in ("metrics.jsonl", "penalties.jsonl", "rollouts/step_000019.jsonl"):
        once, twice = decided(name, "once"), decided(name, "twice")
        differ = [(i, k, a.get(k), b.get(k)) for i, (a, b) in enumerate(zip(once, twice)) for k in {*a, *b}
                  if a.get(k) != b.get(k)]
        assert len(once) == len(twice) and not differ, (name, differ[:10])
    assert any(e["event"] == "add" for e in read_jsonl(tmp_path / "once" / "penalties.jsonl"))
    assert len(read_jsonl(tmp_path / "twice" / "monitor.jsonl")) == 2


def test_follow_holds_back_the_newest_step_until_a_later_one_appears(tmp_path):
    rows = hacked_rows(6)
    grow = write_jsonl(tmp_path / "grow.jsonl", [r for r in rows if r["step"] < 4])
    run(grow, "--out", tmp_path / "out", "--follow", "--max-polls", "0")
    assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2]
    write_jsonl(grow, rows)
    run(grow, "--out", tmp_path / "out")
    assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]


def test_rows_that_changed_under_a_monitored_step_are_refused(tmp_path, capsys):
    rows = hacked_rows(4)
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    run(path, "--out", tmp_path / "out")
    rows[0]["reward"] += 1.0
    write_jsonl(path, rows)
    assert run(path, "--out", tmp_path / "out") == 2
    assert "rows of step 0 changed" in capsys.readouterr().err


def test_other_settings_on_a_continued_folder_are_refused_and_a_foreign_folder_is_not_used(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(3))
    run(path, "--out", tmp_path / "out")
    assert run(path, "--out", tmp_path / "out", "--every", "2") == 2
    assert "other penalty settings" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert run(path, "--out", tmp_path / "mine") == 2
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_the_html_report_reads_a_monitor_folder(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(12))
    assert main([str(path), "--out", str(tmp_path / "out")]) == LIVE_EXIT
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Certainly" in page and "p001" in page


@pytest.mark.slow
def test_the_worked_example_monitors_an_rm_only_run_as_dynalize_would(tmp_path):
    """examples/monitor_sandbox.py at a small size: the monitor, reading only the RM-only run's
    rollouts in the plain format, finds a pattern the Dynalize run's own penalties match."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("monitor_sandbox", "examples/monitor_sandbox.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "ex"
    # 30 of the example's 100 steps at half its batch: with the error rate spent over the run and no
    # length limit below the untrained median (the defaults), such steps find nothing, so this small
    # size holds the rate per proposal and tests every limit (what the sandbox configs did before).
    # The length limits are tested net of the prompt's words a reply uses (issue 55): the planted
    # length pay (past 40 words) is too weak to show here, and "longer than 25 words", which the plain
    # reward paid for its topic words, is no longer proposed; the planted closing question is found at
    # step 20 (the monitor) and 26 (the Dynalize arm), so both need the steps after it
    assert example.main(["--steps", "30", "--out", str(out), "--set", "batch_size=64", "--set", "torch_threads=1",
                         "--set", "penalties.view_per_group=8",
                         "--set", "penalties.proposer.lexical.fwer_scope=proposal",
                         "--set", "penalties.proposer.lexical.length_floor=null"]) == 0
    rows = read_jsonl(out / "rm_only_rollouts.jsonl")
    assert len(rows) == 30 * 64 and set(rows[0]) == {"step", "group", "prompt", "completion", "reward"}
    summary = json.loads((out / "monitor" / "summary.json").read_text())
    assert summary["patterns"], "the monitor found nothing in a run whose RM pays for planted features"
    audit = json.loads((out / "audit" / "audit_monitor_all.json").read_text())
    assert any(m["matched"] for m in audit["compare"]["matches"]), audit["compare"]
