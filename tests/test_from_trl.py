"""A TRL user's script trains unchanged (issue 46): reward functions get the dataset's columns as
TRL passes them, a list of them with weights is logged per function, export and errors work from
Python, TRL's config names are understood, and a user's rows are used as written."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dynalize
import trlrewards
from dynalize import grpo, run as cli
from dynalize.api import resolve_config
from dynalize.config import ConfigError as _ConfigError, validate
from dynalize.rewards.functions import FunctionsTerm, RewardFunction
from dynalize.resume import resume_config
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import build_task
from dynalize.tasks.creative_writing import STORY_TEMPLATE
from dynalize.trackers import sample_columns, sample_rows
from dynalize.types import Batch, Message, Rollout

REPO = Path(__file__).resolve().parent.parent

ROWS = [{"prompt": [{"role": "user", "content": f"Say {w}."}], "answer": w, "level": i}
        for i, w in enumerate(["one", "three", "seven", "eleven", "twelve", "nine", "four", "two"])]


def tiny(tmp_path, **extra):
    """A few-second run on the tiny policy: 2 steps of 8 rollouts, a reward of functions alone."""
    return {"output_dir": str(tmp_path), "name": "r", "steps": 2, "batch_size": 8, "group_size": 4,
            "progress": False, "checkpoint_every": 0, "generator": {"max_new_tokens": 8},
            "task": {"name": "prompts", "args": {"train_file": ROWS, "eval_fraction": 0}},
            "reward_model": {"enabled": False}, **extra}


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """One run with two reward functions, weighted: TRL's graded one reading `answer`, and one that
    returns None for half the rollouts."""
    trlrewards.CALLS.clear()
    tmp = tmp_path_factory.mktemp("trl")
    result = dynalize.train(tiny(tmp, reward_funcs=[trlrewards.graded, "trlrewards:every_other"],
                                 reward_weights=[1.0, 0.25]))
    return result, list(trlrewards.CALLS)


@pytest.mark.slow
def test_reward_functions_get_the_rows_columns_and_messages_as_trl_passes_them(trl_run):
    result, calls = trl_run
    assert len(calls) == 2  # once per step, the whole batch
    call = calls[0]
    assert set(call) >= {"prompts", "completions", "completion_ids", "answer", "level", "trainer_state"}
    assert "prompt" not in call and "completion" not in call
    by_prompt = {r["prompt"][0]["content"]: r for r in ROWS}
    for prompt, completion, answer, level, ids in zip(call["prompts"], call["completions"], call["answer"],
                                                      call["level"], call["completion_ids"]):
        row = by_prompt[prompt[0]["content"]]
        assert prompt == row["prompt"] and (answer, level) == (row["answer"], row["level"])
        assert completion[0]["role"] == "assistant" and isinstance(completion[0]["content"], str) and ids
    assert len(call["completions"]) == 8 and call["trainer_state"].max_steps == 2
    assert [c["trainer_state"].global_step for c in calls] == [0, 1]


@pytest.mark.slow
def test_a_list_of_weighted_functions_is_logged_per_function_and_none_adds_nothing(trl_run):
    result, calls = trl_run
    run = result.run_dir
    lines = read_jsonl(sorted((run / "rollouts").glob("step_*.jsonl"))[0])
    for i, line in enumerate(lines):
        graded, other = line["rewards"]["graded"], line["rewards"]["every_other"]
        assert other == (None if i % 2 else 2.0)
        assert line["scores"]["reward_funcs"] == pytest.approx(graded + (0.25 * other if other is not None else 0))
        assert line["reward"] == pytest.approx(line["scores"]["reward_funcs"])
    first = read_jsonl(run / "metrics.jsonl")[0]
    graded = [line["rewards"]["graded"] for line in lines]
    assert first["rewards/graded/mean"] == pytest.approx(sum(graded) / 8)
    assert first["rewards/every_other/mean"] == 2.0 and first["rewards/every_other/std"] == 0.0
    assert first["rewards/every_other/none_frac"] == 0.5
    columns = sample_columns(lines)
    assert columns[-3:] == ["rewards/graded", "rewards/every_other", "reward"]
    assert sample_rows(1, lines)[0][-3:] == [lines[0]["rewards"]["graded"], 2.0, lines[0]["reward"]]


@pytest.mark.slow
def test_the_html_report_shows_each_functions_score(trl_run, tmp_path):
    result, _ = trl_run
    out = tmp_path / "report.html"
    assert subprocess.run([sys.executable, "-m", "dynalize.report", str(result.run_dir), "--html", str(out)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=300).returncode == 0
    page = out.read_text(encoding="utf-8")
    assert '"rewards": {"graded": ' in page and '"every_other": null' in page


@pytest.mark.slow
def test_export_from_python_returns_the_path_and_never_replaces_a_run(trl_run, tmp_path):
    result, _ = trl_run
    out = dynalize.export(result.run_dir, tmp_path / "model")
    assert out == tmp_path / "model" and (out / "config.json").is_file()
    with pytest.raises(dynalize.ConfigError, match="never replaces a run"):
        dynalize.export(result.run_dir, result.run_dir.parent, overwrite=True)
    assert (result.run_dir / "metrics.jsonl").is_file()


def test_none_from_every_function_leaves_the_rollout_unscored_and_weights_sum_the_rest():
    rollouts = [Rollout(f"p{i}", 0, [1], [2, 3], [0.0, 0.0], [1, 1], ["hi"], 0,
                        messages=[Message("user", "q")], turns=[Message("assistant", "hi")]) for i in range(4)]
    term = FunctionsTerm([RewardFunction("a", lambda completions, **k: [None, 1.0, None, 3.0], 2.0),
                          RewardFunction("b", lambda completions, **k: [None, None, 5.0, 1.0], -1.0)], steps=1)
    got = __import__("anyio").run(term.score, Batch(0, [rollouts]))
    assert got.values == [0.0, 2.0, -5.0, 5.0]
    assert got.unscored == [True, False, False, False]
    beside_an_rm = FunctionsTerm(term.functions, steps=1, alone=False)
    assert __import__("anyio").run(beside_an_rm.score, Batch(0, [rollouts])).unscored is None


@pytest.mark.parametrize(("reward", "message"), [
    ("trlrewards:nan_reward", "reward function 'nan_reward' at step 1 returned nan, not a finite number"),
    ("trlrewards:short_reward", "reward function 'short_reward' at step 1 returned 7 scores for 8 completions"),
])
def test_a_bad_score_reaches_the_caller_as_one_config_error_naming_function_and_step(tmp_path, reward, message):
    with pytest.raises(dynalize.ConfigError) as caught:
        dynalize.train(tiny(tmp_path, reward_funcs=[reward]))
    assert type(caught.value) is not BaseExceptionGroup and message in str(caught.value)


@pytest.mark.parametrize(("reward", "message"), [
    (trlrewards.rm_nan, "not a finite number"), (trlrewards.rm_inf, "not a finite number"),
    (trlrewards.rm_short, "returned 7 scores for 8 texts")])
def test_a_python_rm_with_bad_scores_is_one_config_error_not_an_exception_group(tmp_path, reward, message):
    with pytest.raises(dynalize.ConfigError) as caught:
        dynalize.train(tiny(tmp_path, reward_model={"engine": "python", "path": reward}))
    assert message in str(caught.value) and "(the batch of step 1)" in str(caught.value)
    assert f"reward function 'trlrewards:{reward.__name__}'" in str(caught.value)


def test_reward_functions_add_to_the_rm_and_a_resume_may_not_change_them(tmp_path):
    from dynalize.build import build_reward_terms

    cfg = validate(tiny(tmp_path, reward_model={"engine": "python", "path": "trlrewards:rm_nan"},
                        reward_funcs=["trlrewards:graded"], task={"name": "prompts", "args": {
                            "train_file": tiny_rows(tmp_path, ROWS), "eval_fraction": 0}}))
    terms = build_reward_terms(cfg, build_task("prompts", cfg.task.args, 0))
    assert [t.name for t in terms] == ["rm", "reward_funcs"] and terms[1].alone is False
    with pytest.raises(_ConfigError, match="cannot change reward_weights"):
        resume_config(cfg, cfg.model_copy(update={"reward_weights": [2.0]}))
    with pytest.raises(_ConfigError, match="a reward model .* is dynalize's reward_model"):
        build_reward_terms(cfg.model_copy(update={"reward_funcs": ["models/my-rm"]}), None)
    with pytest.raises(_ConfigError, match="reward_weights has 2 weights for 1 reward_funcs"):
        validate(tiny(tmp_path, reward_funcs=["trlrewards:graded"], reward_weights=[1, 2]))


def test_a_reward_function_that_raises_is_one_hook_error_from_python_and_one_line_from_the_cli(tmp_path, capsys):
    with pytest.raises(dynalize.HookError) as caught:
        dynalize.train(tiny(tmp_path, reward_funcs=[trlrewards.raising_reward]))
    assert str(caught.value) == ("score of reward function 'raising_reward' (the batch of step 1) raised ValueError: "
                                 "the grader's database is down")
    assert isinstance(caught.value.__cause__, ValueError)
    with pytest.raises(dynalize.HookError, match="reward function 'exiting_reward' .* SystemExit"):
        dynalize.train(tiny(tmp_path, name="exits", reward_funcs=[trlrewards.exiting_reward]))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    code = cli.main([f"output_dir={tmp_path}", "name=cli", "steps=1", "batch_size=8", "group_size=4",
                     "progress=false", "generator.max_new_tokens=8", "task.name=prompts",
                     f"task.args.train_file={rows}", "task.args.eval_fraction=0", "reward_model.enabled=false",
                     "reward_funcs=[trlrewards:nan_reward]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: reward function 'nan_reward' at step 1 returned nan")


def test_a_missing_policy_path_from_python_is_a_config_error(tmp_path):
    with pytest.raises(dynalize.ConfigError, match="policy.path does not exist"):
        dynalize.train(tiny(tmp_path, policy={"path": str(tmp_path / "no-model")}, reward_funcs=[trlrewards.graded]))


def test_errors_a_user_catches_are_importable_from_dynalize():
    from dynalize import ConfigError, RunStopped

    assert ConfigError is _ConfigError and issubclass(RunStopped, RuntimeError)


@pytest.mark.parametrize(("override", "expected"), [
    ({"num_generations": 4}, "num_generations: unknown key: TRL's num_generations is dynalize's group_size"),
    ({"trainer": {"learning_rate": 1e-5}}, "TRL's learning_rate is dynalize's trainer.lr"),
    ({"generator": {"max_completion_length": 64}}, "TRL's max_completion_length is dynalize's generator.max_new_tokens"),
    ({"trainer": {"scale_rewards": "batch"}}, "TRL's scale_rewards is dynalize's trainer.loss.std_normalize"),
    ({"max_steps": 10}, "TRL's max_steps is dynalize's steps"),
    ({"num_iterations": 2}, "TRL's num_iterations has no dynalize equivalent"),
    ({"trainr": {}}, "did you mean 'trainer'?"),  # not TRL's: the spelling guess stays
])
def test_trls_config_names_are_answered_with_dynalizes(override, expected):
    with pytest.raises(_ConfigError) as caught:
        validate(override)
    assert expected in str(caught.value)


def test_batch_std_scaling_divides_group_centred_advantages_by_the_batchs_std():
    groups = [[1.0, 3.0], [10.0, 30.0]]
    flat_std = __import__("statistics").stdev([1.0, 3.0, 10.0, 30.0])
    got = grpo.advantages(groups, "batch")
    assert got == [pytest.approx([-1 / flat_std, 1 / flat_std], rel=1e-5),
                   pytest.approx([-10 / flat_std, 10 / flat_std], rel=1e-5)]
    assert grpo.advantages(groups, "group") == grpo.advantages(groups, True)
    assert validate({"trainer": {"loss": {"std_normalize": "batch"}}}).trainer.loss.std_normalize == "batch"


def test_rows_are_used_as_written_unless_a_template_is_asked_for(tmp_path):
    rows = [{"prompt": "A lighthouse."}, {"prompt": "The last train."}]
    for task in ("creative_writing", "prompts"):
        plain = build_task(task, {"train_file": tiny_rows(tmp_path, rows), "eval_fraction": 0}, 0)
        assert [p.messages for p in plain.prompts("train")] == [[Message("user", r["prompt"])] for r in rows]
    story = build_task("creative_writing", {"train_file": tiny_rows(tmp_path, rows), "eval_fraction": 0,
                                            "template": STORY_TEMPLATE}, 0)
    assert story.prompts("train")[0].messages[0].content == STORY_TEMPLATE.replace("{prompt}", "A lighthouse.")
    shipped = yaml.safe_load((REPO / "configs" / "creative_writing.yaml").read_text())
    assert shipped["task"]["args"]["template"] == STORY_TEMPLATE


def tiny_rows(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_run_saves_its_template_and_an_old_run_resumes_with_the_story_template(tmp_path):
    args = {"train_file": tiny_rows(tmp_path, [{"prompt": "a"}, {"prompt": "b"}])}
    new = resolve_config({"task": {"name": "creative_writing", "args": dict(args)}})
    assert new.task.args["template"] == "{prompt}"  # frozen at the first start: config.yaml keeps it
    old = validate({"task": {"name": "creative_writing", "args": dict(args)}})  # a config.yaml from before
    resumed = resume_config(old, validate({"task": {"name": "creative_writing", "args": dict(args)}}))
    assert resumed.task.args["template"] == STORY_TEMPLATE
    with pytest.raises(_ConfigError, match="cannot change task.args.template"):
        resume_config(old, validate({"task": {"name": "creative_writing", "args": {**args, "template": "{prompt}"}}}))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_the_from_trl_example_trains_the_trl_scripts_pieces_unchanged(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "from_trl" / "train.py")], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "from-trl"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert {"rewards/format_reward/mean", "rewards/accuracy_reward/none_frac"} <= set(metrics[-1])
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["reward_funcs"] == ["trl_script:accuracy_reward", "trl_script:format_reward"]
    assert saved["reward_weights"] == [1.0, 0.5]
    assert saved["task"]["args"]["template"] == "{prompt}"  # stored at the first start: a resume keeps it
    line = read_jsonl(sorted((run / "rollouts").glob("step_*.jsonl"))[0])[0]
    assert set(line["rewards"]) == {"accuracy_reward", "format_reward"}
    assert (tmp_path / "runs" / "from-trl-policy" / "config.json").is_file()
    assert not math.isnan(metrics[-1]["reward/mean"])


def test_docs_from_trl_lists_every_trl_name_dynalize_answers_and_the_readme_links_it():
    from dynalize.trl_names import TRL_NAMES

    doc = (REPO / "docs" / "from_trl.md").read_text(encoding="utf-8")
    table = [line for line in doc.splitlines() if line.startswith("| `")]
    assert [name for name in TRL_NAMES if not any(f"`{name}`" in line.split(" | ")[0] for line in table)] == []
    assert "(docs/from_trl.md)" in (REPO / "README.md").read_text(encoding="utf-8")


def test_standard_format_rows_give_strings_and_async_functions_log_metrics_and_columns():
    import anyio

    rollouts = [Rollout(f"p{i}", 0, [1], [7, 8], [0.0, 0.0], [1, 1], [f"reply {i}"], 0,
                        messages=[Message("user", "Solve: 2+2")], turns=[Message("assistant", f"reply {i}")],
                        meta={"row": {"prompt": "2+2", "columns": {"solution": "4"}}}) for i in range(2)]
    seen = {}

    async def judged(prompts, completions, solution, completion_ids, log_metric, log_extra, **kwargs):
        seen.update(prompts=prompts, completions=completions, solution=solution, ids=completion_ids)
        log_metric("judged/calls", 1)
        log_extra("why", ["short", "long"])
        return [0.5, 1.0]

    term = FunctionsTerm([RewardFunction("judged", judged)], steps=3)
    got = anyio.run(term.score, Batch(2, [rollouts]))
    assert seen == {"prompts": ["2+2", "2+2"], "completions": ["reply 0", "reply 1"], "solution": ["4", "4"],
                    "ids": [[7, 8], [7, 8]]}
    assert got.values == [0.5, 1.0] and got.info[1] == {"rewards": {"judged": 1.0}, "reward_extra": {"why": "long"}}
    assert term.metrics()["user/judged/calls"] == 1.0 and term.metrics() == {}  # read once per step, under user/
