"""The gold frontier (dynalize/analysis/frontier.py) on synthetic evaluations whose answer is known:
an arm that moves along the fixed rubric's trade-off more slowly lies on it, one shifted up lies
above, one shifted down below, and the verdict and sentences follow the numbers."""

from __future__ import annotations

import random

import pytest

from dynalize.analysis.frontier import compare, frontier_rows, frontiers, plot, reading, reference_curve, sentences


def curve(seed: int, speed: float, shift: float = 0.0, noise: float = 0.004) -> dict[str, list[float]]:
    """Overclaim rising at `speed` per step; gold on the line 0.5 − 0.6 (overclaim − 0.1), plus `shift`
    after step 0; proxy rising with overclaim."""
    rng = random.Random(seed * 1000 + int(speed * 1e4) + int(shift * 1e3))
    steps = list(range(0, 101, 10))
    over = [0.1 + speed * s + (rng.gauss(0, 0.003) if s else 0) for s in steps]
    gold = [0.5 - 0.6 * (o - 0.1) + (shift if s else 0.0) + (rng.gauss(0, noise) if s else 0) for s, o in zip(steps, over)]
    proxy = [0.5 + 0.7 * (o - 0.1) for o in over]
    return {"steps": steps, "overclaim": over, "gold": gold, "proxy": proxy}


ARMS = {
    "base": [curve(s, 0.004) for s in range(3)],
    "slow": [curve(s, 0.0025) for s in range(3)],
    "above": [curve(s, 0.0025, shift=0.05) for s in range(3)],
    "below": [curve(s, 0.0025, shift=-0.05) for s in range(3)],
}


def test_a_slower_arm_on_the_same_trade_off_lies_on_the_frontier():
    f = compare("slow", ARMS["slow"], ARMS["base"], "overclaim")
    assert f.verdict == "on it" and f.lo < 0 < f.hi and abs(f.diff) < 0.01
    assert f.points == 30 and f.outside == 0


def test_an_arm_shifted_up_lies_above_and_one_shifted_down_below():
    up = compare("above", ARMS["above"], ARMS["base"], "overclaim")
    assert up.verdict == "above" and up.diff == pytest.approx(0.05, abs=0.01) and up.lo > 0
    down = compare("below", ARMS["below"], ARMS["base"], "proxy")
    assert down.verdict == "below" and down.diff == pytest.approx(-0.05, abs=0.01) and down.hi < 0


def test_checkpoints_outside_the_reference_range_are_counted_not_extrapolated():
    far = [curve(s, 0.008) for s in range(3)]  # overclaim up to 0.9, the reference only to ~0.5
    f = compare("far", far, ARMS["base"], "overclaim")
    assert f.outside > 0 and f.points + f.outside == 30
    xs, ys = reference_curve(ARMS["base"], "overclaim")
    assert list(xs) == sorted(xs) and len(xs) == len(ys)


def test_one_seed_gives_no_spread_and_no_verdict():
    f = compare("above", ARMS["above"][:1], ARMS["base"][:1], "overclaim")
    assert f.verdict == "n/a" and f.lo != f.lo and f.diff == pytest.approx(0.05, abs=0.015)
    assert "no spread" in sentences([f])[0]


def test_sentences_table_and_reading_come_from_the_numbers(tmp_path):
    results = frontiers(ARMS, "base")
    assert {(f.arm, f.axis) for f in results} == {(a, x) for a in ("slow", "above", "below") for x in ("overclaim", "proxy")}
    text = sentences(results, {"slow": "dropout f=0.3"})
    slow = next(s for s, f in zip(text, results) if f.arm == "slow" and f.axis == "overclaim")
    f = next(f for f in results if f.arm == "slow" and f.axis == "overclaim")
    assert slow.startswith("dropout f=0.3 lies on the fixed rubric's frontier at matched overclaim")
    assert f"{f.diff:+.3f}" in slow and f"{f.lo:+.3f}" in slow
    header, body = frontier_rows(results)
    assert len(body) == 6 and body[0][-1] == next(x for x in results).verdict
    assert "only slower" in reading(results, ["slow"])
    assert "better" in reading(results, ["slow", "above"]) and "above" in reading(results, ["slow", "above"])
    assert "worse" in reading(results, ["slow", "below"]) and "only slower" not in reading(results, ["below"])
    assert reading(results, ["missing"]).startswith("No reading")
    assert plot(ARMS, tmp_path / "frontier.png").stat().st_size > 1000
