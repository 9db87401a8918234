"""The proposal's permutation count is sequential (penalties.sequential): a proposal whose strongest
candidate many permutations already reach stops early, and every decision is the fixed count's."""

from __future__ import annotations

import random

import numpy as np
import pytest

import dynalize.penalties.discovery as discovery
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.permutation import indicator, standardised, step_down, within_permutations
from dynalize.penalties.views import ProposerView, ViewSample

WORDS = [f"w{i}" for i in range(60)]


def view(paid: float, seed: int = 0) -> ProposerView:
    """16 groups x 8 replies of random words; "Certainly!" opens half of them, paid `paid`."""
    rng = random.Random(seed)
    samples = []
    for g in range(16):
        for i in range(8):
            hack = i % 2 == 0
            text = ("Certainly! " if hack else "") + " ".join(rng.choice(WORDS) for _ in range(12)) + "."
            score = rng.gauss(0, 1) + (paid if hack else 0.0)
            samples.append(ViewSample(f"s{len(samples)}", g, text, score, "+" if score > 0 else "-"))
    return ProposerView(5, samples)


def permutations_run(monkeypatch) -> list[int]:
    """The permutations each call of the within-group null computes, recorded."""
    counted: list[int] = []
    wrapped = discovery.standardised

    def counting(x, y, groups, perms):
        counted.append(len(perms))
        return wrapped(x, y, groups, perms)

    monkeypatch.setattr(discovery, "standardised", counting)
    return counted


def test_a_proposal_stops_early_when_nothing_is_paid_and_runs_every_permutation_when_something_is(monkeypatch):
    counted = permutations_run(monkeypatch)
    cfg = LexicalConfig(length=False)
    assert LexicalProposer(cfg).best(view(paid=0.0)) is None
    assert counted and sum(counted) <= cfg.permutations // 2, counted
    counted.clear()
    found = LexicalProposer(cfg).best(view(paid=2.0))
    assert found is not None and "Certainly" in found.title
    assert sum(counted) == cfg.permutations


@pytest.mark.parametrize("seed", range(12))
def test_the_sequential_null_passes_exactly_what_the_full_one_passes(seed):
    from dynalize.penalties.sequential import sequential_null

    rng = np.random.default_rng(seed)
    n_groups, per, k, total = 12, 8, 40, 500
    groups = np.repeat(np.arange(n_groups), per)
    rows = [sorted(rng.choice(len(groups), size=int(rng.integers(6, 40)), replace=False).tolist()) for _ in range(k)]
    x = indicator(rows, len(groups))
    paid = np.zeros(len(groups))
    paid[rows[0]] = [0.0, 0.6, 1.2][seed % 3]  # none, a weak or a strong pay for the first candidate
    y = rng.normal(size=len(groups)) + paid
    perms = within_permutations(groups, total, seed)
    alpha = [0.05, 0.0125, 0.002][seed // 3 % 3]

    def nulls(lo, hi):
        return standardised(x, y, groups, perms[lo:hi])

    z_full, null_full = nulls(0, total)
    z, null = sequential_null(nulls, total, [(np.arange(k), alpha)])
    assert np.array_equal(z, z_full, equal_nan=True)
    assert null.shape[1] in (100, total)
    assert np.array_equal(step_down(z, null, alpha).passes(alpha), step_down(z_full, null_full, alpha).passes(alpha))
    if null.shape[1] == total:
        assert np.array_equal(null, null_full)
