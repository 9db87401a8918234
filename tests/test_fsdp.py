"""FSDP2 proven on CPU: two processes started by `accelerate launch` with
configs/accelerate/fsdp_cpu.yaml (gloo) shard the learner, train like one process, checkpoint
sharded state that resumes exactly, hand the generator the full weights, export a model
transformers loads, and leave the orchestration to rank 0.

Each launch gets a port the OS just handed out (and is retried with another if something took it
meanwhile); nothing here depends on timing or on how many cores the machine has."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dynalize import tiny
from dynalize.runlog import read_jsonl
from launchlog import failure_report, launch_env

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONFIG = ROOT / "configs" / "accelerate" / "fsdp_cpu.yaml"
TIMEOUT = 1200  # seconds per launch: generous, a loaded 2-core machine starts two torch processes slowly
UNEVEN_TIMEOUT = 600  # two learner steps; the old code hung here (a rank waiting for its peer's forward)
EXACT = ("loss", "reward/mean", "grad_norm", "gen_len/mean", "policy_version")

pytestmark = pytest.mark.slow


def environment() -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH", "")] if p)
    return launch_env({**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: list[str], timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    """`args` in a session of its own; past `timeout` the test fails, and the launcher is stopped
    with SIGTERM first: torch's launcher then stops the ranks it started (each in a session of its
    own, out of reach of a kill of the launcher's group), which a hang would leave waiting."""
    with subprocess.Popen(args, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = "", "(killed)"
            pytest.fail(f"{' '.join(args[-4:])} still running after {timeout} s (a rank waiting on its peer?)\n"
                        f"{err[-3000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def launch(*args: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file fsdp_cpu.yaml ARGS` (two CPU processes); asserts it succeeded."""
    for _ in range(3):
        done = run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
                    "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), *args], timeout)
        if done.returncode == 0 or not re.search(r"address already in use|EADDRINUSE", done.stdout + done.stderr, re.I):
            break
    assert done.returncode == 0, failure_report(done, "accelerate launch")
    return done


def ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


# --- the learner on its own ---------------------------------------------------------------------

@pytest.mark.timeout(2600)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_fsdp2_shards_the_learner_trains_like_one_process_and_hands_the_generator_the_full_weights(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    single = run([sys.executable, str(TESTS / "fsdp_learner.py"), str(one)])
    assert single.returncode == 0, single.stderr[-4000:]
    launch(str(TESTS / "fsdp_learner.py"), str(two))
    r0, r1 = ranks(two)
    assert r0["distributed_type"] == r1["distributed_type"] == "DistributedType.FSDP"
    total = r0["total_params"]
    # each rank holds a shard, read from the local tensors of the DTensor parameters: about half
    for r in (r0, r1):
        assert 0.4 * total < r["local_params"] < 0.6 * total, r
    assert r0["local_params"] + r1["local_params"] == total  # together: the whole model, once
    reference = json.loads((one / "rank0.json").read_text())
    assert reference["local_params"] == total
    assert [m["processes"] for m in r0["metrics"]] == [2.0] * 3
    for a, b in zip(reference["metrics"], r0["metrics"], strict=True):  # 3 steps, same batches
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["loss_tokens"] == a["loss_tokens"]
    assert r0["version"] == r1["version"] == 3
    # what the generator receives (policy_state) is the full, unsharded state: every parameter as
    # DTensor's own all-gather of the shards gives it, tied weights included
    handed, gathered = load_file(two / "policy_state.safetensors"), load_file(two / "gathered.safetensors")
    assert set(gathered) <= set(handed)
    for name, full in gathered.items():
        assert torch.equal(handed[name], full), name
    assert torch.equal(handed["lm_head.weight"], handed["model.embed_tokens.weight"])
    alone = load_file(one / "policy_state.safetensors")  # and it is what one process trains, up to 1e-5
    for name, weight in alone.items():
        torch.testing.assert_close(handed[name], weight, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(2600)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_fsdp2_ranks_skip_an_overflowed_fp16_step_together_and_resume_with_their_scale(tmp_path):
    straight, resumed, checkpoint = tmp_path / "straight", tmp_path / "resumed", tmp_path / "ckpt"
    straight.mkdir(), resumed.mkdir()
    launch(str(TESTS / "fsdp_learner.py"), str(straight), "--fp16-overflow", "--save-after-2", str(checkpoint))
    r0, r1 = ranks(straight)
    # only rank 1 found the inf (in its own shard); both skipped step 2, and they keep one scale
    assert [m["skipped_step"] for m in r0["metrics"]] == [0.0, 1.0, 0.0]
    assert "grad_norm" not in r0["metrics"][1]
    assert r0["version"] == r1["version"] == 2
    assert r0["grad_scale"] == r1["grad_scale"] == 32768.0
    assert json.loads((checkpoint / "learner.json").read_text())["grad_scaler"]["scale"] == 32768.0
    # resumed from the checkpoint after step 2 (sharded weights and optimizer, the scale in
    # learner.json), step 3 gives the same weights, bit for bit, and the same scale
    launch(str(TESTS / "fsdp_learner.py"), str(resumed), "--fp16-overflow", "--resume", str(checkpoint))
    q0, q1 = ranks(resumed)
    assert q0["metrics"] == r0["metrics"][2:]
    assert q0["grad_scale"] == q1["grad_scale"] == 32768.0 and q0["version"] == 2
    a, b = load_file(straight / "gathered.safetensors"), load_file(resumed / "gathered.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", [["padded"], ["packed", "--lora"]], ids=["padded", "packed_lora"])
@pytest.mark.timeout(2600)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_fsdp2_ranks_with_different_micro_batch_counts_meet_and_train_like_one_process(tmp_path, mode):
    """Shards of 5 and 4 sequences: 3 and 2 micro-batches (padded), or 2 and 1 packing bins (with
    LoRA, whose reference forward is the sharded base's: a collective too). FSDP2 all-gathers at
    every forward, so the rank with fewer passes runs zero-weight ones: no hang, and loss, gradient
    norm, KL and the (merged) weights those of one process on the same batches."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    single = run([sys.executable, str(TESTS / "fsdp_learner.py"), str(one), "--uneven", *mode])
    assert single.returncode == 0, single.stderr[-4000:]
    checkpoint = tmp_path / "ckpt"  # LoRA: its checkpoint too (the adapter saved from the gathered state)
    save = ["--save-after-2", str(checkpoint)] if "--lora" in mode else []
    launch(str(TESTS / "fsdp_learner.py"), str(two), "--uneven", *mode, *save, timeout=UNEVEN_TIMEOUT)
    r0, r1 = ranks(two)
    assert r0["distributed_type"] == "DistributedType.FSDP"
    assert (r0["micro_batches"], r1["micro_batches"]) == ((3, 2) if mode == ["padded"] else (2, 1))
    reference = json.loads((one / "rank0.json").read_text())
    for a, b in zip(reference["metrics"], r0["metrics"], strict=True):  # 2 steps, same batches
        assert b["loss_tokens"] == a["loss_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["mean_ratio"] == pytest.approx(a["mean_ratio"], rel=1e-6)
        assert b["kl/ref"] == pytest.approx(a["kl/ref"], rel=1e-4, abs=1e-9)
    assert reference["metrics"][0]["kl/ref"] == 0.0 < reference["metrics"][1]["kl/ref"]
    pairs = list(zip(reference["metrics"], r0["metrics"]))
    gap = {key: max(abs(b[key] - a[key]) / max(abs(a[key]), 1e-12) for a, b in pairs)
           for key in ("loss", "grad_norm", "kl/ref")}
    print(f"two processes vs one, {' '.join(mode)}: " + ", ".join(f"{k} {v:.1e}" for k, v in gap.items()), "relative")
    assert r0["version"] == r1["version"] == 2
    alone, handed = load_file(one / "policy_state.safetensors"), load_file(two / "policy_state.safetensors")
    for name, weight in alone.items():
        torch.testing.assert_close(handed[name], weight, rtol=1e-5, atol=1e-5)
    if save:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        merged = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.resolve("tiny:policy")),
                                            checkpoint / "adapter")
        assert all(torch.equal(handed[k], v) for k, v in merged.state_dict().items() if k in handed)
        ids = torch.tensor([list(range(5, 40))])
        with torch.no_grad():
            torch.testing.assert_close(adapted(ids).logits, merged(ids).logits, rtol=1e-5, atol=1e-5)


# --- whole runs ---------------------------------------------------------------------------------

def overrides(out: Path, name: str, record: Path) -> list[str]:
    return [f"output_dir={out}", f"name={name}", "steps=3", "batch_size=8", "group_size=4", "progress=false",
            "generator.max_new_tokens=12", "trainer.lr=1e-3", "trainer.micro_batch_size=2",
            "task.name=ranktask:RankTask", f"task.args.record={record}", "reward_model.engine=task",
            "checkpoint_every=1", "policy.path=tiny:policy", "penalties.enabled=false", "eval_every=0",
            "torch_threads=1"]


def consolidated(folder: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The model weights of a sharded (DCP) checkpoint folder, joined into one state dict."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(folder), str(tmp / "joined.pt"))
    return torch.load(tmp / "joined.pt", weights_only=True)["model"]  # Accelerate saves {"model": state}


@pytest.mark.timeout(2600)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_fsdp2_run_orchestrates_on_rank_0_checkpoints_shards_resumes_exactly_and_exports(tmp_path):
    record = tmp_path / "orchestrator_calls.txt"
    launch("-m", "dynalize.run", *overrides(tmp_path, "fsdp", record))
    run_dir = tmp_path / "fsdp"
    straight = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in straight] == [1, 2, 3]  # one orchestrator: each step logged once
    assert {m["processes"] for m in straight} == {2.0}
    calls = record.read_text().split("\n")[:-1]
    assert any(c.startswith("score ") for c in calls) and {c.split()[1] for c in calls} == {"0"}  # rank 0 only

    # sharded state: one DCP file per rank for the weights and for the optimizer, no full copy
    state = run_dir / "checkpoints" / "step_000003" / "train_state"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (state / part).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"], part
    assert not list(state.glob("*.safetensors")) and not list(state.glob("*.bin"))
    sharded = consolidated(state / "pytorch_model_fsdp_0", tmp_path)
    policy = load_file(run_dir / "checkpoints" / "step_000003" / "policy" / "model.safetensors")
    assert set(policy) <= set(sharded)
    for name, weight in policy.items():  # the full policy/ written beside the shards is the same model
        assert torch.equal(weight, sharded[name]), name

    # exact resume: as if stopped after step 2 (its checkpoint is the newest), resumed under FSDP2
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step_000003")
    shutil.rmtree(resumed_dir / "final")
    launch("-m", "dynalize.run", "--resume", str(resumed_dir))
    resumed = read_jsonl(resumed_dir / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for a, b in zip(straight, resumed):
        for key in EXACT:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    final, final_resumed = load_file(run_dir / "final" / "model.safetensors"), \
        load_file(resumed_dir / "final" / "model.safetensors")
    assert set(final) == set(final_resumed)
    assert all(torch.equal(final[k], final_resumed[k]) for k in final)

    # python -m dynalize.export writes a full model that transformers loads
    exported = tmp_path / "exported"
    done = run([sys.executable, "-m", "dynalize.export", str(run_dir), "--out", str(exported)])
    assert done.returncode == 0, done.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(exported)
    loaded = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == sum(
        v.numel() for k, v in sharded.items() if k != "lm_head.weight")
    for name, weight in sharded.items():
        assert torch.equal(loaded[name], weight), name
