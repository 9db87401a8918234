"""Two real training processes (DDP on gloo, launched with torchrun) train like one process."""

import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from dynalize import tiny
from dynalize.runlog import read_jsonl
from launchlog import failure_report, launch_env

HANG = 800
"""Seconds a run may take before it counts as hung: a loaded 2-core CI machine took over 300 for
the two-process run (three steps of a tiny model, two processes on two busy cores)."""


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "step_000003" / "policy" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two runs, each given HANG (a guard against a hang, not a speed bound)
def test_two_process_ddp_matches_one_process(toy_overrides, tmp_path):
    overrides = toy_overrides + ["steps=3", "trainer.micro_batch_size=4"]
    env = launch_env({**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                                                   os.environ.get("PYTHONPATH", "")])})
    single = subprocess.run([sys.executable, "-m", "dynalize.run", *overrides, "name=one"],
                            env=env, capture_output=True, text=True, timeout=HANG)
    assert single.returncode == 0, failure_report(single, "one process")
    # torchrun starts two processes; only rank 0 runs the orchestrator, rank 1 trains its shard
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "dynalize.run", *overrides, "name=two"], env=env, capture_output=True, text=True,
                         timeout=HANG)
    assert ddp.returncode == 0, failure_report(ddp, "torchrun ddp")
    one = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    two = read_jsonl(tmp_path / "two" / "metrics.jsonl")
    assert [m["step"] for m in two] == [1, 2, 3]  # one orchestrator: each step logged once
    assert {m["processes"] for m in one} == {1.0} and {m["processes"] for m in two} == {2.0}
    for a, b in zip(one, two):  # the same global batch: the same rollouts and token counts
        assert b["loss_tokens"] == a["loss_tokens"]
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], rel=1e-6)

    # Same global batch, same normalisation: equal up to float summation order. What is compared:
    # - gradient norms, relative;
    # - the weights after the 3 steps: their difference against the whole change the steps made;
    # - losses against the scale of their terms (mean |advantage|): a GRPO loss is a mean of
    #   advantage-weighted terms whose group sums cancel (on-policy at step 0 it is ~1e-10 and
    #   its sign is float noise), so a relative difference of the loss itself says nothing.
    grad_gap = max(abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] for a, b in zip(one, two))
    loss_gap = max(abs(b["loss"] - a["loss"]) / a["advantage/abs_mean"] for a, b in zip(one, two))
    start = load_file(os.path.join(tiny.resolve("tiny:policy"), "model.safetensors"))
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert w1.keys() == w2.keys() <= start.keys()
    norm = lambda parts: math.sqrt(sum(float((x.double() ** 2).sum()) for x in parts))
    moved = norm(w1[k] - start[k] for k in w1)
    weight_gap = norm(w2[k] - w1[k] for k in w1) / moved
    print(f"two processes vs one over {len(one)} steps: gradient norm {grad_gap:.1e} relative, weights after "
          f"the steps {weight_gap:.1e} of their change, loss {loss_gap:.1e} of mean |advantage|")
    assert moved > 0 and all(a["advantage/abs_mean"] > 0 for a in one)
    assert grad_gap < 1e-5
    assert weight_gap < 1e-4
    assert loss_gap < 1e-5
    assert (tmp_path / "two" / "checkpoints" / "step_000003" / "train_state").is_dir()


def test_a_follower_rank_keeps_its_learner_until_the_process_ends(monkeypatch):
    # freed when serve() returns, a DDP learner's reducer joins gloo's worker thread with the GIL
    # held while that thread waits for the GIL (a deadlock seen under load, docs/reliability.md)
    import gc
    import weakref

    import dynalize.build
    from dynalize import api

    class Learner:
        served = False

        def serve(self):
            self.served = True

    made = []
    monkeypatch.setattr(dynalize.build, "build_learner", lambda cfg: made.append(Learner()) or made[-1])
    monkeypatch.setattr(api, "FOLLOWING", [])
    monkeypatch.setattr(api, "set_torch_threads", lambda threads: None)
    api.follow(type("Cfg", (), {"torch_threads": 0})())
    kept = weakref.ref(made.pop())
    gc.collect()
    assert kept() is not None and kept().served
