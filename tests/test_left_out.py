"""Rollouts left out of the update (their group held a rollout whose verdict failed) are counted per
step (`left_out`, `left_out_rate`), and a run that loses more than `max_left_out_rate` of its
scored rollouts over `left_out_window` steps stops after a checkpoint (exit 3), like a judge that
keeps failing. A failed verdict is asked again once in the step before it costs its group."""

from __future__ import annotations

from pathlib import Path

import yaml

from dynalize.run import main
from dynalize.runlog import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def argv(tmp_path: Path, *extra: str) -> list[str]:
    config = {
        "name": "s", "output_dir": str(tmp_path), "steps": 3, "batch_size": 8, "group_size": 4, "eval_every": 0,
        "checkpoint_every": 0, "progress": False, "torch_threads": 1, "generator": {"max_new_tokens": 12},
        "task": {"name": "rubric", "args": {"train_file": str(REPO / "examples/data/rubric_healthbench_sample.jsonl"),
                                            "eval_fraction": 0}},
        "reward_model": {"engine": "python", "path": "rubricjudge:length_reward"},
        "rubric": {"enabled": True, "judge": {"engine": "llm", "max_failure_rate": None, "retries": 1,
                                              "chat": {"engine": "scripted", "path": "rubricjudge:broken_for_some"}}},
        "penalties": {"enabled": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return ["--config", str(tmp_path / "config.yaml"), *extra]


def test_left_out_rollouts_are_counted_and_failed_verdicts_asked_again(tmp_path):
    assert main(argv(tmp_path, "max_left_out_rate=null")) == 0
    metrics = read_jsonl(tmp_path / "s" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert sum(m["left_out"] for m in metrics) > 0
    for m in metrics:
        rollouts = read_jsonl(tmp_path / "s" / "rollouts" / f"step_{m['step']:06d}.jsonl")
        assert m["left_out"] == sum(bool(r.get("left_out")) for r in rollouts)
        assert m["left_out_rate"] == m["left_out"] / len(rollouts)
        failed = sum(bool(r.get("unscored")) for r in rollouts)
        assert m["rubric_judge/reasked"] == failed and m["rubric_judge/recovered"] == 0  # asked twice, failed twice


def test_too_many_left_out_rollouts_stop_the_run_after_a_full_window(tmp_path, capsys):
    assert main(argv(tmp_path, "left_out_window=2")) == 3  # the default max_left_out_rate, 0.2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stopped: ") and "rollouts" in err[-1] and "more than max_left_out_rate=0.2" in err[-1]
    assert "over the last 2 steps" in err[-1] and "--resume" in err[-1]
    metrics = read_jsonl(tmp_path / "s" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]  # step 1 alone did not stop it: the window was not full
    assert sum(m["left_out"] for m in metrics) > 0.2 * 16
    assert (tmp_path / "s" / "checkpoints" / "step_000002" / "manifest.json").is_file()


def test_a_run_stopped_for_left_out_rollouts_resumes_once_the_limit_or_the_cause_changes(tmp_path, capsys):
    assert main(argv(tmp_path, "left_out_window=2")) == 3
    assert main(["--resume", str(tmp_path / "s"), "max_left_out_rate=null"]) == 0
    assert [m["step"] for m in read_jsonl(tmp_path / "s" / "metrics.jsonl")] == [1, 2, 3]
