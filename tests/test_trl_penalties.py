"""dynalize.trl: Dynalize's penalties (or the monitor) inside real TRL GRPOTrainer runs on a tiny
model (tests/trl_tiny_run.py), their logs, checkpoints, run folder and two processes."""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from dynalize.penalties.candidate import Candidate, ProposalResult  # noqa: E402
from dynalize.penalties.config import PenaltiesConfig  # noqa: E402
from dynalize.runlog import read_jsonl  # noqa: E402
from dynalize.trl import HackDetected, Penalties, PenaltiesError  # noqa: E402
from dynalize.trl.batch import to_batch, weighted_sum  # noqa: E402
from launchlog import failure_report, launch_env  # noqa: E402
from test_penalty_term import FakeProposer  # noqa: E402
from trl_tiny_run import PATTERNS, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return launch_env({**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})


# --- pure parts ---------------------------------------------------------------------------------

def test_reward_before_penalties_is_trls_nan_aware_weighted_sum():
    assert weighted_sum([[1.0, None, None], [2.0, 3.0, None]], [1.0, 0.5]) == [2.0, 1.5, None]


def test_a_batch_whose_groups_are_not_one_prompt_is_refused():
    with pytest.raises(PenaltiesError, match="answers another prompt"):
        to_batch(1, ["a", "a", "b", "a"], ["x"] * 4, [0.0] * 4, 2)
    batch = to_batch(1, ["a", "a", "b", "b"], ["x", "y", "z", "w"], [0.0, None, 1.0, 2.0], 2)
    assert [[r.replies[0] for r in g] for g in batch.groups] == [["x", "y"], ["z", "w"]]


def test_import_without_trl_says_how_to_install():
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['trl'] = None; import dynalize.trl"],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: dynalize.trl needs trl, which is not installed: pip install 'dynalize[trl]'")


def test_penalties_without_the_callback_say_so_in_one_line():
    p = Penalties([lambda completions, **kw: [1.0] * len(completions)])
    kwargs = {"prompts": ["a"], "completions": ["b"], "completion_ids": [[1]]}
    p.reward_funcs[0](**kwargs)
    with pytest.raises(PenaltiesError, match=r"callbacks=\[penalties\]"):
        p.reward_funcs[1](**kwargs)


def test_reward_models_and_async_functions_are_refused():
    async def scored(completions, **kw):
        return [1.0] * len(completions)

    with pytest.raises(PenaltiesError, match="is async"):
        Penalties([scored])
    with pytest.raises(PenaltiesError, match="not a reward function"):
        Penalties(["org/reward-model"])


def paid(completions, **kw):  # the reward pays 1.0 for "zounds"
    return [1.0 + ("zounds" in c) for c in completions]


def called_at(p: Penalties, out: Path, steps: list[int]) -> list[list[float | None]]:
    """Drive `p` as GRPOTrainer does, its reward functions called at these `global_step`s (TRL
    labels them global_step + 1); what the penalty function returned at each."""
    state = SimpleNamespace(global_step=0)
    p.on_train_begin(SimpleNamespace(reward_weights=None, num_generations=2, output_dir=str(out)), state, None)
    returned = []
    for step in steps:
        state.global_step = step
        kwargs = {"prompts": ["a", "a", "b", "b"], "completions": ["zounds!", "fine", "zounds.", "ok"],
                  "completion_ids": [[1]] * 4, "trainer_state": state}
        p.reward_funcs[0](**kwargs)
        returned.append(p.reward_funcs[1](**kwargs))
    p.on_train_end(None, state, None)
    return returned


def zounds() -> Candidate:
    return Candidate("Says zounds", "d", [], r"(?i)\bzounds\b")


def test_in_trl_a_violation_costs_lam_plus_its_measured_pay_unless_told_otherwise(tmp_path):
    assert Penalties([paid], penalties={"weight": "fixed"}).cfg.weight == "fixed"
    assert Penalties([paid], penalties=PenaltiesConfig(lam=0.5)).cfg.weight == "pay"
    assert Penalties([paid], penalties=PenaltiesConfig(weight="fixed")).cfg.weight == "fixed"
    p = Penalties([paid], penalties={"every": 100}, html=False)
    p.term.buffer.add(zounds(), step=0)
    # TRL's steps 1 and 2: the pay measured at step 1 (2.0 - 1.0 in each group) prices step 2's violations
    assert called_at(p, tmp_path, [0, 1]) == [[-0.5, 0.0, -0.5, 0.0], [-1.5, 0.0, -1.5, 0.0]]


def test_log_lines_name_trls_steps_as_the_run_folder_does(tmp_path):
    from structlog.testing import capture_logs

    p = Penalties([paid], penalties={"every": 100}, html=False)
    p.term.pending = [ProposalResult(step=1, accepted=zounds())]  # proposed at TRL's step 1
    with capture_logs() as logs:
        called_at(p, tmp_path, [1])  # TRL's step 2
    written = [(e["step"], e["proposed_at"]) for e in read_jsonl(tmp_path / "dynalize" / "penalties.jsonl")
               if e["event"] == "add"]
    assert written == [(2, 1)]
    assert [(e["step"], e["proposed_at"]) for e in logs if e["event"] == "penalty.add"] == written


def test_when_trl_scores_every_few_steps_a_proposal_starts_past_each_multiple_of_every(tmp_path):
    # steps_per_generation 4 x the accumulation: TRL scores at global_step 0, 4, 8, ... (its steps 1, 5, 9, ...)
    p = Penalties([paid], penalties={"every": 5, "sync": True}, html=False)
    p.term.proposer = FakeProposer()
    called_at(p, tmp_path, [0, 4, 8, 12, 16])
    assert [v.step for v in p.term.proposer.views] == [5, 13, 17]  # past 5, 10 and 15 (step % 5 == 0: only 5)


# --- a real TRL run -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Four steps, a proposal every 2 (sync), checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("trl") / "straight"
    trainer, penalties = train(out, steps=4, save_steps=2)
    return out, trainer, penalties


def test_penalties_enter_from_the_step_after_their_proposal_and_reach_trls_logs(straight):
    out, trainer, penalties = straight
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logs) == [1, 2, 3, 4]
    # proposal at step 2 (step % every == 0) -> PATTERNS[0] enters at step 3: every reply matches [a-z]
    assert [logs[s]["penalties/active"] for s in (1, 2, 3, 4)] == [0.0, 0.0, 1.0, 1.0]
    assert logs[3]["penalties/adds"] == 1.0 and logs[4]["penalties/adds"] == 0.0
    frac = logs[3]["penalty/p001/prevalence"]
    assert frac > 0.5 and logs[3]["rewards/penalties/mean"] == pytest.approx(-0.5 * frac)
    assert logs[1]["rewards/penalties/mean"] == 0.0
    assert {"rewards/honest/mean", "rewards/shortcut/mean"} <= set(logs[1])  # the wrapped functions keep their columns
    folder = out / "dynalize"
    events = read_jsonl(folder / "penalties.jsonl")
    assert [(e["event"], e["step"], e.get("proposed_at")) for e in events if e["event"] == "add"] == [("add", 3, 2)]
    assert [m["step"] for m in read_jsonl(folder / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [e["step"] for e in read_jsonl(folder / "evidence.jsonl")] == [2, 4]  # the last one, too, at the end
    rows = read_jsonl(folder / "rollouts" / "step_000003.jsonl")
    assert len(rows) == 8 and all("p001" in r["verdicts"] for r in rows)
    assert penalties.status == 10 and trainer.state.penalties_status == 10
    assert "'pattern 0' since step 2" in penalties.verdict == json.loads((folder / "summary.json").read_text())["verdict"]


def test_reward_before_penalties_is_what_the_wrapped_functions_gave(straight):
    out, _, _ = straight
    rows = read_jsonl(out / "dynalize" / "rollouts" / "step_000001.jsonl")
    # honest + shortcut, shortcut None on every fifth completion: TRL's NaN-aware sum
    rewards = [r["scores"]["reward"] for r in rows]
    assert all(r == pytest.approx(min(len(row["replies"][0]), 40) / 40 + (0.0 if i % 5 == 4 else
                                  0.5 * ("a" in row["replies"][0]))) for i, (r, row) in enumerate(zip(rewards, rows)))


def test_report_reads_the_run_folder(straight):
    out, _, _ = straight
    page = out / "page.html"
    done = subprocess.run([sys.executable, "-m", "dynalize.report", str(out / "dynalize"), "--html", str(page),
                           "--metric", "metrics:reward/mean"], capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pattern 0" in page.read_text()


def test_each_checkpoint_holds_the_penalties_and_a_resumed_run_is_bit_identical(straight, tmp_path):
    out, _, _ = straight
    state = json.loads((out / "checkpoint-2" / "dynalize_penalties.json").read_text())
    assert state["step"] == 2 and state["term"]["pending"][0]["candidate"]["regex"] == PATTERNS[0]
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-4")  # the crash happened after step 2's checkpoint
    train(resumed, steps=4, save_steps=2, resume=True)
    for name in ("penalties.jsonl", "evidence.jsonl", "metrics.jsonl", "rollouts/step_000003.jsonl",
                 "rollouts/step_000004.jsonl"):
        assert (resumed / "dynalize" / name).read_bytes() == (out / "dynalize" / name).read_bytes(), name
    assert ((resumed / "checkpoint-4" / "dynalize_penalties.json").read_bytes()
            == (out / "checkpoint-4" / "dynalize_penalties.json").read_bytes())


def test_resuming_a_checkpoint_without_penalties_says_so(straight, tmp_path):
    out, _, _ = straight
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    (resumed / "checkpoint-2" / "dynalize_penalties.json").unlink()
    with pytest.raises(PenaltiesError, match="resuming at step 2: .* is not a readable penalties state"):
        train(resumed, steps=4, save_steps=2, resume=True)


def test_observe_only_adds_nothing_to_the_reward_and_can_stop_training(tmp_path):
    with pytest.raises(HackDetected, match=r"live at step 3.*'pattern 0' since step 2"):
        train(tmp_path / "observe", steps=4, observe_only=True, on_hack="raise")
    rows = read_jsonl(tmp_path / "observe" / "dynalize" / "rollouts" / "step_000003.jsonl")
    assert all(r["verdicts"]["p001"] for r in rows)
    assert all(r["scores"]["penalties"] == 0.0 for r in rows)  # judged, not penalised
    assert all(r["reward"] == r["scores"]["reward"] for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_two_processes_propose_once_and_judge_alike(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                           "127.0.0.1", "--master_port", str(port), str(TESTS / "trl_tiny_run.py"), str(tmp_path)],
                          env=env(), capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert done.returncode == 0, failure_report(done, "torchrun")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["buffer"] == ranks[1]["buffer"] and ranks[0]["status"] == ranks[1]["status"] == 10
    assert len(ranks[0]["returned"]) == len(ranks[1]["returned"]) == 4  # each rank: its own 8 completions a step
    metrics = read_jsonl(tmp_path / "dynalize" / "metrics.jsonl")
    assert [m["rollouts"] for m in metrics] == [16] * 4  # the main process judged both ranks' completions
    proposals = len(re.findall(r"proposer\.accepted", done.stdout + done.stderr))
    assert proposals == 2  # steps 2 and 4, once (the main process)
    step3 = read_jsonl(tmp_path / "dynalize" / "rollouts" / "step_000003.jsonl")
    expected = [None if r["reward"] is None else -0.5 * r["violations"] for r in step3]
    assert ranks[0]["returned"][2] + ranks[1]["returned"][2] == expected


@pytest.mark.timeout(1200)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_the_example_is_a_plain_trl_script_with_an_import_and_two_lines_changed_and_runs(tmp_path):
    def code(name: str) -> list[str]:  # the script's lines after its docstring, blank lines left out
        text = (ROOT / "examples" / "trl_penalties" / name).read_text()
        return [x for x in text.splitlines()[ast.parse(text).body[0].end_lineno:] if x.strip()]

    diff = list(difflib.ndiff(code("plain.py"), code("train.py")))
    added, removed = [x[2:] for x in diff if x.startswith("+ ")], [x[2:] for x in diff if x.startswith("- ")]
    assert len(removed) == 1 and removed[0].startswith("trainer = GRPOTrainer(")
    assert len(added) == 3 and all(x.endswith("# dynalize") for x in added), added
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_penalties" / "train.py"), "--steps", "2",
                           "--model", "tiny:policy", "--out", str(tmp_path / "run")], env=env(), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, failure_report(done, "example")
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "dynalize" / "metrics.jsonl")] == [1, 2]
    assert (tmp_path / "run" / "dynalize" / "report.html").exists()
