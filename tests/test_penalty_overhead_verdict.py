"""benchmarks/penalty_overhead.py: its slow-proposer sentence comes from the measured numbers
(step times and the end-of-run wait), never a fixed claim."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("penalty_overhead", ROOT / "benchmarks" / "penalty_overhead.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["penalty_overhead"] = bench  # its dataclasses look their module up while it loads
spec.loader.exec_module(bench)


def history(steps: list[float], finish: float = 0.0) -> list[dict]:
    out = [{"step": i, "time/step": t} for i, t in enumerate(steps)]
    out[-1]["time/finish"] = finish
    return out


RM = [history([0.5, 0.4, 0.6])]


def test_a_run_end_that_waited_for_the_proposal_is_reported_as_waiting():
    line = bench.slow_proposer_verdict([history([0.5, 0.5, 28.6], finish=28.1)], RM, [30.2], [2.0])
    assert "end-of-run wait 28.10 s" in line and "the run's end waited for it" in line
    assert "no step and no run end waited" not in line


def test_a_step_that_waited_is_reported_and_a_run_that_did_not_wait_says_so():
    waited = bench.slow_proposer_verdict([history([0.5, 20.0, 0.5])], RM, [22.0], [2.0])
    assert "a step waited for it" in waited
    clean = bench.slow_proposer_verdict([history([0.5, 0.7, 0.5], finish=0.001)], RM, [2.1], [2.0])
    assert clean.endswith("no step and no run end waited for it (waiting = more than 15 s over rm-only)")
    assert "longest step 0.70 s (rm-only 0.60 s), end-of-run wait 0.00 s" in clean
