"""A simulated user whose API fails mid-run is treated as a failing judge is: the conversation ends
there (`user_failed` in its rollout), its group is left out of the update, counted
(`user_sim/failed`, `user_sim/failed_total`), and past `max_left_out_rate` the run stops after a
checkpoint with one line naming the simulated user (exit 3). Before, the first 500 after the
simulator's retries ended the run with exit 1 and lost the step. A real fault-injecting HTTP server
on 127.0.0.1 plays the patient of `counseling_multiturn`."""

from __future__ import annotations

import zlib
from pathlib import Path

from dynalize.run import main
from dynalize.runlog import read_jsonl
from faultserver import FaultServer

REPO = Path(__file__).resolve().parent.parent


def lengths(texts):
    return [len(t) / 100 for t in texts]


def patient_run(tmp_path, capsys, server, *extra) -> tuple[int, list[str]]:
    code = main([
        f"output_dir={tmp_path}", "name=run", "steps=2", "batch_size=8", "group_size=4", "progress=false",
        "generator.max_new_tokens=8", "checkpoint_every=0", "torch_threads=1", "eval_every=0",
        "task.name=counseling_multiturn", f"task.args.train_file={REPO / 'examples/data/counseling_sample.jsonl'}",
        "task.args.max_turns=2", "task.args.user_simulator.engine=openai",
        f"task.args.user_simulator.base_url={server.base_url}", "task.args.user_simulator.model=patient",
        "task.args.user_simulator.api_key_env=null", "task.args.user_simulator.max_retries=1",
        "task.args.user_simulator.retry_wait=0.01", "reward_model.engine=python",
        "reward_model.path=test_user_simulator_faults:lengths", *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def after_preflight(fault):
    """`fault` for every request but the first (the preflight's)."""
    seen = []

    def plan(body):
        seen.append(body)
        return fault(len(seen)) if len(seen) > 1 else None
    return plan


def test_a_simulated_user_down_mid_run_stops_after_a_checkpoint_with_one_line_exit_3(tmp_path, capsys):
    with FaultServer(lambda body: "I see.", after_preflight(lambda n: "500")) as server:
        code, err = patient_run(tmp_path, capsys, server, "left_out_window=1")
    assert code == 3, err[-5:]
    assert err[-1].startswith("stopped: 8 of 8 rollouts (100%) were left out of the update over the last 1 steps")
    assert "or whose simulated user failed (8 conversations so far; last error: EngineError: chat request to " in err[-1]
    assert "HTTP 500" in err[-1] and not any("Traceback" in line for line in err)
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step_000001").is_dir()
    (metrics,) = read_jsonl(run / "metrics.jsonl")
    assert (metrics["user_sim/failed"], metrics["user_sim/failed_total"], metrics["left_out"]) == (8, 8, 8)
    rollouts = read_jsonl(run / "rollouts" / "step_000001.jsonl")
    assert all(r["user_failed"].startswith("EngineError: ") and r["left_out"] and r["reward"] is None for r in rollouts)
    assert all([t["role"] for t in r["turns"]] == ["assistant"] for r in rollouts)  # the conversation ended there


def fails_some(body):
    """A 500, on every try, for the conversations whose last counsellor reply hashes to 0 mod 3:
    the same conversations on each retry, whatever order the concurrent requests arrive in."""
    return "500" if zlib.crc32(body["messages"][-1]["content"].encode()) % 3 == 0 else None


def test_a_few_simulated_user_failures_are_counted_and_the_run_goes_on(tmp_path, capsys):
    with FaultServer(lambda body: "I see.") as server:
        server.fault = lambda body: fails_some(body) if server.requests else None  # the preflight's request passes
        code, err = patient_run(tmp_path, capsys, server)
    assert code == 0, err[-5:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    rollouts = {step: read_jsonl(tmp_path / "run" / "rollouts" / f"step_{step:06d}.jsonl") for step in (1, 2)}
    failed = [r for lines in rollouts.values() for r in lines if r.get("user_failed")]
    assert failed and metrics[-1]["user_sim/failed_total"] == len(failed) == sum(m["user_sim/failed"] for m in metrics)
    assert all(fails_some({"messages": [{"content": r["turns"][0]["content"]}]}) for r in failed)
    for m, (step, lines) in zip(metrics, rollouts.items()):  # exactly the groups holding a failed conversation
        hit = {r["group"] for r in lines if r.get("user_failed")}
        assert m["left_out"] == 4 * len(hit) == sum(bool(r.get("left_out")) for r in lines)


def test_a_failed_simulated_user_survives_a_checkpoint_of_batches_generated_ahead():
    """Batches generated ahead are checkpointed unscored: their `user_failed` mark goes with them,
    so a resumed run leaves out the same groups as the run it continues."""
    from dynalize.rollouts import USER_FAILED
    from dynalize.runlog import rollout_from_state, rollout_to_state
    from dynalize.types import Message, Rollout

    r = Rollout(prompt_id="p", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                replies=["hi"], policy_version=0, messages=[Message("user", "x")],
                turns=[Message("assistant", "hi")], info={USER_FAILED: "EngineError: HTTP 500"})
    assert rollout_from_state(rollout_to_state(r)).info == {USER_FAILED: "EngineError: HTTP 500"}
    clean = Rollout(prompt_id="p", group=0, prompt_ids=[1], completion_ids=[2], logprobs=[0.0], loss_mask=[1],
                    replies=["hi"], policy_version=0)
    assert "info" not in rollout_to_state(clean)  # checkpoints of runs without failures are as before
