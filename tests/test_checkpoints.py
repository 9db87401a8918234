"""Checkpoints: no code runs from them, damage is found and the previous intact one is used, and
a run killed with SIGKILL at random moments resumes exactly."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import torch

from dynalize.checkpoint import damage, rng_state, set_rng_state, write_manifest
from dynalize.config import load_config
from dynalize.run import main, train
from dynalize.runlog import read_jsonl

EXACT = ("loss", "reward/mean", "grad_norm", "gen_len/mean", "policy_version")
TESTS = Path(__file__).parent


def toy(out: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [f"output_dir={out}", f"name={name}", f"steps={steps}", "batch_size=8", "group_size=4",
            "progress=false", "generator.max_new_tokens=12", "trainer.lr=1e-3", "trainer.micro_batch_size=8",
            "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=1",
            "policy.path=tiny:policy", "penalties.enabled=false", "eval_every=0", "torch_threads=1", *extra]


def same_steps(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b):
        for key in EXACT:
            assert x[key] == y[key], (x["step"], key, x[key], y[key])


def test_rng_state_round_trips_through_json_exactly():
    import json

    state = json.loads(json.dumps(rng_state()))
    expected = (random.random(), torch.rand(3).tolist())
    random.random(), torch.rand(5)  # move on
    set_rng_state(state)
    assert (random.random(), torch.rand(3).tolist()) == expected


class Exploit:
    """A pickle that runs code when loaded: touches the file `path`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# --- damaged checkpoints ----------------------------------------------------------------------------

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _crafted_rng(ckpt: Path) -> None:
    """An attacker's checkpoint: the RNG as a pickle that runs a command, with a manifest to match."""
    (ckpt / "rng.json").unlink()
    exploit = {"python": Exploit(str(ckpt.parent / "PWNED")), "torch": None}
    (ckpt / "rng.pt").write_bytes(pickle.dumps(exploit, protocol=2))
    write_manifest(ckpt)


DAMAGE = {
    "truncated weights": lambda c: _truncate(c / "train_state" / "model.safetensors"),
    "flipped optimizer byte": lambda c: _flip(c / "train_state" / "optimizer.bin"),
    "truncated random states": lambda c: _truncate(c / "train_state" / "random_states_0.pkl"),
    "corrupt policy safetensors": lambda c: _flip(c / "policy" / "model.safetensors"),
    "state.json deleted": lambda c: (c / "state.json").unlink(),
    "unknown file planted": lambda c: (c / "train_state" / "extra.pkl").write_bytes(b"x"),
    "crafted rng pickle": _crafted_rng,
    "weights edited, manifest deleted": lambda c: (_flip(c / "policy" / "model.safetensors"),
                                                   (c / "manifest.json").unlink()),
}


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A 3-step toy run with checkpoints after steps 1, 2 and 3."""
    out = tmp_path_factory.mktemp("ckpt")
    anyio.run(train, load_config(None, toy(out, "run", 3)), False)
    return out / "run", read_jsonl(out / "run" / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_latest_checkpoint_is_skipped_for_the_previous_intact_one(three_steps, tmp_path, capsys, kind):
    source, metrics = three_steps
    run = tmp_path / "run"
    shutil.copytree(source, run)
    DAMAGE[kind](run / "checkpoints" / "step_000003")
    assert damage(run / "checkpoints" / "step_000002") is None
    assert main(["--resume", str(run), "steps=4"]) == 0
    err = capsys.readouterr().err
    assert "step_000003" in err and ("checkpoint.damaged" in err or "checkpoint.unloadable" in err), err
    assert "Traceback" not in err and not (run / "checkpoints" / "PWNED").exists()
    resumed = read_jsonl(run / "metrics.jsonl")
    same_steps(resumed[:3], metrics)  # step 3 ran again from checkpoint 2, exactly as the first time
    assert resumed[3]["step"] == 4


@pytest.mark.slow
def test_a_checkpoint_cut_off_mid_write_is_ignored(three_steps, tmp_path, capsys):
    source, metrics = three_steps
    run = tmp_path / "run"
    shutil.copytree(source, run)
    partial = run / "checkpoints" / "step_000004.tmp"  # what kill -9 during a save leaves
    shutil.copytree(run / "checkpoints" / "step_000003", partial)
    (partial / "manifest.json").unlink()
    _truncate(partial / "train_state" / "optimizer.bin")
    assert main(["--resume", str(run), "steps=4"]) == 0
    assert "damaged" not in capsys.readouterr().err
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_crafted_legacy_rng_file_runs_no_code(three_steps, tmp_path):
    from dynalize.checkpoint import load_checkpoint

    ckpt = tmp_path / "step_000001"
    shutil.copytree(three_steps[0] / "checkpoints" / "step_000001", ckpt)
    _crafted_rng(ckpt)

    class NoLearner:
        def load(self, path):
            pass

    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(ckpt, NoLearner())
    assert not (tmp_path / "PWNED").exists()


# --- kill -9 at random moments ------------------------------------------------------------------------

def _launch(argv: list[str], log: Path) -> subprocess.Popen:
    path = [str(TESTS.parent), str(TESTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.Popen([sys.executable, "-m", "dynalize.run", *argv], stdout=subprocess.DEVNULL,
                            stderr=open(log, "ab"), env=env, cwd=TESTS.parent)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
@pytest.mark.timeout(1800)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_kill_9_at_random_moments_then_resume_is_exact(tmp_path):
    seed = int(os.environ.get("DYNALIZE_CRASH_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    steps, argv = 6, toy(tmp_path, "killed", 6, "task.args.rm_delay=0.15")
    run, log = tmp_path / "killed", tmp_path / "killed.log"
    kills = []
    proc = _launch(argv, log)
    for _ in range(2):
        deadline = time.monotonic() + 120
        start = _lines(run / "metrics.jsonl")
        while proc.poll() is None and _lines(run / "metrics.jsonl") <= start and time.monotonic() < deadline:
            time.sleep(0.02)  # wait until this process has trained a step
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills.append(_lines(run / "metrics.jsonl"))
        proc = _launch(["--resume", str(run)], log)  # before the first checkpoint too: it starts again
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert main(toy(tmp_path, "straight", steps, "task.args.rm_delay=0.15")) == 0  # the same base config as the CLI's
    why = f"seed {seed}, killed after these many metric lines: {kills}"
    assert len(kills) >= 2, why
    killed, straight = read_jsonl(run / "metrics.jsonl"), read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [m["step"] for m in killed] == list(range(1, steps + 1)), why
    same_steps(killed, straight)
    weights = [hashlib.sha256((r / "checkpoints" / f"step_{steps:06d}" / "policy" / "model.safetensors")
                              .read_bytes()).hexdigest() for r in (run, tmp_path / "straight")]
    assert weights[0] == weights[1], why


@pytest.mark.slow
def test_resume_trims_held_out_evaluations_like_metrics(tmp_path):
    anyio.run(train, load_config(None, toy(tmp_path, "ev", 2, "eval_every=1", "eval_samples=1")), False)
    run = tmp_path / "ev"
    assert [e["version"] for e in read_jsonl(run / "eval" / "task.jsonl")] == [0, 1, 2]
    shutil.rmtree(run / "checkpoints" / "step_000002")  # as if killed before it was written
    assert main(["--resume", str(run)]) == 0  # step 1 and its evaluation run again
    assert [e["version"] for e in read_jsonl(run / "eval" / "task.jsonl")] == [0, 1, 2]
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]  # the step-0 evaluation, then 2 steps


def test_resume_rewrites_only_the_runs_own_files(three_steps, tmp_path):
    source, metrics = three_steps
    run = tmp_path / "run"
    shutil.copytree(source, run)
    shutil.rmtree(run / "checkpoints" / "step_000003")  # steps 2 runs again: its lines are trimmed
    mine = {"todo.jsonl": "buy milk\n", "notes.jsonl": '{"step": 7}\n{"step": 1, "note": "x"}\n'}
    for name, text in mine.items():
        (run / name).write_text(text)
    assert main(["--resume", str(run)]) == 0
    assert {name: (run / name).read_text() for name in mine} == mine
    same_steps(read_jsonl(run / "metrics.jsonl"), metrics)


def test_a_checkpoint_from_before_manifests_loads_with_one_line_saying_so(three_steps, tmp_path, capsys):
    import json

    source, metrics = three_steps
    run = tmp_path / "run"
    shutil.copytree(source, run)
    old = run / "checkpoints" / "step_000003"  # as the version before manifests wrote it: rng.pt, no manifest
    state = json.loads((old / "rng.json").read_text())
    set_rng_state(state)
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, old / "rng.pt")
    (old / "rng.json").unlink()
    (old / "manifest.json").unlink()
    assert main(["--resume", str(run), "steps=4"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "checkpoint.unverified" in line]
    assert len(lines) == 1 and "from before manifests" in lines[0] and "step_000003" in lines[0]
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_run_killed_before_its_first_checkpoint_resumes_from_scratch_as_the_same_run(three_steps, tmp_path, capsys):
    source, metrics = three_steps
    run = tmp_path / "run"
    shutil.copytree(source, run)
    for ckpt in (run / "checkpoints").iterdir():  # as if killed during step 1, before any checkpoint
        shutil.rmtree(ckpt)
    shutil.rmtree(run / "final")
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    assert main(["--resume", str(run)]) == 0
    assert "starts again from step 0" in capsys.readouterr().err
    same_steps(read_jsonl(run / "metrics.jsonl"), metrics)  # the same seed: the same run
