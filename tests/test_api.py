"""The Python API, `dynalize.train(config, **overrides)`: the README's worked example runs as written
and resumes from Python; settings that name code or data take Python objects (saved as import paths
when one reaches them, else held for the call and refused, in one line, by `--resume`)."""

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

import dynalize
from dynalize.api import fingerprint, resolve_config
from dynalize.config import dump_config
from dynalize.build import build_criteria_judge
from dynalize.config import ConfigError
from dynalize.plugins import forget_objects, give_object
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import build_task
from dynalize.tasks.data import DataError, read_rows
from toytask import ToyArgs, ToyTask, vowel_share

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "python_api" / "train.py"


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_readme_shows_the_worked_example_byte_for_byte():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"<!-- python-api: examples/python_api/train.py -->\n```python\n(.*?)^```$", readme, re.S | re.M)
    assert shown is not None and shown.group(1) == EXAMPLE.read_text(encoding="utf-8")
    assert "```bash\npython examples/python_api/train.py\n```" in readme


@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_the_worked_example_runs_as_written_resumes_from_python_and_the_cli_refuses_to_resume_it(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run: runs/python-api, 3 steps, reward " in proc.stdout
    run = tmp_path / "runs" / "python-api"
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]  # 3 steps, then 2 resumed
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000003", "step_000005"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["reward_model"]["path"] == "object:reward_model.path"
    assert saved["task"]["args"]["train_file"].startswith("object:task.args.train_file@")
    before = (run / "metrics.jsonl").read_bytes()
    cli = subprocess.run([sys.executable, "-m", "dynalize.run", "--resume", str(run)], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2
    assert cli.stderr.strip().splitlines() == [
        "error: config error: reward_model.path was a Python object given to dynalize.train, and such objects are "
        "not saved with the run: continue it from Python, dynalize.train(config, resume=RUN_DIR) with the same "
        "objects, or give reward_model.path as an import path or file"]
    assert (run / "metrics.jsonl").read_bytes() == before


def test_a_task_instance_and_a_lambda_reward_train_from_python_in_a_running_event_loop(tmp_path):
    async def notebook_cell():  # Jupyter runs cells inside an event loop
        return dynalize.train(
            {"output_dir": str(tmp_path), "name": "api", "steps": 2, "batch_size": 8, "group_size": 4,
             "progress": False, "checkpoint_every": 0, "torch_threads": 1,
             "task": {"name": ToyTask(ToyArgs(n_topics=4))}},
            reward_model={"engine": "python", "path": lambda texts: [len(t) / 100 for t in texts]},
            **{"generator.max_new_tokens": 8}, log_level=None)

    result = asyncio.run(notebook_cell())
    assert result.run_dir == tmp_path / "api" and (result.run_dir / "final" / "config.json").is_file()
    assert result.metrics["step"] == 2 and result.metrics == read_jsonl(result.run_dir / "metrics.jsonl")[-1]
    assert result.metrics["gen_len/mean"] <= 8
    assert result.summary[0][0] == "reward/mean" and ("steps", "1", "2") in result.summary
    assert result.config.task.name == "object:task.name" and result.config.generator.max_new_tokens == 8


def test_objects_an_import_path_reaches_are_saved_as_that_path_and_others_are_held():
    def local(texts):
        return [0.0] * len(texts)

    cfg = resolve_config({"task": {"name": ToyTask}, "reward_model": {"engine": "python", "path": vowel_share},
                          "rubric": {"judge": {"predicate": local}}})
    assert (cfg.task.name, cfg.reward_model.path) == ("toytask:ToyTask", "toytask:vowel_share")
    assert cfg.rubric.judge.predicate == "object:rubric.judge.predicate"
    assert build_criteria_judge(cfg.rubric.judge).predicate is local


def test_a_list_or_dataset_where_a_task_expects_a_path_is_its_data_and_a_list_setting_stays_a_list():
    rows = [{"prompt": "one"}, {"prompt": "two"}, {"prompt": "three"}]
    cfg = resolve_config({"task": {"name": "creative_writing", "args": {
        "train_file": rows, "eval_file": datasets.Dataset.from_list(rows[:1]), "reasoning_tags": ["<a>", "</a>"]}}})
    args = cfg.task.args
    assert args["train_file"] == f"object:task.args.train_file@{fingerprint(rows)}"
    assert args["eval_file"] == f"object:task.args.eval_file@{fingerprint(rows[:1])}"
    assert args["reasoning_tags"] == ["<a>", "</a>"]
    task = build_task(cfg.task.name, cfg.task.args, 0)
    assert [p.meta["writing_prompt"] for p in task.prompts("train")] == ["one", "two", "three"]
    assert [p.meta["writing_prompt"] for p in task.prompts("eval")] == ["one"]


def test_data_in_memory_is_checked_like_a_file_with_its_row_named():
    spec = give_object("task.args.train_file", [{"prompt": "ok"}, {"prompt": ""}])
    with pytest.raises(DataError, match=r"^data error: object:task.args.train_file row 1: missing field 'prompt'$"):
        read_rows(spec, required=["prompt"])
    with pytest.raises(DataError, match="has no rows"):
        read_rows(give_object("x", []))


def test_a_task_instance_is_used_as_it_is_and_takes_no_args():
    task = ToyTask(ToyArgs(n_topics=3))
    cfg = resolve_config({"task": {"name": task}})
    assert build_task(cfg.task.name, {}, 0) is task
    with pytest.raises(ConfigError, match="task.args: the task was given as an instance"):
        build_task(cfg.task.name, {"n_topics": 2}, 0)


def test_overrides_are_dotted_keys_or_sections_merged_in_order():
    cfg = resolve_config({"trainer": {"lr": 1e-3, "weight_decay": 0.1}, "steps": 9},
                         [("trainer", {"lr": 1e-5}), ("generator.max_new_tokens", 5), ("steps", 4)], merge=True)
    assert (cfg.trainer.lr, cfg.trainer.weight_decay, cfg.generator.max_new_tokens, cfg.steps) == (1e-5, 0.1, 5, 4)


def test_a_yaml_path_and_a_runconfig_are_configs_too(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("steps: 7\ntrainer: {lr: 1.0e-4}\n")
    cfg = resolve_config(path, [("seed", 3)])
    assert (cfg.steps, cfg.trainer.lr, cfg.seed) == (7, 1e-4, 3)
    assert resolve_config(cfg) == cfg
    with pytest.raises(ConfigError, match="takes a RunConfig, a dict or a YAML path, not a list"):
        resolve_config([1])  # type: ignore[arg-type]


def test_a_config_naming_an_object_this_process_was_not_given_is_one_line():
    forget_objects()
    with pytest.raises(ConfigError) as e:
        resolve_config({"reward_model": {"engine": "python", "path": "object:reward_model.path"}})
    assert str(e.value).startswith("config error: reward_model.path was a Python object given to dynalize.train")
    assert "\n" not in str(e.value)


def test_resume_through_the_api_refuses_what_would_change_the_run(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"seed": 1}))
    with pytest.raises(ConfigError, match=r"--resume cannot change seed \(1 -> 2\)"):
        resolve_config({"seed": 2}, resume=run)
    assert resolve_config(None, [("steps", 3)], resume=run).seed == 1


def test_a_resume_given_other_rows_than_the_run_was_trained_on_is_refused(tmp_path):
    rows = [{"prompt": "one"}, {"prompt": "two"}]
    config = {"output_dir": str(tmp_path), "name": "r", "task": {"name": "creative_writing",
                                                               "args": {"train_file": rows}}}
    (tmp_path / "r").mkdir()
    dump_config(resolve_config(config), tmp_path / "r" / "config.yaml")
    assert resolve_config(config, resume=tmp_path / "r").task.args == resolve_config(config).task.args
    assert fingerprint([{"prompt": "one"}, {"prompt": "two"}]) == fingerprint(datasets.Dataset.from_list(rows))
    other = {**config, "task": {"name": "creative_writing", "args": {"train_file": rows + [{"prompt": "three"}]}}}
    with pytest.raises(ConfigError, match=r"--resume cannot change task.args.train_file"):
        resolve_config(other, resume=tmp_path / "r")


CALLER = r'''
import io, logging, random, sys
import numpy as np, torch, transformers
import dynalize, dynalize.api  # imported first: importing rich draws from Python's random (rich.style)
from toytask import ToyArgs, ToyTask

out = io.StringIO()
handler = logging.StreamHandler(out)
logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.INFO)
torch.set_num_threads(2)
transformers.utils.logging.set_verbosity_warning()
torch.manual_seed(1234); random.seed(5); np.random.seed(6)
before = (torch.get_rng_state().clone(), random.getstate(), np.random.get_state()[1].copy())
for i in range(2):
    dynalize.train({"output_dir": sys.argv[1], "name": f"api{i}", "steps": 1, "batch_size": 8, "group_size": 4,
                    "progress": False, "checkpoint_every": 0, "torch_threads": 1,
                    "task": {"name": ToyTask(ToyArgs(n_topics=4))}, "generator": {"max_new_tokens": 4}})
    logging.getLogger("caller").info("still logging %d", i)
assert logging.getLogger().handlers == [handler], logging.getLogger().handlers
assert not handler.stream.closed and out.getvalue().splitlines() == ["still logging 0", "still logging 1"], out.getvalue()
assert logging.getLogger().level == logging.INFO
assert torch.get_num_threads() == 2, torch.get_num_threads()
assert transformers.utils.logging.get_verbosity() == transformers.logging.WARNING
assert torch.equal(torch.get_rng_state(), before[0]), "torch's global generator was changed"
assert random.getstate() == before[1] and (np.random.get_state()[1] == before[2]).all()
print("caller intact")
'''


def test_train_leaves_its_callers_logging_threads_and_random_state_as_it_found_them(tmp_path):
    """Called twice in one process with the caller's own root handler installed (issue: the run
    closed the caller's handlers, set torch to 1 thread, transformers to ERROR and reseeded torch)."""
    proc = subprocess.run([sys.executable, "-c", CALLER, str(tmp_path)], cwd=REPO / "tests", env=env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "caller intact"
