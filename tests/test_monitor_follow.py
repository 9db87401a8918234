"""`python -m dynalize.monitor` as a user starts it next to training: `--follow` waits for the
rollouts, takes a half-written line as unfinished, writes its summary as it goes and monitors
the last step once the run stops writing; the table says when a pattern was detected and the
last gap it could measure; TRL's reward is the trainer's weighted reward; OpenRLHF's newest
table is the one of the highest step; `--help`, and a replay with the lexical proposer and the
regex judge, load no model library."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dynalize.monitor.__main__ as monitor_main
from dynalize.monitor.readers import MonitorInputError, ReadOptions, read_rollouts
from dynalize.monitor.summary import INSUFFICIENT_EXIT, LIVE_EXIT

MONITORED = (0, LIVE_EXIT, INSUFFICIENT_EXIT)
"""The exit statuses of a monitor that read its input (the verdict is not what these tests check)."""
from dynalize.runlog import read_jsonl
from test_monitor import WORDS, hacked_rows, write_jsonl


def run(*argv) -> int:
    return monitor_main.main([str(a) for a in argv])


def lines(rows) -> list[str]:
    return [json.dumps(r) + "\n" for r in rows]


def test_follow_waits_for_the_folder_its_first_file_and_a_half_written_line(tmp_path, monkeypatch):
    """A writer acts between polls (in place of the poll's sleep): the folder appears, then a
    first file, then steps with a line written in two halves, then nothing more."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    rows = hacked_rows(5)
    text = lines(r for r in rows if r["step"] < 2)
    step2 = lines(r for r in rows if r["step"] == 2)
    seen: list[dict] = []

    def writer():
        yield lambda: logs.mkdir()
        yield lambda: (logs / "r.jsonl").write_text("")
        yield lambda: (logs / "r.jsonl").write_text("".join(text) + step2[0][:25])  # half a line
        yield lambda: (logs / "r.jsonl").write_text("".join(text + step2 + lines(r for r in rows if r["step"] > 2)))
        while True:
            yield lambda: None  # the run stopped writing

    actions = writer()

    def between_polls(_seconds):
        if (out / "summary.json").exists():
            seen.append(json.loads((out / "summary.json").read_text()))
        next(actions)()

    monkeypatch.setattr(monitor_main.time, "sleep", between_polls)
    assert run(logs, "--out", out, "--follow", "--poll", "0", "--max-polls", "6") in MONITORED
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    # written as it went: step 0 once step 1 appeared (step 1 held back, step 2 half a line)
    assert [s["last_step"] for s in seen][:3] == [0, 3, 4]
    assert (out / "report.html").exists() and not list(out.glob(".*.tmp"))


def test_follow_monitors_the_held_back_step_once_the_files_stop_changing(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(4))
    run(path, "--out", tmp_path / "out", "--follow", "--poll", "0", "--max-polls", "1", "--no-html")
    assert [m["step"] for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [0, 1, 2, 3]


def test_follow_takes_a_last_line_without_newline_once_the_file_is_quiet_and_it_reads_whole(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(lines(hacked_rows(3))).rstrip("\n"))  # a writer that ends no line
    run(path, "--out", tmp_path / "out", "--follow", "--poll", "0", "--max-polls", "1", "--no-html")
    assert [(m["step"], m["rollouts"]) for m in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [(0, 48), (1, 48),
                                                                                                    (2, 48)]


def test_follow_with_reward_weights_waits_for_trls_first_table(tmp_path, capsys):
    (tmp_path / "trl_out" / "completions").mkdir(parents=True)  # made by the trainer before its first log
    assert run(tmp_path / "trl_out" / "completions", "--out", tmp_path / "out", "--follow", "--poll", "0",
               "--max-polls", "1", "--reward-weights", "1,0.5") == 2
    assert "no rollouts at" in capsys.readouterr().err.strip().splitlines()[-1]


def test_follow_on_a_path_that_never_appears_writes_nothing(tmp_path, capsys):
    assert run(tmp_path / "missing", "--out", tmp_path / "out", "--follow", "--poll", "0", "--max-polls", "2") == 2
    assert "no rollouts at" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def saturating_rows(steps: int = 20, full_from: int = 15) -> list[dict]:
    """An opener the reward pays for, spreading, then in every reply from step `full_from` on."""
    rows = hacked_rows(full_from)
    rng = __import__("random").Random(1)
    for step in range(full_from, steps):
        for g in range(8):
            for _ in range(6):
                rows.append({"step": step, "prompt": f"question {g} at {step}",
                             "completion": "Certainly! " + " ".join(rng.choice(WORDS) for _ in range(12)),
                             "reward": rng.gauss(0, 1) + 1.5})
    return rows


def test_since_is_the_detection_step_and_a_saturated_gap_is_the_last_measurable_one(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", saturating_rows())
    assert run(path, "--out", tmp_path / "out", "--no-html") == LIVE_EXIT
    out = tmp_path / "out"
    (add,) = [e for e in read_jsonl(out / "penalties.jsonl") if e["event"] == "add"]
    (p,) = json.loads((out / "summary.json").read_text())["patterns"]
    assert (p["since"], p["entered"]) == (add["proposed_at"], add["step"]) and p["since"] < p["entered"]
    metrics = read_jsonl(out / "metrics.jsonl")
    key = f"penalty/{p['id']}/reward_gap"
    measured = [m for m in metrics if key in m]
    assert key not in metrics[-1] and p["prevalence"] == 1.0  # saturated: nothing left to compare with
    assert (p["reward_gap"], p["reward_gap_step"]) == (measured[-1][key], measured[-1]["step"])
    err = capsys.readouterr().err
    assert "entered" in err and f"(last measurable, step {measured[-1]['step']})" in err


def _trl_run(root, extra_numeric=True):
    """A TRL output folder: completions with two reward functions' columns, a numeric
    log_extra column, the advantage."""
    import pandas as pd

    (root / "completions").mkdir(parents=True)
    rows = [r for r in hacked_rows(2) if r["prompt"].startswith(("question 0 ", "question 1 "))]
    for step in (1, 2):
        sub = [r for r in rows if r["step"] == step - 1]
        table = {"step": [step] * len(sub),
                 "prompt": [[{"role": "user", "content": r["prompt"]}] for r in sub],
                 "completion": [[{"role": "assistant", "content": r["completion"]}] for r in sub],
                 "rm": [r["reward"] for r in sub], "length_bonus": [2.0] * len(sub)}
        if extra_numeric:
            table["n_words"] = [float(len(r["completion"].split())) for r in sub]
        pd.DataFrame({**table, "advantage": [0.0] * len(sub)}).to_parquet(
            root / "completions" / f"completions_{step:05d}.parquet")
    return [r["reward"] + 0.5 * 2.0 for r in rows]


def test_trl_reward_is_the_reward_functions_columns_weighted_as_the_run_weighs_them(tmp_path):
    import torch
    from trl import GRPOConfig

    root = tmp_path / "trl_out"
    expected = _trl_run(root)
    with pytest.raises(MonitorInputError, match="--reward-weights"):  # rm, length_bonus or n_words?
        read_rollouts(root)
    got = read_rollouts(root, options=ReadOptions(reward_weights=[1.0, 0.5]))
    assert [r.reward for r in got] == pytest.approx(expected)  # never n_words
    # the run's own files: trainer_state.json names the reward functions, training_args.bin weighs them
    ckpt = root / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"log_history": [  # the trainer's log keys are sorted
        {"step": 1, "reward": 0.1, "rewards/length_bonus/mean": 2.0, "rewards/rm/mean": 0.0}]}))
    torch.save(GRPOConfig(output_dir=str(root), reward_weights=[1.0, 0.5], use_cpu=True, bf16=False,
                          report_to="none"), ckpt / "training_args.bin")
    got = read_rollouts(root / "completions")
    assert [r.reward for r in got] == pytest.approx(expected)
    with pytest.raises(MonitorInputError, match="differs from the run's reward_weights"):
        read_rollouts(root, options=ReadOptions(reward_weights=[1.0, 1.0]))


def test_follow_monitors_trls_last_step_at_once_when_the_trainer_state_says_training_finished(tmp_path):
    root = tmp_path / "trl_out"
    _trl_run(root)
    out = tmp_path / "out"
    run(root, "--out", out, "--follow", "--max-polls", "0", "--reward-weights", "1,0.5", "--no-html")
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]  # step 2 may still grow
    (root / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": []}))
    run(root, "--out", out, "--follow", "--max-polls", "0", "--reward-weights", "1,0.5", "--no-html")
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


@pytest.mark.slow
def test_a_real_trl_run_is_read_with_its_own_reward_weights_and_its_last_step_at_once(tmp_path):
    """GRPOTrainer on the tiny policy: two reward functions weighted 1 and 0.5, one logging a
    numeric log_extra column, a checkpoint at the end; the monitor, following, takes the run's
    weights from its files and monitors the last step at once (training finished)."""
    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from dynalize import tiny

    path = tiny.resolve("tiny:policy")
    torch.manual_seed(0)

    def words(completions, log_extra=None, **kw):
        texts = [c[-1]["content"] for c in completions]
        log_extra("n_chars", [float(len(t)) for t in texts])
        return [float(len(t.split())) for t in texts]

    def vowels(completions, **kw):
        return [sum(ch in "aeiou" for ch in c[-1]["content"]) / max(1, len(c[-1]["content"])) for c in completions]

    root = tmp_path / "trl_out"
    args = GRPOConfig(output_dir=str(root), per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
                      max_steps=2, logging_steps=1, save_strategy="steps", save_steps=2, log_completions=True,
                      reward_weights=[1.0, 0.5], report_to=[], use_cpu=True, bf16=False, disable_tqdm=True)
    GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=[words, vowels], args=args,
                train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": f"topic {i}"}]}
                                                 for i in range(16)]),
                processing_class=AutoTokenizer.from_pretrained(path)).train()
    tables = [pd.read_parquet(p) for p in sorted((root / "completions").glob("*.parquet"))]
    assert all("n_chars" in t.columns for t in tables)
    expected = [w + 0.5 * v for t in tables for w, v in zip(t["words"], t["vowels"])]
    assert [r.reward for r in read_rollouts(root / "completions")] == pytest.approx(expected)
    out = tmp_path / "watch"
    run(root / "completions", "--out", out, "--follow", "--max-polls", "0", "--no-html")
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def test_an_inert_read_of_training_args_runs_none_of_its_code(tmp_path):
    """A pickle that would run code if unpickled normally is read as inert fields."""
    import pickle
    import zipfile

    from dynalize.monitor.trl_args import read_training_args

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    path = tmp_path / "training_args.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("training_args/data.pkl", pickle.dumps({"a": Boom()}))
    read_training_args(path)
    assert not (tmp_path / "ran").exists()


def test_openrlhf_reads_the_table_of_the_highest_step_whatever_the_file_times(tmp_path):
    table = tmp_path / "wandb" / "run-x" / "files" / "media" / "table" / "train"
    table.mkdir(parents=True)
    old = table / "generated_samples_5_aa11.table.json"
    new = table / "generated_samples_10_bb22.table.json"
    new.write_text(json.dumps({"columns": ["global_step", "text", "reward"],
                               "data": [[s, f"reply {s}", 0.1 * s] for s in range(1, 11)]}))
    old.write_text(json.dumps({"columns": ["global_step", "text", "reward"],
                               "data": [[s, f"reply {s}", 0.1 * s] for s in range(1, 6)]}))
    os.utime(new, (1_000_000, 1_000_000))  # a sync or a copy gave the newest table the oldest time
    assert [r.step for r in read_rollouts(tmp_path / "wandb")] == list(range(1, 11))


def test_help_loads_no_model_library(tmp_path):
    code = ("import runpy, sys\nsys.argv = ['dynalize.monitor', '--help']\n"
            "try:\n    runpy.run_module('dynalize.monitor', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'pandas', 'pyarrow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--follow" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "[]"


def _trl_step(completions, step, rows):
    """TRL's table of one logged step: `completions/completions_NNNNN.parquet`, one reward column."""
    import pandas as pd

    sub = [r for r in rows if r["step"] == step]
    pd.DataFrame({"step": [step] * len(sub), "prompt": [r["prompt"] for r in sub],
                  "completion": [r["completion"] for r in sub], "rm": [r["reward"] for r in sub],
                  "advantage": [0.0] * len(sub)}).to_parquet(completions / f"completions_{step:05d}.parquet")


def test_follow_names_the_steps_a_rotating_trl_writer_removed_before_they_were_read(tmp_path):
    """Two real `monitor --follow` processes, a TRL writer rotating its tables between them (it keeps
    the newest three). Before: steps 0, 1, 7, 8 monitored and 2-6 skipped without a word."""
    completions, out = tmp_path / "trl_out" / "completions", tmp_path / "watch"
    completions.mkdir(parents=True)
    rows = hacked_rows(10)
    argv = [sys.executable, "-m", "dynalize.monitor", str(completions), "--out", str(out), "--follow", "--poll", "0",
            "--max-polls", "0", "--no-html"]
    env = {**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parent.parent)}
    for step in (0, 1, 2):
        _trl_step(completions, step, rows)
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode in MONITORED, first.stderr
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1]  # step 2 held back: it may grow
    for step in range(3, 10):
        _trl_step(completions, step, rows)
    for step in range(0, 7):
        (completions / f"completions_{step:05d}.parquet").unlink()
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode in MONITORED, second.stderr
    warned = [line for line in second.stderr.splitlines() if "vanished before the monitor read them" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: step(s) 2, 3, 4, 5, 6 vanished"), second.stderr
    assert warned[0].endswith("summary.json counts them (vanished_steps)")  # one line, not wrapped
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1, 7, 8]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["vanished"], summary["vanished_steps"]) == (5, [2, 3, 4, 5, 6])
    assert "5 logged step(s) vanished before they were read" in summary["verdict"]


def test_follow_names_a_listed_step_whose_file_was_removed_before_it_was_monitored(tmp_path, monkeypatch, capsys):
    """Within one invocation: the held-back newest step's file is removed before the next poll."""
    completions, out = tmp_path / "trl_out" / "completions", tmp_path / "watch"
    completions.mkdir(parents=True)
    rows = hacked_rows(6)
    for step in (0, 1, 2):
        _trl_step(completions, step, rows)

    def writer():
        (completions / "completions_00002.parquet").unlink()
        for step in (3, 4, 5):
            _trl_step(completions, step, rows)
        yield
        while True:
            yield

    actions = writer()
    monkeypatch.setattr(monitor_main.time, "sleep", lambda _s: next(actions))
    assert run(completions, "--out", out, "--follow", "--poll", "0", "--max-polls", "2", "--no-html") in MONITORED
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1, 3, 4, 5]
    assert [json.loads(line) for line in (out / "vanished.jsonl").read_text().splitlines()] == [
        {"step": 2, "how": "listed"}]
    assert json.loads((out / "summary.json").read_text())["vanished_steps"] == [2]


def test_a_first_step_logged_off_the_cadence_is_no_gap():
    from dynalize.monitor.vanished import cadence

    assert cadence({1, 10, 20, 30}) == 10 and cadence({0, 5}) is None and cadence({0, 1, 2, 7, 8, 9}) == 1


def test_a_lexical_replay_with_the_regex_judge_loads_no_model_library(tmp_path):
    """The whole monitor, to its report.html, in a process of its own: neither torch nor transformers
    is imported (what it loads, not how long it takes)."""
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(12))
    code = ("import runpy, sys\nsys.argv = ['dynalize.monitor'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('dynalize.monitor', run_name='__main__')\nexcept SystemExit as e:\n"
            "    print('exit', e.code)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'trl') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(path), "--out", str(tmp_path / "out"),
                           "--proposer", "lexical", "--judge", "regex"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [f"exit {LIVE_EXIT}", "[]"], proc.stdout
    assert (tmp_path / "out" / "report.html").exists()


def test_a_ctrl_c_absorbed_inside_a_poll_still_stops_the_follow(tmp_path, monkeypatch):
    """Ctrl-C lands while a poll runs, and code inside the poll takes the interrupt for its own (as
    a task can take an event loop's cancellation): the monitor still stops at once, reports what
    it monitored and exits 130, instead of following on until killed."""
    import signal

    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(3))
    polls: list[int] = []
    real_poll = monitor_main.Watch.poll

    def poll_absorbing_ctrl_c(self):
        polls.append(1)
        n = real_poll(self)
        if len(polls) == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                signal.sigtimedwait([], 0)  # a point where Python runs the handler (it runs between bytecodes)
            except KeyboardInterrupt:
                pass  # absorbed
        return n

    monkeypatch.setattr(monitor_main.Watch, "poll", poll_absorbing_ctrl_c)
    monkeypatch.setattr(monitor_main.time, "sleep", lambda s: None)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whoever started pytest
    try:
        status = run(path, "--out", tmp_path / "out", "--follow", "--poll", "0", "--max-polls", "50", "--no-html")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the monitor's handler is gone with it
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert status == 130 and len(polls) == 2 and (tmp_path / "out" / "summary.json").exists()
