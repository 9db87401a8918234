"""The rubric world as an instrument (benchmarks/rubric_table.py): the control arms set exactly
their own fields, every arm is a valid run config of either world, and the paced world is the fast
world with only its pace (learning rate and steps) changed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from dynalize.config import load_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import rubric_table as rt  # noqa: E402


def test_arm_names_parse_with_or_without_underscore_and_fixed_is_base():
    assert rt.canonical("fixed") == "base" and rt.canonical("dropout0.3") == "dropout_0.3"
    assert rt.canonical("annealed_cosine_0.5") == "annealed_cosine_0.5" and rt.canonical("noise.5") == "noise_0.5"
    for bad in ("dropout_1.5", "dropout_0", "sparkle_0.3", "noise", "lr_scaled_0.0"):
        with pytest.raises(ValueError, match="unknown arm"):
            rt.parse_arm(bad)


def test_control_arms_set_their_own_fields():
    assert rt.arm_overrides("lr_scaled_0.3", 3e-4) == ["rubric.dropout.f=0.0", "trainer.lr=0.00021"]
    assert rt.arm_overrides("annealed_0.5") == ["rubric.dropout.f=0.5", "rubric.dropout.schedule=linear"]
    assert rt.arm_overrides("noise0.5") == ["rubric.dropout.f=0.0", "rubric.noise.f=0.5"]
    assert rt.LABEL["lr_scaled_0.3"] == "fixed rubric, lr × 0.7" and rt.LABEL["noise_0.5"] == "noise control (f=0.5)"


@pytest.mark.parametrize("world", ["fast", "paced"])
def test_every_arm_is_a_valid_config_of_the_world(world):
    path = rt.world_config(world)
    lr = rt.world_lr(path, [])
    for arm in ("base", "dropout_0.3", "lr_scaled_0.5", "annealed_0.5", "annealed_cosine_0.3", "noise_0.5", "pow3r"):
        cfg = load_config(path, rt.arm_overrides(arm, lr))
        assert cfg.rubric.enabled and cfg.rubric.gold_judge is not None
        if arm == "lr_scaled_0.5":
            assert cfg.trainer.lr == pytest.approx(lr / 2) and cfg.rubric.dropout.f == 0
        if arm == "annealed_0.5":
            assert cfg.rubric.dropout.schedule == "linear" and cfg.rubric.dropout.anneal_steps is None  # the run's steps
        if arm == "noise_0.5":
            assert cfg.rubric.noise.f == 0.5 and not cfg.rubric.dropout.active
    assert rt.world_lr(path, ["trainer.lr=1e-4"]) == 1e-4  # an override scales the lr_scaled arm too


def test_the_paced_world_changes_only_the_pace():
    fast = yaml.safe_load((REPO / "configs" / "rubric_world.yaml").read_text())
    paced = yaml.safe_load((REPO / "configs" / "rubric_world_paced.yaml").read_text())
    for d in (fast, paced):
        d.pop("name")
    assert paced.pop("steps") > fast.pop("steps")
    assert paced["trainer"].pop("lr") < fast["trainer"].pop("lr")
    assert paced["trainer"].pop("warmup_steps", 0) > fast["trainer"].pop("warmup_steps", 0)  # the lr's schedule
    assert paced == fast


@pytest.mark.slow
def test_one_command_runs_every_arm_and_prints_the_frontier_and_its_verdict(tmp_path):
    """The pipeline end to end, tiny: 2 arms x 2 seeds x 2 steps of the paced world."""
    import json
    import os
    import subprocess

    from dynalize.analysis.frontier import frontiers

    out = tmp_path / "t"
    cmd = [sys.executable, str(REPO / "benchmarks" / "rubric_table.py"), "--world", "paced", "--arms", "fixed,noise0.5",
           "--seeds", "0", "1", "--steps", "2", "--out", str(out), "batch_size=16", "eval_every=2", "eval_samples=1",
           "task.args.n_eval_topics=4", "rubric.eval_anchors=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "### 8. The frontier" in done.stdout and "**Reading.**" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [f["arm"] for f in summary["frontier"]] == ["noise_0.5", "noise_0.5"]
    runs = summary["runs"]
    again = frontiers({a: [runs[f"{a}_s{s}"] for s in (0, 1)] for a in ("base", "noise_0.5")}, "base")
    assert [f.verdict for f in again] == [f["verdict"] for f in summary["frontier"]]
    assert all(f"| {f.verdict}" in done.stdout for f in again)
    assert (out / "plots" / "frontier.png").is_file()
    metrics = [json.loads(line) for line in (out / "noise_0.5_s0" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m["step"] > 0]  # step 0: the evaluation before training
    assert trained and all(m["rubric/noise_std"] > 0 and m["rubric/f"] == 0 for m in trained)
