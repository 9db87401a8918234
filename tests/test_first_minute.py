"""The first minute of a new user: `--help` lists the config sections and where each field is
documented, `--print-config` prints the resolved config and exits, and the one-time pre-training
of the sandbox policy says what it is doing, with a progress bar."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import yaml

from dynalize import tiny
from dynalize.config import RunConfig, load_config
from dynalize.run import config_sections, main
from dynalize.tasks.sandbox import SandboxArgs, SandboxTask, build_sandbox_policy

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_config_section_and_the_file_and_class_documenting_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    listed = dict(re.findall(r"^  (\(top level\)|[a-z_.]+) +(dynalize/\S+\.py: \w+)$", out, re.M))
    expected = {"(top level)", "policy", "generator", "reward_model", "trainer", "trainer.loss", "task", "penalties",
                "penalties.proposer", "penalties.proposer.chat", "penalties.proposer.lexical", "penalties.judge",
                "penalties.judge.chat"}
    assert expected <= set(listed)
    assert set(listed) == {name for name, _ in config_sections()}  # every section, nested ones too
    for name, where in listed.items():  # the file named declares the class named
        path, cls = where.split(": ")
        assert re.search(rf"^class {cls}\(", (ROOT / path).read_text(), re.M), where
    assert listed["penalties"] == "dynalize/penalties/config.py: PenaltiesConfig"
    for field in ("steps", "report_to", "export_final", "eval_every"):
        assert re.search(rf"top-level fields:[^\n]*(\n  [^\n]*)*\b{field}\b", out)
    assert "--print-config" in out


def test_print_config_prints_the_resolved_config_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text("steps: 7\ntrainer: {lr: 0.001}\n")
    assert main(["--config", "exp.yaml", "--print-config", "trainer.micro_batch_size=4", "name=x"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == load_config(tmp_path / "exp.yaml", ["trainer.micro_batch_size=4", "name=x"]).model_dump(mode="json")
    assert printed["steps"] == 7 and printed["trainer"]["lr"] == 0.001 and printed["trainer"]["micro_batch_size"] == 4
    assert RunConfig.model_validate(printed).report_to == []  # it reads back as a config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]  # no run directory


def test_print_config_with_a_bad_override_is_one_line(capsys):
    assert main(["--print-config", "steps=-1"]) == 2
    assert capsys.readouterr().err.startswith("error: config error: steps")


FAST = dict(steps=20, batch_size=8, vocab_size=512, threads=1)


def test_pretraining_the_sandbox_policy_says_it_happens_once_with_a_progress_bar(tmp_path, monkeypatch, capfd):
    """Where stderr is no terminal: a line before and after; where it is one: the live bar too."""
    monkeypatch.setenv("DYNALIZE_CACHE", str(tmp_path / "cache"))
    topics = SandboxTask(SandboxArgs()).topics("train")[:4]
    tiny.register("sandbox-policy-progress", partial(build_sandbox_policy, show_progress=True, topics=topics, **FAST))
    first = tiny.resolve("tiny:sandbox-policy-progress")
    err = capfd.readouterr().err
    assert re.search(r"Pre-training the sandbox policy, once \(about 100 s on a CPU\); later runs load it\s+from\s+"
                     + re.escape(str(tmp_path / "cache" / "tiny")), err)
    assert re.search(r"Sandbox policy pre-trained in \d+ s", err)
    assert tiny.resolve("tiny:sandbox-policy-progress") == first  # cached: no second build, nothing said
    assert "sandbox policy" not in capfd.readouterr().err.lower()
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr is a terminal
    monkeypatch.setenv("COLUMNS", "160")
    build_sandbox_policy(tmp_path / "again", topics=topics, show_progress=True, **FAST)
    live = capfd.readouterr().err
    assert "sandbox policy" in live and "21/21" in live and re.search(r"pre-training the model, loss \d\.\d{3}", live)
    build_sandbox_policy(tmp_path / "quiet", topics=topics, **FAST)  # builders called directly: quiet by default
    assert "sandbox policy" not in capfd.readouterr().err.lower()
