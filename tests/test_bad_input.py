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
import yaml

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


@pytest.mark.parametrize("name", ["/".join(["..", "escaped"]), "{abs}", ".", "..", "a\nb", "", "sub/run"])
@pytest.mark.parametrize("how", ["override", "override --overwrite", "config file"])
def test_a_run_name_must_be_one_folder_name_inside_output_dir(tmp_path, earlier, capsys, name, how):
    name = name.replace("{abs}", str(tmp_path / "elsewhere"))
    argv = [a for a in toy(tmp_path) if not a.startswith("name=")]
    if how == "config file":
        (tmp_path / "named.yaml").write_text(yaml.safe_dump({"name": name}))
        argv = ["--config", str(tmp_path / "named.yaml"), *argv]
    else:
        argv = [*argv, f"name={name}", *how.split()[1:]]
    new = fails_cleanly(argv, capsys, tmp_path, "name: must")
    assert new == [] and sorted(p.name for p in tmp_path.iterdir()) == sorted(["runs", *(["named.yaml"] * (how == "config file"))])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run"]


def _fake(prefix: str, n: int, alphabet: str = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789") -> str:
    rng = __import__("random").Random(prefix)
    return prefix + "".join(rng.choice(alphabet) for _ in range(n))


PASTED_KEYS = {  # fakes in the shape of each provider's keys
    "hugging face": _fake("hf_", 34), "groq": _fake("gsk_", 52), "github": _fake("ghp_", 36),
    "github fine-grained": _fake("github_pat_11A", 40), "aws access key id": _fake("AKIA", 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
    "replicate": _fake("r8_", 37), "npm": _fake("npm_", 36), "stripe-like": _fake("sk_live_", 24),
    "bare random": _fake("", 32), "hex secret": _fake("", 40, "0123456789abcdef"),
    "random after a name": _fake("MY_KEY_", 24),
}


@pytest.mark.parametrize("kind", list(PASTED_KEYS))
def test_a_pasted_key_as_api_key_env_is_refused_and_never_printed_or_written(tmp_path, earlier, capsys, kind):
    key = PASTED_KEYS[kind]
    argv = toy(tmp_path, "new") + ["penalties.enabled=true", "penalties.judge.engine=llm",
                                   "penalties.judge.chat.base_url=http://127.0.0.1:9/v1", "penalties.judge.chat.model=m",
                                   f"penalties.judge.chat.api_key_env={key}"]
    assert fails_cleanly(argv, capsys, tmp_path, "api_key_env: must be the NAME of an environment variable") == []
    assert key not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "MY_KEY_2", "HF_TOKEN", "GROQ_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "HUGGINGFACEHUB_API_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "JUDGE_KEY_20240101",
                                  "hf_token", "sk_key_name", "OPENAI_API_KEY_PROJECT_ALPHA", "K"])
def test_real_variable_names_pass_as_api_key_env(name):
    from dynalize.backends.config import ChatModelConfig

    assert ChatModelConfig(api_key_env=name).api_key_env == name


@pytest.mark.parametrize(("argv", "needle"), [
    (["rubric.coef=2"], "--resume cannot change rubric.coef (1.0 -> 2.0)"),
    (["rubric.dropout.f=0.3"], "--resume cannot change rubric.dropout.f (0.0 -> 0.3)"),
    (["rubric.dropout.schedule=linear"], "--resume cannot change rubric.dropout.schedule"),
    (["rubric.reweight.method=pow3r"], "--resume cannot change rubric.reweight.method ('none' -> 'pow3r')"),
    (["rubric.enabled=true", "reward_model.enabled=false"], "--resume cannot change reward_model.enabled (True -> False)"),
    (["reward_model.max_length=16"], "--resume cannot change reward_model.max_length (2048 -> 16)"),
    (["penalties.lam=1.0"], "--resume cannot change penalties.lam (0.5 -> 1.0)"),
    (["penalties.weight=pay"], "--resume cannot change penalties.weight ('fixed' -> 'pay')"),
])
def test_a_resume_may_not_change_what_defines_the_reward(tmp_path, earlier, capsys, argv, needle):
    fails_cleanly(["--resume", str(earlier), "steps=3", *argv], capsys, tmp_path, needle)


def test_a_resume_may_change_what_only_changes_speed_or_endpoints(tmp_path, earlier):
    assert main(["--resume", str(earlier), "steps=3", "reward_model.batch_size=4", "trainer.micro_batch_size=4"]) == 0
    assert [m["step"] for m in read_jsonl(earlier / "metrics.jsonl")] == [1, 2, 3]


def test_a_resume_with_fewer_steps_than_done_is_refused_and_rewrites_nothing(tmp_path, earlier, capsys):
    fails_cleanly(["--resume", str(earlier), "steps=1"], capsys, tmp_path,
                  "--resume with steps=1, but the run has already trained 2 steps: steps may only grow")
    assert "steps: 2" in (earlier / "config.yaml").read_text()


def test_an_annealed_dropout_schedule_is_frozen_at_the_first_start_and_kept_when_extending(tmp_path):
    argv = toy(tmp_path, "annealed") + ["rubric.dropout.schedule=linear", "rubric.dropout.f=0.5"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "annealed"
    saved = lambda: yaml.safe_load((run / "config.yaml").read_text())["rubric"]["dropout"]  # noqa: E731
    assert saved()["anneal_steps"] == 2  # the first start's steps, in config.yaml
    assert main(["--resume", str(run), "steps=3"]) == 0  # extending: the schedule of a 2-step start, not re-derived
    assert saved()["anneal_steps"] == 2
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("anneal_steps: 2", "anneal_steps: null"))
    assert main(["--resume", str(run), "steps=4"]) == 0  # a run from before: derived from its saved steps (3)
    assert saved()["anneal_steps"] == 3


# --- the file system: one line naming the path and the cause, nothing earlier damaged -----------------

def test_an_output_dir_below_a_file_is_one_line(tmp_path, earlier, capsys):
    (tmp_path / "afile").write_text("not a folder")
    argv = [a for a in toy(tmp_path, "new") if not a.startswith("output_dir=")] + [f"output_dir={tmp_path / 'afile' / 'runs'}"]
    assert fails_cleanly(argv, capsys, tmp_path, f"{tmp_path / 'afile'} is not a folder") == []


def test_a_run_name_that_is_a_dangling_link_is_one_line(tmp_path, earlier, capsys):
    (tmp_path / "runs" / "new").symlink_to(tmp_path / "nowhere")
    fails_cleanly(toy(tmp_path, "new"), capsys, tmp_path, "is a symbolic link to")
    assert not (tmp_path / "nowhere").exists()


def test_a_read_only_folder_is_one_line(tmp_path, earlier, capsys, monkeypatch):
    import errno

    from dynalize.runlog import RunDir

    def read_only(self):  # what mkdir in a read-only folder raises (root ignores chmod, so it is raised here)
        raise PermissionError(errno.EACCES, "Permission denied", str(self.root))

    monkeypatch.setattr(RunDir, "create", read_only)
    fails_cleanly(toy(tmp_path, "new"), capsys, tmp_path, f"file system error: {tmp_path / 'runs' / 'new'}: Permission denied")


def test_a_full_disk_mid_run_is_one_line_and_the_resume_matches_a_clean_run(tmp_path, finished_run, capsys, monkeypatch):
    import errno

    import dynalize.runlog
    from dynalize.checkpoint import damage

    real, writes = dynalize.runlog.append_jsonl, []

    def fills_up(path, record):
        if path.name == "metrics.jsonl":
            writes.append(record["step"])
            if record["step"] == 2:  # the second step's line (steps are labelled by steps completed)
                raise OSError(errno.ENOSPC, "No space left on device")
        real(path, record)

    monkeypatch.setattr(dynalize.runlog, "append_jsonl", fills_up)
    assert main(["--log-level", "ERROR", *toy(tmp_path, "full")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: file system error: No space left on device"), err
    run = tmp_path / "runs" / "full"
    assert damage(run / "checkpoints" / "step_000001") is None and writes == [1, 2]
    monkeypatch.setattr(dynalize.runlog, "append_jsonl", real)  # space freed
    assert main(["--resume", str(run)]) == 0
    resumed, clean = read_jsonl(run / "metrics.jsonl"), read_jsonl(finished_run / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2]
    for key in ("loss", "reward/mean", "grad_norm", "gen_len/mean"):
        assert [m[key] for m in resumed] == [m[key] for m in clean], key


def test_a_state_json_with_wrong_types_is_one_line(tmp_path, earlier, capsys):
    import json

    from dynalize.checkpoint import write_manifest

    for ckpt in (earlier / "checkpoints").iterdir():
        state = json.loads((ckpt / "state.json").read_text())
        (ckpt / "state.json").write_text(json.dumps({**state, "step": str(state["step"]), "terms": []}))
        write_manifest(ckpt)  # consistent with its manifest: only the types are wrong
    fails_cleanly(["--resume", str(earlier), "steps=3"], capsys, tmp_path, "state.json: step is str '2', not int")


def test_a_metrics_line_whose_step_is_a_string_is_one_line_on_resume_and_nothing_is_rewritten(tmp_path, earlier,
                                                                                           capsys):
    lines = (earlier / "metrics.jsonl").read_text().splitlines()
    (earlier / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": "3"}', *lines[1:]]) + "\n")
    fails_cleanly(["--resume", str(earlier), "steps=3"], capsys, tmp_path,
                  "metrics.jsonl is damaged: a line holds step '3', not a whole number")


@pytest.mark.parametrize(("text", "needle"), [
    ("steps: " + "9" * 5000 + "\n", "a value cannot be read: Exceeds the limit (4300 digits)"),
    ("steps: " + str(10**30) + "\n", "steps: Input should be less than or equal to 1000000000"),
    ("task:\n  args:\n    x: " + "[" * 20000 + "]" * 20000 + "\n", "nested more than 100 levels deep"),
    ("".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v: 1\n", "nested more than 100 levels deep"),
])
def test_a_config_too_large_or_too_deep_to_read_is_one_line(tmp_path, earlier, capsys, text, needle):
    (tmp_path / "bad.yaml").write_text(text)
    argv = ["--print-config", "--config", str(tmp_path / "bad.yaml"), *(a for a in toy(tmp_path, "new")
                                                                         if not a.startswith("steps="))]
    assert fails_cleanly(argv, capsys, tmp_path, needle) == []  # --print-config: the old code read it, it ran none


@pytest.mark.parametrize(("override", "needle"), [
    ("steps=" + "9" * 5000, "override steps: a value cannot be read"),
    ("task.args.x=" + "[" * 3000 + "]" * 3000, "override task.args.x: nested more than 100 levels deep"),
    (f"steps={10**30}", "steps: Input should be less than or equal to 1000000000"),
])
def test_an_override_too_large_or_too_deep_to_read_is_one_line(tmp_path, earlier, capsys, override, needle):
    assert fails_cleanly(["--print-config", *toy(tmp_path, "new"), override], capsys, tmp_path, needle) == []


@pytest.mark.parametrize(("call", "needle"), [
    (lambda run: __import__("dynalize").train({}, resume=5), "resume must be a run directory (a path), True or None"),
    (lambda run: __import__("dynalize").train({}, overwrite="yes"), "overwrite must be True or False"),
    (lambda run: __import__("dynalize").export(run, run.parent / "m", step="two"), "step must be a whole number"),
    (lambda run: __import__("dynalize").export(run, None), "out must be a path, not NoneType"),
    (lambda run: __import__("dynalize").export(None, "m"), "run_dir must be a path"),
])
def test_python_arguments_of_the_wrong_type_are_one_config_error(earlier, call, needle):
    import dynalize

    with pytest.raises(dynalize.ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        call(earlier)


def test_a_key_given_twice_in_a_config_is_refused_naming_both_lines(tmp_path, earlier, capsys):
    (tmp_path / "dup.yaml").write_text("seed: 1\ngenerator:\n  temperature: 0.7\n  max_new_tokens: 8\n"
                                       "  temperature: 1.3\n")
    argv = ["--print-config", "--config", str(tmp_path / "dup.yaml"), *toy(tmp_path, "new")]
    fails_cleanly(argv, capsys, tmp_path, "dup.yaml: key 'temperature' is given twice (lines 3 and 5)")
    fails_cleanly(["--print-config", *toy(tmp_path, "new"), "generator={max_new_tokens: 8, max_new_tokens: 9}"],
                  capsys, tmp_path, "override generator: key 'max_new_tokens' is given twice (lines 1 and 1)")


def test_a_yaml_merge_key_is_not_a_duplicate(tmp_path):
    from dynalize.config import read_yaml

    (tmp_path / "merge.yaml").write_text("base: &b {temperature: 0.7}\ngenerator:\n  <<: *b\n  max_new_tokens: 8\n")
    assert read_yaml(tmp_path / "merge.yaml")["generator"] == {"temperature": 0.7, "max_new_tokens": 8}


def test_folder_in_use_is_importable_from_dynalize_and_is_a_config_error():
    import dynalize
    from dynalize.folderlock import FolderInUse

    assert dynalize.FolderInUse is FolderInUse and issubclass(dynalize.FolderInUse, dynalize.ConfigError)
    assert "FolderInUse" in dynalize.__all__
