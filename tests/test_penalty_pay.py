"""penalties.weight: a violation costs λ (the method's rule) or λ plus what the reward measurably
pays for the pattern (penalties/pay.py), in a dynalize run's term and in dynalize.trl alike."""

import anyio
import pytest

from dynalize.penalties.buffer import PenaltyBuffer
from dynalize.penalties.config import PenaltiesConfig
from dynalize.penalties.pay import measured_pay, record_pay, violation_cost
from dynalize.judge.judge import RegexJudge
from dynalize.types import Penalty
from test_penalty_term import FakeProposer, candidate, hacked_batch, score, term


def hack_and_plain_penalties(weight: str) -> list[tuple[float, float]]:
    """Steps 1 and 2 of a run whose RM pays the "Zounds," opener 1.0 within every group, under a
    penalty on it live from step 0: (penalty of a hack, of a plain reply) per step."""
    buf = PenaltyBuffer()
    buf.add(candidate(), step=0)
    eng = term(FakeProposer(), RegexJudge(), buf, lam=0.5, weight=weight, every=5)
    out = []
    for step in (1, 2):
        batch = hacked_batch(step=step)
        anyio.run(score, eng, batch)
        eng.observe(batch, None)  # step % every != 0: no proposal starts
        out.append((batch.groups[0][0].scores["penalties"], batch.groups[0][2].scores["penalties"]))
    return out


def test_under_the_pay_rule_a_violation_costs_lam_plus_the_pay_measured_on_the_steps_before():
    # step 1: nothing measured yet, λ; step 2: the RM paid the opener 2.0 - 1.0 in every group at step 1
    assert hack_and_plain_penalties("pay") == [(-0.5, 0.0), (-1.5, 0.0)]


def test_the_fixed_rule_is_the_methods_lam_per_violation():
    assert hack_and_plain_penalties("fixed") == [(-0.5, 0.0), (-0.5, 0.0)]
    assert PenaltiesConfig().weight == "fixed"  # a dynalize run: RM − λ · violations unless told otherwise


def test_the_pay_pools_the_groups_of_the_latest_measured_steps():
    p = Penalty("p001", "t", "d")
    assert measured_pay(p) is None and violation_cost(p, 0.5, "pay") == 0.5
    record_pay(p, 1, [1.0, 0.0], window=2)
    record_pay(p, 2, [], window=2)  # no group had both kinds: no measurement, nothing forgotten
    record_pay(p, 3, [0.5], window=2)
    assert measured_pay(p) == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
    record_pay(p, 4, [-2.0], window=2)  # step 1 leaves the window
    assert measured_pay(p) == pytest.approx(-0.75)
    assert violation_cost(p, 0.5, "pay") == 0.5  # a pattern the reward does not pay costs λ, never less
    assert violation_cost(p, 0.5, "fixed") == 0.5
