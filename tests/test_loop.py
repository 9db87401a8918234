"""End-to-end training on the toy task: files written, exact resume, stale drops, crash safety."""

import json
import subprocess
import sys

import anyio
import pytest

from dynalize.analysis.runs import Metric, Run
from dynalize.config import load_config
from dynalize.schedule import PromptOrder, split_stale
from dynalize.run import main, train
from dynalize.runlog import read_jsonl
from dynalize.types import Message, Prompt, Rollout


def _rollout(version):
    return Rollout("p", 0, [1], [2], [0.0], [1], ["x"], policy_version=version)


def test_split_stale_drops_old_rollouts_and_thin_groups():
    groups = [[_rollout(5), _rollout(1), _rollout(5)], [_rollout(1), _rollout(5)]]
    kept, dropped, staleness = split_stale(groups, version=10, max_off_policy=8)
    assert [len(g) for g in kept] == [2]  # group 2 keeps one rollout: too few for an advantage
    assert dropped == 3
    assert staleness == {5: 3, 9: 2}


def test_prompt_order_is_a_pure_function_of_the_step():
    prompts = [Prompt(str(i), [Message("user", str(i))]) for i in range(5)]
    a, b = PromptOrder(prompts, 3, seed=1), PromptOrder(prompts, 3, seed=1)
    assert [p.id for p in a.batch(4)] == [p.id for p in b.batch(4)]
    epoch0 = [p.id for s in range(5) for p in a.batch(s)][:5]
    assert sorted(epoch0) == ["0", "1", "2", "3", "4"]  # each epoch covers every prompt once


@pytest.mark.slow
def test_three_step_run_writes_metrics_rollouts_and_checkpoint(toy_overrides, tmp_path):
    cfg = load_config(None, toy_overrides + ["name=e2e", "eval_every=2", "eval_samples=2"])
    history = anyio.run(train, cfg, False)
    run = tmp_path / "e2e"
    metrics = read_jsonl(run / "metrics.jsonl")
    # steps count updates completed: row 0 is the evaluation before training, rows 1-3 the steps
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] and len(history) == 3
    assert set(metrics[0]) == {"step"} | {k for k in metrics[0] if k.startswith("eval/")} and "eval/vowels" in metrics[0]
    for key in ("reward/mean", "rm/std", "advantage/abs_mean", "loss", "masked_frac", "gen_len/mean",
                "staleness", "dropped", "time/step", "rollouts_per_s", "grad_norm"):
        assert key in metrics[-1], key
    assert metrics[2]["staleness"] == {"1": 16}  # step 2's batch was sampled by policy 0 while step 1 trained
    assert "eval/vowels" in metrics[2] and "eval/vowels" in metrics[3] and "eval/vowels" not in metrics[1]
    lines = read_jsonl(run / "rollouts" / "step_000003.jsonl")
    assert {r["step"] for r in lines} == {3}
    assert len(lines) == 16
    assert {"replies", "rm_score", "advantage", "policy_version", "completion_tokens"} <= set(lines[0])
    assert abs(sum(r["advantage"] for r in lines[:4])) < 1e-9  # mean-centred within the group
    assert (run / "checkpoints" / "step_000003" / "policy" / "model.safetensors").exists()
    assert (run / "config.yaml").exists()
    assert [e["version"] for e in read_jsonl(run / "eval" / "task.jsonl")] == [0, 2, 3]
    assert [e["step"] for e in read_jsonl(run / "eval" / "task.jsonl")] == [0, 2, 3]
    assert sorted(p.name for p in (run / "rollouts").glob("eval_*.jsonl")) == \
        ["eval_000000.jsonl", "eval_000002.jsonl", "eval_000003.jsonl"]


@pytest.mark.slow
def test_resume_continues_exactly(toy_overrides, tmp_path):
    evals = ["eval_every=3", "eval_samples=2"]
    straight = load_config(None, toy_overrides + evals + ["name=straight", "steps=4"])
    anyio.run(train, straight, False)
    first = load_config(None, toy_overrides + evals + ["name=split", "steps=2"])
    anyio.run(train, first, False)
    assert main(["--resume", str(tmp_path / "split"), "steps=4"]) == 0  # extended from 2 steps to 4
    a = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    b = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    assert [m["step"] for m in b] == [0, 1, 2, 3, 4]  # the evaluation before training, then the 4 steps
    assert a[0] == b[0]
    for x, y in zip(a[1:], b[1:]):
        for key in ("loss", "reward/mean", "rm/std", "grad_norm", "gen_len/mean", "policy_version"):
            assert x[key] == y[key], (x["step"], key)
    # the evaluation made at the old last step (version 2) stays on disk; reports leave it out, so
    # they read the evaluations of a run started with steps=4, with the same values
    assert [e["version"] for e in read_jsonl(tmp_path / "split" / "eval" / "task.jsonl")] == [0, 2, 3, 4]
    metric = Metric("eval/task", "vowels")
    extended, started = Run(tmp_path / "split"), Run(tmp_path / "straight")
    assert extended.series(metric) == started.series(metric) and [s for s, _ in started.series(metric)] == [0, 3, 4]
    assert extended.off_schedule(metric) == [2]


@pytest.mark.slow
def test_generation_too_far_ahead_is_dropped_and_counted(toy_overrides, tmp_path):
    cfg = load_config(None, toy_overrides + ["name=stale", "steps=4", "async_level=2", "max_off_policy_steps=1"])
    anyio.run(train, cfg, False)
    m = read_jsonl(tmp_path / "stale" / "metrics.jsonl")
    # batch k is sampled by the policy of step k − 2: batch 2 (policy 0) is 2 > 1 versions old
    # at step 2 and is dropped; no optimizer step then, so batch 3 (policy 1) is only 1 old.
    assert [x["dropped"] for x in m] == [0, 0, 16, 0]
    assert m[-1]["dropped_total"] == 16
    assert m[2]["staleness"] == {"2": 16} and m[3]["staleness"] == {"1": 16}
    assert [x["policy_version"] for x in m] == [1, 2, 2, 3]


@pytest.mark.slow
def test_crash_mid_run_keeps_written_lines_valid(toy_overrides, tmp_path, monkeypatch):
    import toytask

    calls = {"n": 0}
    original = toytask.VowelRM.score

    async def flaky(self, items):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("reward server died")
        return await original(self, items)

    monkeypatch.setattr(toytask.VowelRM, "score", flaky)
    cfg = load_config(None, toy_overrides + ["name=crash", "steps=5"])
    with pytest.raises(BaseException):
        anyio.run(train, cfg, False)
    run = tmp_path / "crash"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]  # two steps completed
    for f in sorted((run / "rollouts").iterdir()):
        assert f.suffix == ".jsonl"
        assert all(json.loads(x) for x in f.read_text().splitlines())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "missing.yaml"], "no such config file: missing.yaml"),
        (["task.name=nosuchtask"], "unknown task 'nosuchtask'"),
        (["generator.engine=warp"], "unknown generator engine 'warp'"),
        (["policy.path=/no/such/model"], "policy.path does not exist: /no/such/model"),
        (["batch_size=30", "group_size=8"], "batch_size (30) must be a multiple of group_size (8)"),
        (["reward_model.engine=hf", "reward_model.path=/nope"], "reward_model.path does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, capsys, tmp_path):
    base = [f"output_dir={tmp_path}", "progress=false", "task.name=toytask:ToyTask"]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_cli_error_has_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dynalize.run", "--config", str(tmp_path / "x.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: config error: no such config file: {tmp_path / 'x.yaml'}"


def test_a_rollout_keeps_its_prompts_meta_through_a_checkpoint():
    from dynalize.runlog import rollout_from_state, rollout_to_state

    r = Rollout("p", 0, [1], [2], [0.0], [1], ["x"], policy_version=3, meta={"rubric": [{"criterion": "a", "points": 2}]})
    back = rollout_from_state(json.loads(json.dumps(rollout_to_state(r))))
    assert back.meta == {"rubric": [{"criterion": "a", "points": 2}]} and back.policy_version == 3
