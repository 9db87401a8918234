"""Bad input stops `python -m dynalize.run` with one line and exit code 2, and changes no file that
was there before: a task that fails, prompts without messages, a folder without a model, a reward
function that miscounts, evaluation without eval prompts, a pasted API key, a run directory in
use, a resume that would change what the run is."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import anyio
import pytest
import structlog

from dynalize.config import load_config
from dynalize.run import main, train
from dynalize.runlog import read_jsonl
from dynalize.types import Prompt
from toytask import ToyTask

KEY = "sk-proj-9f8e7d6c5b4a39281706f5e4d3c2b1a0"


class FailingTask(ToyTask):
    def __init__(self, args, seed=0):
        raise FileNotFoundError("data/prompts.jsonl: no such file")


class EmptyPromptTask(ToyTask):
    def prompts(self, split):
        return [*super().prompts(split), Prompt("train-empty", [])]


class NoEvalTask(ToyTask):
    def prompts(self, split):
        return super().prompts(split) if split == "train" else []


def one_short(texts):
    """A reward function that drops the last score."""
    return [1.0] * (len(texts) - 1)


@pytest.fixture(autouse=True)
def restore_logging():
    """`main(["--log-level", "ERROR", ...])` configures logging for the process: undo it after."""
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def toy(tmp_path: Path, name: str = "run") -> list[str]:
    return [f"output_dir={tmp_path / 'runs'}", f"name={name}", "steps=2", "batch_size=8", "group_size=4",
            "progress=false", "generator.max_new_tokens=8", "trainer.micro_batch_size=8",
            "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=1",
            "policy.path=tiny:policy", "penalties.enabled=false", "eval_every=0"]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def fails_cleanly(argv: list[str], capsys, root: Path, needle: str) -> list[str]:
    """Run the CLI; assert exit 2, one line naming `needle`, and no earlier file changed."""
    before = snapshot(root)
    assert main(["--log-level", "ERROR", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k in before} == before
    return [k for k in after if k not in before]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 2-step toy run with checkpoints at steps 1 and 2 (copy it before changing it)."""
    root = tmp_path_factory.mktemp("earlier")
    anyio.run(train, load_config(None, toy(root)), False)
    return root / "runs" / "run"


@pytest.fixture
def earlier(tmp_path, finished_run) -> Path:
    """tmp_path/runs/run: a copy of the finished run, the 'earlier files' of each case."""
    shutil.copytree(finished_run, tmp_path / "runs" / "run")
    return tmp_path / "runs" / "run"


@pytest.mark.parametrize(("extra", "needle"), [
    (["task.name=test_bad_input:FailingTask"],
     "task 'test_bad_input:FailingTask' failed to start: FileNotFoundError: data/prompts.jsonl: no such file"),
    (["task.name=test_bad_input:EmptyPromptTask"],
     "task 'test_bad_input:EmptyPromptTask': train prompt 'train-empty' has an empty message list"),
    (["eval_every=1", "task.name=test_bad_input:NoEvalTask"],
     "eval_every is 1 but task 'test_bad_input:NoEvalTask' has no held-out prompts"),
    (["policy.path={empty}"], "holds no model (no config.json"),
    (["penalties.enabled=true", "penalties.judge.engine=llm", "penalties.judge.chat.base_url=http://127.0.0.1:9/v1",
      "penalties.judge.chat.model=m", f"penalties.judge.chat.api_key_env={KEY}"],
     "api_key_env: must be the NAME of an environment variable"),
])
def test_bad_input_before_the_run_starts_is_one_line_and_writes_nothing(tmp_path, earlier, capsys, extra, needle):
    (tmp_path / "empty").mkdir()
    extra = [x.replace("{empty}", str(tmp_path / "empty")) for x in extra]
    new = fails_cleanly(toy(tmp_path, "new") + extra, capsys, tmp_path, needle)
    assert new == []
    assert KEY not in capsys.readouterr().err


def test_a_reward_function_returning_the_wrong_number_of_scores_is_one_line(tmp_path, earlier, capsys):
    argv = toy(tmp_path, "new") + ["reward_model.engine=python", "reward_model.path=test_bad_input:one_short"]
    fails_cleanly(argv, capsys, tmp_path, "reward function 'test_bad_input:one_short' returned 7 scores for 8 texts")


def test_reusing_a_run_name_is_refused_and_the_earlier_run_is_untouched(tmp_path, earlier, capsys):
    fails_cleanly(toy(tmp_path), capsys, tmp_path, f"{earlier} already holds a run: continue it with --resume")


def test_overwrite_moves_the_earlier_run_aside_whole(tmp_path, earlier, capsys):
    before = snapshot(earlier)
    assert main(["--overwrite", *toy(tmp_path)]) == 0
    [aside] = [p for p in earlier.parent.iterdir() if p.name.startswith("run.replaced-")]
    assert snapshot(aside) == before
    assert [m["step"] for m in read_jsonl(earlier / "metrics.jsonl")] == [1, 2]  # a fresh run, not appended


@pytest.mark.parametrize(("argv", "needle"), [
    (["group_size=2"], "--resume cannot change group_size (4 -> 2)"),
    (["batch_size=16", "steps=3"], "--resume cannot change batch_size (8 -> 16)"),
    (["task.args.n_topics=4"], "--resume cannot change task.args.n_topics (None -> 4)"),
    (["--overwrite"], "--resume continues a run and --overwrite replaces it"),
])
def test_a_resume_that_would_change_what_the_run_is_is_refused(tmp_path, earlier, capsys, argv, needle):
    fails_cleanly(["--resume", str(earlier), *argv], capsys, tmp_path, needle)


def test_config_with_resume_is_used_and_checked(tmp_path, earlier, capsys):
    saved = (earlier / "config.yaml").read_text()
    changed = tmp_path / "changed.yaml"
    changed.write_text(saved.replace("  args: {}", "  args: {n_topics: 6}"))
    fails_cleanly(["--resume", str(earlier), "--config", str(changed)], capsys, tmp_path,
                  "--resume cannot change task.args.n_topics")
    same = tmp_path / "same.yaml"
    same.write_text(saved.replace("steps: 2", "steps: 3"))
    assert main(["--resume", str(earlier), "--config", str(same)]) == 0  # the file's steps=3 was used
    assert [m["step"] for m in read_jsonl(earlier / "metrics.jsonl")] == [1, 2, 3]


def test_no_intact_checkpoint_is_one_line(tmp_path, earlier, capsys):
    for ckpt in (earlier / "checkpoints").iterdir():
        (ckpt / "state.json").write_text("{}")
    fails_cleanly(["--resume", str(earlier), "steps=3"], capsys, tmp_path,
                  "no intact checkpoint to resume from in")
