"""Rubric rewards and Rubric Dropout, checked like the paper's appendix: the scoring formula by
hand, Proposition 1 (the normaliser cancels under group standardisation), Observation 1 (the
masked advantage's mean and variance over masks), the floor and protected set on every draw,
and masks that depend only on (instance, step)."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dynalize import grpo
from dynalize.rubrics.criteria import (Criterion, RubricError, benchmark_score, check_rubric, masked_sum,
                                       rubric_from_meta, rubric_score)
from dynalize.rubrics.dropout import DropoutSpec, fraction_at, full_mask, keep_mask, mask_seed
from dynalize.rubrics.protocol import Graded, measure
from dynalize.rubrics.reweight import Pow3rReweighter, PortReweighter, contrast, reweigh

ROOT = Path(__file__).resolve().parents[1]


def rubric(*weights: float, tags: dict[int, tuple[str, ...]] | None = None) -> list[Criterion]:
    tags = tags or {}
    return [Criterion(f"c{i}", f"criterion {i}", w, tags.get(i, ())) for i, w in enumerate(weights)]


# --- the reward ---------------------------------------------------------------------------------

def test_rubric_score_is_weighted_met_over_positive_weights():
    crit = rubric(5, 3, -2, 2)
    met = {"c0": True, "c1": False, "c2": True, "c3": True}
    assert rubric_score(crit, met) == pytest.approx((5 - 2 + 2) / (5 + 3 + 2))
    assert rubric_score(crit, {}) == 0.0
    assert rubric_score(crit, {"c2": True}) == pytest.approx(-0.2)  # unclipped per example


def test_masked_score_runs_over_kept_criteria_only():
    crit = rubric(5, 3, -2, 2)
    met = {"c0": True, "c1": False, "c2": True, "c3": True}
    assert rubric_score(crit, met, keep={"c0", "c2", "c3"}) == pytest.approx((5 - 2 + 2) / (5 + 2))
    assert rubric_score(crit, met, keep={"c1", "c2", "c3"}) == pytest.approx((-2 + 2) / (3 + 2))
    assert masked_sum([5, 3, -2, 2], [1, 0, 1, 1], [1, 0, 1, 1]) == 5


def test_benchmark_score_clips_the_mean_not_each_example():
    assert benchmark_score([1.2, -0.5]) == pytest.approx(0.35)
    assert benchmark_score([1.5, 1.0]) == 1.0
    assert benchmark_score([-1.0, 0.2]) == 0.0


def test_a_rubric_without_positive_weight_or_with_repeated_ids_is_refused():
    with pytest.raises(RubricError, match="positive"):
        check_rubric(rubric(-1, -2))
    with pytest.raises(RubricError, match="repeat"):
        check_rubric([Criterion("a", "x", 1), Criterion("a", "y", 2)])
    with pytest.raises(RubricError, match="positive"):
        rubric_score(rubric(3, -1), {"c0": True}, keep={"c1"})
    with pytest.raises(RubricError, match="finite"):
        rubric_from_meta({"rubric": [{"id": "a", "text": "x", "weight": float("nan")}]})


def test_rubric_round_trips_through_meta():
    crit = [Criterion("a", "Names the drug", 5, ("axis:accuracy",), regex=r"\bibuprofen\b"),
            Criterion("b", "Is rude", -3, data={"check": "rude"})]
    back = rubric_from_meta(json.loads(json.dumps({"rubric": [c.to_dict() for c in crit]})))
    assert back == crit


# --- Proposition 1 --------------------------------------------------------------------------------

def _group(rng: random.Random, k: int, g: int) -> tuple[list[float], list[list[int]]]:
    weights = [rng.choice([-3.0, -1.0, 1.0, 2.0, 4.0, 7.0]) for _ in range(k)]
    weights[0] = 5.0  # at least one positive
    met = [[int(rng.random() < 0.5) for _ in range(k)] for _ in range(g)]
    return weights, met


def test_proposition_1_normaliser_cancels_under_group_standardisation():
    """With one mask per group, R̃ = S / Σ_kept w⁺ and S = Σ m w s differ by a constant per group,
    so their group-standardised advantages are equal; mean-only advantages differ by that constant."""
    rng = random.Random(0)
    spec = DropoutSpec(f=0.5, min_keep=2)
    for trial in range(50):
        weights, met = _group(rng, k=9, g=8)
        crit = rubric(*weights)
        mask = keep_mask(crit, spec, f"q{trial}", trial)
        m = [int(c.id in mask.kept) for c in crit]
        normalised = [rubric_score(crit, {c.id: bool(s) for c, s in zip(crit, row)}, keep=mask.kept) for row in met]
        raw = [masked_sum(weights, row, m) for row in met]
        a = grpo.group_advantages(torch.tensor([normalised], dtype=torch.float64), std_normalize=True, eps=0.0)
        b = grpo.group_advantages(torch.tensor([raw], dtype=torch.float64), std_normalize=True, eps=0.0)
        if torch.all(b.isnan()):  # the group's rewards are all equal: no signal either way
            continue
        assert torch.allclose(a, b, atol=1e-9)
        denominator = sum(w for w, keep in zip(weights, m) if keep and w > 0)
        mean_only_a = grpo.group_advantages(torch.tensor([normalised], dtype=torch.float64))
        mean_only_b = grpo.group_advantages(torch.tensor([raw], dtype=torch.float64))
        assert torch.allclose(mean_only_a * denominator, mean_only_b, atol=1e-9)


# --- Observation 1 --------------------------------------------------------------------------------

@pytest.mark.parametrize("f", [0.3, 0.5])
def test_observation_1_mean_and_variance_of_the_masked_advantage_over_masks(f):
    """Ã_i = Σ_k m_k w_k δ_ik with m_k ~ Bernoulli(1 − f) (floor off): E[Ã_i] = (1 − f) A_i and
    Var[Ã_i] = f(1 − f) Σ_k w_k² δ_ik², where δ_ik = s_ik − mean_group(s_k) and A_i is the
    full-rubric un-normalised advantage."""
    rng = random.Random(1)
    weights = [rng.uniform(0.5, 8.0) for _ in range(12)]
    met = [[int(rng.random() < 0.4 + 0.04 * k) for k in range(12)] for _ in range(8)]
    crit = rubric(*weights)
    spec = DropoutSpec(f=f, min_keep=0)
    means = [statistics.fmean(row[k] for row in met) for k in range(12)]
    delta = [[row[k] - means[k] for k in range(12)] for row in met]
    full = [sum(w * d for w, d in zip(weights, di)) for di in delta]
    n = 6000
    draws: list[list[float]] = [[] for _ in met]
    for j in range(n):
        mask = keep_mask(crit, spec, f"instance-{j % 97}", j)
        m = [c.id in mask.kept for c in crit]
        for i, di in enumerate(delta):
            draws[i].append(sum(w * d for w, d, keep in zip(weights, di, m) if keep))
    for i, di in enumerate(delta):
        predicted_var = f * (1 - f) * sum(w * w * d * d for w, d in zip(weights, di))
        mean, var = statistics.fmean(draws[i]), statistics.pvariance(draws[i])
        assert mean == pytest.approx((1 - f) * full[i], abs=4 * math.sqrt(predicted_var / n) + 1e-9)
        assert var == pytest.approx(predicted_var, rel=0.08, abs=1e-9)
    # the group's advantages, averaged over masks, point the same way as the full rubric's
    avg = [statistics.fmean(d) for d in draws]
    assert statistics.correlation(avg, full) > 0.999


# --- the floor, the protected set, determinism -----------------------------------------------------

def test_floor_protected_and_negative_criteria_hold_on_every_draw():
    rng = random.Random(2)
    binds = 0
    for trial in range(3000):
        k = rng.randint(1, 12)
        weights = [rng.choice([-4.0, -1.0, 1.0, 3.0, 6.0]) for _ in range(k)]
        weights[rng.randrange(k)] = 2.0
        tags = {i: ("safety",) for i in range(k) if rng.random() < 0.15}
        crit = rubric(*weights, tags=tags)
        spec = DropoutSpec(f=rng.choice([0.2, 0.5, 0.9, 0.99]), min_keep=rng.randint(1, 4),
                           protected_tags=frozenset({"safety"}), protected_ids=frozenset({"c1"}))
        mask = keep_mask(crit, spec, f"i{trial}", trial)
        positives = [c for c in crit if c.weight > 0]
        kept_pos = [c for c in positives if c.id in mask.kept]
        assert all(c.id in mask.kept for c in crit if c.weight <= 0)
        assert all(c.id in mask.kept for c in crit if "safety" in c.tags or c.id == "c1")
        assert len(kept_pos) >= min(spec.min_keep, len(positives))
        assert mask.kept_positives == len(kept_pos) and mask.positives == len(positives)
        if len(positives) <= spec.min_keep:
            assert len(kept_pos) == len(positives)  # all kept when the rubric has fewer
        binds += mask.floor_binds
    assert binds > 100  # the floor did bind, and held


def test_masks_depend_only_on_instance_and_step_in_any_order():
    crit = rubric(*[float(w) for w in range(1, 16)])
    spec = DropoutSpec(f=0.5)
    pairs = [(f"q{i}", s) for i in range(20) for s in range(5)]
    forward = {p: keep_mask(crit, spec, *p).kept for p in pairs}
    backward = {p: keep_mask(crit, spec, *p).kept for p in reversed(pairs)}
    assert forward == backward
    assert len({forward[p] for p in pairs}) > 50  # masks do vary across instances and steps
    assert mask_seed("q1", 2) != mask_seed("q12", 0)  # no collision from naive concatenation


def test_masks_are_identical_across_processes():
    code = (
        "import json\n"
        "from dynalize.rubrics.criteria import Criterion\n"
        "from dynalize.rubrics.dropout import DropoutSpec, keep_mask\n"
        "crit = [Criterion(f'c{i}', 'x', float(i + 1)) for i in range(15)]\n"
        "spec = DropoutSpec(f=0.5)\n"
        "print(json.dumps([sorted(keep_mask(crit, spec, f'q{i}', s).kept) for i in range(20) for s in range(5)]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    crit = [Criterion(f"c{i}", "x", float(i + 1)) for i in range(15)]
    here = [sorted(keep_mask(crit, DropoutSpec(f=0.5), f"q{i}", s).kept) for i in range(20) for s in range(5)]
    assert json.loads(out.stdout) == here


def test_zero_fraction_keeps_the_full_rubric():
    crit = rubric(3, 2, -1, 5)
    assert keep_mask(crit, DropoutSpec(f=0.0), "q", 7).kept == full_mask(crit).kept


def test_per_tag_and_per_id_rates_and_annealing():
    crit = rubric(1, 1, 1, 1, 1, 1, tags={0: ("axis:accuracy",), 1: ("axis:accuracy", "rare")})
    spec = DropoutSpec(f=0.5, min_keep=1, tag_rates={"axis:accuracy": 0.0, "rare": 0.9}, id_rates={"c5": 1.0})
    assert spec.rate_of(crit[0]) == 0.0 and spec.rate_of(crit[1]) == 0.0  # the lowest tag rate
    assert spec.rate_of(crit[2]) == 0.5 and spec.rate_of(crit[5]) == 1.0
    assert spec.rate_of(crit[2], scale=0.5) == 0.25 and spec.rate_of(crit[5], scale=0.5) == 0.5
    for s in range(200):
        kept = keep_mask(crit, spec, "q", s).kept
        assert {"c0", "c1"} <= kept and "c5" not in kept
    assert fraction_at(0.4, 50, "constant") == 0.4
    assert fraction_at(0.4, 25, "linear", 100) == pytest.approx(0.3)
    assert fraction_at(0.4, 150, "linear", 100) == 0.0
    assert fraction_at(0.4, 50, "cosine", 100) == pytest.approx(0.2)
    assert fraction_at(0.4, 0, "cosine", 100) == pytest.approx(0.4)


# --- POW3R-style reweighting --------------------------------------------------------------------------

def test_contrast_is_highest_at_an_even_split_and_zero_when_saturated_or_unreachable():
    met = [{"a": True, "b": True, "c": False}, {"a": False, "b": True, "c": False}]
    assert contrast(met, ["a", "b", "c"]) == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_port_reweighter_applies_this_groups_contrast_and_keeps_the_positive_total():
    crit = rubric(4, 4, 2, -3)
    met = [{"c0": True, "c1": True, "c2": True}, {"c0": False, "c1": True, "c2": False}]
    w = PortReweighter(min_factor=0.1).weights("q", crit, met)
    # factors: c0 even split → 1, c1 saturated → 0.1, c2 even split → 1; raw 4, 0.4, 2 → ×10/6.4
    assert w["c0"] == pytest.approx(4 * 10 / 6.4) and w["c1"] == pytest.approx(0.4 * 10 / 6.4)
    assert w["c2"] == pytest.approx(2 * 10 / 6.4) and w["c3"] == -3
    assert sum(v for v in w.values() if v > 0) == pytest.approx(10)


def test_pow3r_lags_one_visit_smooths_and_balances_within_categories():
    crit = rubric(4, 4, 2, 2, tags={0: ("axis:a",), 1: ("axis:a",), 2: ("axis:b",), 3: ("axis:b",)})
    met = [{"c0": True, "c1": False, "c2": True, "c3": False},
           {"c0": False, "c1": False, "c2": True, "c3": False}]  # c0 splits; c1 never; c2 always; c3 never
    r = Pow3rReweighter(min_factor=0.1, ema=0.5, category_prefix="axis:")
    first = r.weights("q", crit, met)
    assert first == {c.id: c.weight for c in crit}  # first visit: human weights (lag)
    second = r.weights("q", crit, met)
    phi = {"c0": 0.5 + 0.5 * 1.0, "c1": 0.5 + 0.5 * 0.1, "c2": 0.5 + 0.5 * 0.1, "c3": 0.5 + 0.5 * 0.1}
    a = 4 * phi["c0"] + 4 * phi["c1"]
    assert second["c0"] == pytest.approx(4 * phi["c0"] * 8 / a)
    assert second["c0"] + second["c1"] == pytest.approx(8)  # category a keeps its human total
    assert second["c2"] + second["c3"] == pytest.approx(4)  # and so does b
    assert r.weights("other", crit, met) == {c.id: c.weight for c in crit}  # per instance
    clone = Pow3rReweighter(min_factor=0.1, ema=0.5, category_prefix="axis:")
    clone.load_state_dict(json.loads(json.dumps(r.state_dict())))
    assert clone.weights("q", crit, met) == pytest.approx(r.weights("q", crit, met))


def test_pow3r_state_round_trips_exactly_so_a_resume_continues_bit_for_bit():
    crit = rubric(4, 3, 2)
    met = [{"c0": True, "c1": True, "c2": False}, {"c0": False, "c1": True, "c2": False},
           {"c0": False, "c1": False, "c2": True}]  # shares 1/3, 2/3, 1/3: factors with many digits
    r = Pow3rReweighter(min_factor=0.15, ema=0.9)
    for _ in range(3):
        r.weights("q", crit, met)
    clone = Pow3rReweighter(min_factor=0.15, ema=0.9)
    clone.load_state_dict(json.loads(json.dumps(r.state_dict())))  # what a checkpoint keeps
    assert clone.smoothed == r.smoothed
    for _ in range(3):
        assert clone.weights("q", crit, met) == r.weights("q", crit, met)  # equal, not approximately


def test_a_criterion_no_reply_was_asked_about_has_no_contrast_and_keeps_its_factor():
    assert contrast([{"a": True}, {"a": False}], ["a", "b"]) == {"a": 1.0}  # b: unasked, not unmet
    crit = rubric(4, 4)
    r = Pow3rReweighter(min_factor=0.1, ema=0.5)
    for _ in range(5):  # c0 splits its group evenly; c1 is dropped and never asked about
        r.weights("q", crit, [{"c0": True}, {"c0": False}], keep={"c0"})
    assert r.smoothed["q"] == {"c0": 1.0}


def test_kept_criteria_whose_factors_all_vanish_get_human_weights_under_dropout():
    crit = rubric(4, 3, 2, -1)
    met = [{"c0": True, "c1": True, "c2": True, "c3": False},
           {"c0": True, "c1": False, "c2": False, "c3": False}]  # kept c0 saturated; dropped c1, c2 split
    keep = {"c0", "c3"}
    for reweighter in (PortReweighter(min_factor=0.0), Pow3rReweighter(min_factor=0.0, ema=0.0)):
        for _ in range(2):  # the full form's second visit uses the first visit's factors
            w = reweighter.weights("q", crit, met, keep)
        assert w["c0"] == 4 and w["c3"] == -1
        assert rubric_score(crit, met[0], keep, w) == 1.0  # defined: no RubricError
    # with every criterion kept, the rescaling runs over the whole rubric as before
    w = PortReweighter(min_factor=0.0).weights("q", crit, met)
    assert w["c0"] == 0 and w["c1"] + w["c2"] == pytest.approx(9)


def test_reweigh_leaves_pitfalls_and_falls_back_to_human_weights_when_all_factors_vanish():
    crit = rubric(3, 1, -2)
    assert reweigh(crit, {"c0": 0.0, "c1": 0.0}) == {"c0": 3, "c1": 1, "c2": -2}


# --- the measurement ---------------------------------------------------------------------------------

def test_measure_counts_overclaim_missed_pitfalls_and_leaves_failed_replies_out():
    crit = rubric(4, 2, -2, tags={0: ("axis:x",), 2: ("axis:x",)})
    graded = [
        Graded(crit, proxy={"c0": True, "c1": True}, gold={"c0": True, "c2": True}),
        Graded(crit, proxy={"c0": True}, gold={}),
        Graded(crit, proxy={}, gold={}, failed={"c1"}),
    ]
    m = measure(graded)
    assert m["unscored"] == 1 and m["replies"] == 3
    assert m["proxy"] == pytest.approx((1.0 + 4 / 6) / 2)
    assert m["gold"] == pytest.approx(((4 - 2) / 6 + 0.0) / 2)
    assert m["gap"] == pytest.approx(m["proxy"] - m["gold"])
    assert m["overclaim"] == pytest.approx(2 / 3)  # c1 in reply 1, c0 in reply 2: 2 of 3 claims
    assert m["missed_pitfalls"] == 1.0
    assert m["proxy_met/c0"] == 1.0 and m["gold_met/c0"] == 0.5
    assert m["gold_met/tag:axis:x"] == 0.5 and m["proxy_met/tag:axis:x"] == 0.5
    assert "proxy_met/c0" not in measure(graded, per_criterion_limit=2)
