"""Rubric rewards end to end: the CPU world with dropout, a rubric task on the shipped samples with
LLM judges (scripted) combined with an RM and Dynalize penalties from YAML alone, resume, and the
shipped configs."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import yaml

from dynalize.config import load_config, validate
from dynalize.errors import ConfigError
from dynalize.report import main as report_main
from dynalize.run import main, train
from dynalize.runlog import read_jsonl

REPO = Path(__file__).resolve().parent.parent


def world_overrides(tmp_path: Path, name: str = "w") -> list[str]:
    return [f"output_dir={tmp_path}", f"name={name}", "steps=3", "batch_size=32", "eval_every=2",
            "eval_samples=1", "progress=false", "task.args.n_eval_topics=8", "rubric.eval_anchors=4"]


def test_the_cpu_dropout_config_runs_and_logs_masks_full_reward_and_the_measurement(tmp_path):
    cfg = load_config(REPO / "configs" / "rubric_dropout.yaml", world_overrides(tmp_path))
    history = anyio.run(train, cfg, False, "test")
    run = tmp_path / "w"
    for h in history:
        assert h["rubric/f"] == 0.5 and 0 < h["rubric/kept_frac"] < 1 and "rubric/full" in h
        assert h["rubric/verdicts"] == 32 * 10 and h["rubric/failed_verdicts"] == 0
        assert h["reward/mean"] == pytest.approx(h["rubric/masked"])
    evals = read_jsonl(run / "eval" / "task.jsonl")
    assert [e["version"] for e in evals] == [0, 2, 3]
    for e in evals:
        assert {"rubric/proxy", "rubric/gold", "rubric/gap", "rubric/overclaim", "rubric/anchor_gold",
                "rubric/proxy_met/detail", "rubric/gold_met/tag:kind:pitfall"} <= set(e)
    assert evals[-1]["rubric/anchor_flips"] == 0.0  # a rule-based gold judge never moves on identical text
    step = read_jsonl(run / "rollouts" / "step_000001.jsonl")
    groups = {}
    for r in step:
        groups.setdefault(r["prompt_id"], set()).add(tuple(r["rubric_dropped"]))
    assert all(len(v) == 1 for v in groups.values())  # one mask per group
    eval_rollouts = read_jsonl(run / "rollouts" / "eval_000003.jsonl")
    assert {"proxy_verdicts", "gold_verdicts", "proxy_score", "gold_score"} <= set(eval_rollouts[0])
    assert report_main(["rubric", str(run), str(run), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "rubric_report.md").read_text()
    assert "Matched checkpoints" in text and "| detail |" in text and (tmp_path / "rep" / "rubric.png").is_file()
    assert f"{evals[-1]['rubric/gold']:.3f}" in text


def test_the_rubric_report_refuses_a_run_without_the_measurement(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    assert report_main(["rubric", str(tmp_path / "r")]) == 2
    assert "no rubric evaluations" in capsys.readouterr().err


def test_resume_keeps_masks_and_anchors(tmp_path):
    args = world_overrides(tmp_path, "r") + ["checkpoint_every=2", "rubric.reweight.method=pow3r"]
    anyio.run(train, load_config(REPO / "configs" / "rubric_dropout.yaml", args + ["steps=4"]), False, "test")
    straight = read_jsonl(tmp_path / "r" / "rollouts" / "step_000003.jsonl")
    args2 = world_overrides(tmp_path, "r2") + ["checkpoint_every=2", "rubric.reweight.method=pow3r"]
    anyio.run(train, load_config(REPO / "configs" / "rubric_dropout.yaml", args2 + ["steps=2"]), False, "test")
    anyio.run(train, load_config(tmp_path / "r2" / "config.yaml", ["steps=4"]), True, "test")
    resumed = read_jsonl(tmp_path / "r2" / "rollouts" / "step_000003.jsonl")
    assert [r["rubric_dropped"] for r in resumed] == [r["rubric_dropped"] for r in straight]
    assert [r["reward"] for r in resumed] == [r["reward"] for r in straight]  # exact: the POW3R state too
    e1 = read_jsonl(tmp_path / "r" / "eval" / "task.jsonl")[-1]
    e2 = read_jsonl(tmp_path / "r2" / "eval" / "task.jsonl")[-1]
    assert e1["rubric/anchor_gold"] == e2["rubric/anchor_gold"]


def sample_config(tmp_path: Path, **extra) -> dict:
    data = {
        "name": "s", "output_dir": str(tmp_path), "steps": 2, "batch_size": 8, "group_size": 4,
        "eval_every": 2, "eval_samples": 2, "checkpoint_every": 0, "progress": False,
        "generator": {"max_new_tokens": 12}, "trainer": {"lr": 1e-4, "loss": {"std_normalize": True}},
        "task": {"name": "rubric", "args": {"train_file": str(REPO / "examples/data/rubric_healthbench_sample.jsonl"),
                                            "eval_file": str(REPO / "examples/data/rubric_rar_sample.jsonl"),
                                            "eval_format": "rar"}},
        "reward_model": {"engine": "python", "path": "rubricjudge:length_reward"},
        "rubric": {"enabled": True, "dropout": {"f": 0.3},
                   "judge": {"engine": "llm", "chat": {"engine": "scripted", "path": "rubricjudge:lenient"}},
                   "gold_judge": {"engine": "llm", "chat": {"engine": "scripted", "path": "rubricjudge:strict"}}},
        "penalties": {"enabled": True, "every": 1, "view_per_group": 4},
    }
    for k, v in extra.items():
        data[k] = v
    return data


def test_rm_rubric_and_penalties_compose_from_yaml_with_llm_judges(tmp_path):
    history = anyio.run(train, validate(sample_config(tmp_path)), False, "test")
    for h in history:
        assert h["reward/mean"] == pytest.approx(h["rm/mean"] + h["rubric/mean"] + h["penalties/mean"])
        assert h["rubric_judge/calls"] == 8 and h["rubric/failed_verdicts"] == 0
    rows = read_jsonl(tmp_path / "s" / "rollouts" / "step_000001.jsonl")
    assert set(rows[0]["scores"]) == {"rm", "rubric", "penalties"}
    e = read_jsonl(tmp_path / "s" / "eval" / "task.jsonl")[-1]
    assert e["rubric/proxy"] >= e["rubric/gold"] and "rubric/gold_met/tag:category:essential" in e


def test_a_rubric_only_run_and_a_task_without_rubrics(tmp_path, capsys):
    data = sample_config(tmp_path, reward_model={"enabled": False}, penalties={"enabled": False})
    history = anyio.run(train, validate(data), False, "test")
    assert "rm/mean" not in history[0] and history[0]["reward/mean"] == pytest.approx(history[0]["rubric/mean"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**sample_config(tmp_path), "name": "bad", "task": {"name": "sandbox"}}))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (earlier lines: the first run's model loading)
    assert err.startswith("error: config error: rubric.enabled needs prompts with a rubric")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match=r"the reward needs reward_model.enabled, rubric.enabled or reward_funcs"):
        validate({"reward_model": {"enabled": False}})
    local = sample_config(tmp_path, name="local")
    local["rubric"] = {**local["rubric"], "judge": {"engine": "local"}}
    path.write_text(yaml.safe_dump(local))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "rubric.judge is local without a predicate" in err and "hb-s01#1" in err


def _arm(path: Path) -> dict:
    d = yaml.safe_load(path.read_text())
    d.pop("name")
    d["rubric"]["dropout"].pop("f")
    return d


def test_shipped_rubric_configs_validate_and_arms_differ_only_in_f():
    for dom in ("medical", "science"):
        files = sorted((REPO / "configs" / "rubric").glob(f"{dom}_f*.yaml"))
        fs = sorted(load_config(p).rubric.dropout.f for p in files)
        assert fs == [0.0, 0.2, 0.3, 0.4, 0.5, 0.6]
        for p in files:
            cfg = load_config(p)
            assert cfg.trainer.loss.std_normalize and cfg.steps == 600 and cfg.rubric.gold_judge is not None
            assert _arm(p) == _arm(files[0]), p
    assert _arm(REPO / "configs" / "rubric_dropout.yaml") == _arm(REPO / "configs" / "rubric_world.yaml")
    assert load_config(REPO / "configs" / "rubric_world.yaml").trainer.loss.std_normalize
