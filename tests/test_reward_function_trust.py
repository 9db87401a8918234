"""No reward function, and no column of its data, can silently change what is trained or recorded:
a metric it logs never replaces the run's own fields (a resume would trim the log by a false
step), a column named like an argument TRL passes is refused, what it returns is read strictly
(one line, exit 2), NaN or inf weights are refused before the run folder exists, a key in its
exception is masked, and a stop for rollouts it left unscored names it, not a judge."""

from __future__ import annotations

import json
import math

import anyio
import numpy as np
import pytest

import dynalize
from dynalize import run as cli
from dynalize.rewards.functions import FunctionsTerm, RewardFunction
from dynalize.runlog import read_jsonl
from dynalize.types import Batch, Message, Rollout

ROWS = [{"prompt": [{"role": "user", "content": f"Say {w}."}], "answer": w}
        for w in ["one", "three", "seven", "eleven", "twelve", "nine", "four", "two"]]
KEY = "sk-proj-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


def tiny(tmp_path, rows=ROWS, **extra):
    return {"output_dir": str(tmp_path), "name": "r", "steps": 2, "batch_size": 8, "group_size": 4,
            "progress": False, "checkpoint_every": 1, "export_final": False, "generator": {"max_new_tokens": 8},
            "task": {"name": "prompts", "args": {"train_file": rows, "eval_fraction": 0}},
            "reward_model": {"enabled": False}, **extra}


def cli_argv(tmp_path, *extra):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return [f"output_dir={tmp_path / 'runs'}", "name=cli", "steps=1", "batch_size=8", "group_size=4",
            "progress=false", "generator.max_new_tokens=8", "task.name=prompts", f"task.args.train_file={rows}",
            "task.args.eval_fraction=0", "reward_model.enabled=false", *extra]


def logs_over_the_runs_fields(completions, log_metric, **kwargs):
    log_metric("step", 999)
    log_metric("reward/mean", 5.0)
    log_metric("accuracy", 0.25)
    log_metric("accuracy", 0.75)
    return [float(len(c[0]["content"])) for c in completions]


def test_a_logged_metric_never_replaces_the_runs_fields_and_a_resume_keeps_every_step(tmp_path):
    result = dynalize.train(tiny(tmp_path, reward_funcs=[logs_over_the_runs_fields]))
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["user/step"] == 999 and r["user/reward/mean"] == 5.0 and r["user/accuracy"] == 0.5 for r in rows)
    assert all(r["reward/mean"] != 5.0 for r in rows)
    dynalize.train(tiny(tmp_path, reward_funcs=[logs_over_the_runs_fields], steps=3), resume=result.run_dir)
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1, 2, 3]


def scores_the_column(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


@pytest.mark.parametrize("column", ["completions", "prompts", "trainer_state", "completion_ids"])
def test_a_data_column_named_like_a_trl_argument_is_refused_before_the_run_folder_exists(tmp_path, column):
    rows = [{**r, column: "not the reply"} for r in ROWS]
    with pytest.raises(dynalize.ConfigError) as caught:
        dynalize.train(tiny(tmp_path, rows=rows, reward_funcs=[scores_the_column]))
    assert f"the data has a column {column!r}" in str(caught.value) and "rename the column" in str(caught.value)
    assert not (tmp_path / "r").exists()


def batch_of(n=4):
    return Batch(0, [[Rollout(f"p{i}", 0, [1], [2, 3], [0.0, 0.0], [1, 1], ["hi"], 0,
                              messages=[Message("user", "q")], turns=[Message("assistant", "hi")]) for i in range(n)]])


@pytest.mark.parametrize(("returned", "message"), [
    ({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, "must return a list of numbers (None where it does not apply), got dict"),
    (["1.0"] * 4, "returned '1.0', a str, not a number (item 0"),
    ([1.0, 2.0, 3.0, 10**400], "returned 1000000000"),
    ([1e308, 1.0, 1.0, 1.0], "returned 1e+308, not a finite number (item 0; a score must lie within ±1e+30"),
    ([-1e308] * 4, "returned -1e+308, not a finite number"),
    ("1234", "got str"),
    ([1.0, None, [2.0], 3.0], "returned '[2.0]', a list, not a number (item 2"),
])
def test_a_reward_functions_return_value_is_read_strictly(returned, message):
    term = FunctionsTerm([RewardFunction("f", lambda completions, **k: returned)], steps=1)
    with pytest.raises(dynalize.ConfigError, match="reward function 'f' at step 1 ") as caught:
        anyio.run(term.score, batch_of())
    assert message in str(caught.value)


def test_numbers_of_any_numeric_type_are_taken_as_trl_takes_them():
    import torch

    for returned in ([1, True, np.float32(0.5), None], np.array([1.0, 1.0, 0.5, np.nan])[:3].tolist() + [None],
                     torch.tensor([1.0, 1.0, 0.5, 2.0]), (1.0, 1.0, torch.tensor(0.5), None)):
        term = FunctionsTerm([RewardFunction("f", lambda completions, **k: returned)], steps=1, alone=False)
        values = anyio.run(term.score, batch_of()).values
        assert values[:3] == [1.0, 1.0, 0.5] and math.isfinite(values[3])


def huge(completions, **kwargs):
    return [10**400] * len(completions)


def test_a_huge_int_from_a_reward_function_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(cli_argv(tmp_path, "reward_funcs=[test_reward_function_trust:huge]")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: reward function 'huge' at step 1 returned 1000"), err
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_nan_or_inf_reward_weights_are_refused_before_anything_is_written(tmp_path, capsys, weight):
    argv = cli_argv(tmp_path, "reward_funcs=[test_reward_function_trust:huge]", f"reward_weights=[{weight}]")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: config error: reward_weights.0: Input should be a finite number"], err
    assert not (tmp_path / "runs").exists()


def leaks_a_key(completions, **kwargs):
    raise RuntimeError(f"POST https://api.grader.example/v1?api_key={KEY} failed; Authorization: Bearer {KEY}")


def test_a_key_in_a_reward_functions_exception_is_masked_in_the_line_and_the_traceback(tmp_path, capsys):
    assert cli.main(cli_argv(tmp_path, "reward_funcs=[test_reward_function_trust:leaks_a_key]")) == 1
    err = capsys.readouterr().err
    assert KEY not in err and "score of reward function 'leaks_a_key' (the batch of step 1) raised RuntimeError" in err
    assert "Bearer ***" in err and "Traceback" in err
    with pytest.raises(dynalize.HookError) as caught:
        dynalize.train(tiny(tmp_path, reward_funcs=[leaks_a_key]))
    assert KEY not in str(caught.value)


def applies_to_none(completions, **kwargs):
    return [None] * len(completions)


def test_a_stop_for_rollouts_the_reward_functions_left_unscored_names_them_not_a_judge(tmp_path, capsys):
    argv = cli_argv(tmp_path, "reward_funcs=[test_reward_function_trust:applies_to_none]", "left_out_window=1")
    assert cli.main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stopped: 8 of 8 rollouts (100%) were left out"), err
    assert "8 by reward_funcs (every reward function returned None for it)" in err[-1] and "judge" not in err[-1]
