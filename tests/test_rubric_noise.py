"""The noise control (`rubric.noise`): the fixed rubric's reward plus zero-mean noise with the
variance Rubric Dropout injects (Observation 1), seeded per group like the masks."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from dynalize.rewards import score_batch
from dynalize.rubrics.config import RubricConfig
from dynalize.rubrics.criteria import Criterion, rubric_score
from dynalize.rubrics.dropout import DropoutSpec, keep_mask
from dynalize.rubrics.noise import dropout_std, group_noise, noise_seed

from test_rubric_term import RUBRIC, batch, make_term, mentions

ROOT = Path(__file__).resolve().parents[1]


def _group(seed: int = 1, k: int = 10, g: int = 8):
    rng = random.Random(seed)
    crit = [Criterion(f"c{i}", f"criterion {i}", rng.uniform(0.5, 8.0)) for i in range(k)]
    crit.append(Criterion("pit", "a pitfall", -3.0))
    rows = [[{c.id: rng.random() < 0.3 + 0.05 * i for i, c in enumerate(crit)}] for _ in range(g)]
    return crit, rows


@pytest.mark.parametrize("f", [0.3, 0.5])
def test_noise_variance_per_rollout_is_dropouts_variance_over_many_draws(f):
    """Var[ε_i] = f(1 − f) Σ_{w>0} w_k² δ_ik² / W², which is also the variance of the masked sum
    Σ m_k w_k δ_ik / W over Bernoulli masks: the control injects what dropout injects."""
    crit, rows = _group()
    pos = [c for c in crit if c.weight > 0]
    total = sum(c.weight for c in pos)
    means = {c.id: statistics.fmean(r[0][c.id] for r in rows) for c in pos}
    predicted = [f * (1 - f) * sum(c.weight ** 2 * (r[0][c.id] - means[c.id]) ** 2 for c in pos) / total ** 2
                 for r in rows]
    stds = dropout_std(crit, rows, f)
    assert [s * s for s in stds] == pytest.approx(predicted, rel=1e-12)
    n = 6000
    draws = [group_noise(f"instance-{j % 97}", j, stds) for j in range(n)]
    spec = DropoutSpec(f=f, min_keep=0)
    masked = []
    for j in range(n):
        kept = keep_mask(crit, spec, f"m{j}", j).kept
        masked.append([sum(c.weight * (r[0][c.id] - means[c.id]) for c in pos if c.id in kept) / total for r in rows])
    for i, var in enumerate(predicted):
        eps = [d[i] for d in draws]
        assert statistics.fmean(eps) == pytest.approx(0.0, abs=4 * math.sqrt(var / n) + 1e-12)
        assert statistics.pvariance(eps) == pytest.approx(var, rel=0.08, abs=1e-12)
        assert statistics.pvariance([m[i] for m in masked]) == pytest.approx(var, rel=0.08, abs=1e-12)


def test_no_noise_where_the_group_agrees_or_a_verdict_failed():
    crit, rows = _group()
    same = [rows[0]] * 5
    assert dropout_std(crit, same, 0.5) == [0.0] * 5
    stds = dropout_std(crit, [rows[0], None, rows[1]], 0.5)
    assert stds[1] == 0.0 and stds[0] > 0
    assert dropout_std(crit, rows, 0.0) == [0.0] * len(rows)


def test_noise_depends_only_on_instance_and_step_in_any_order_and_process():
    stds = [0.1, 0.2, 0.0, 0.3]
    pairs = [(f"q{i}", s) for i in range(10) for s in range(4)]
    forward = {p: group_noise(*p, stds) for p in pairs}
    assert {p: group_noise(*p, stds) for p in reversed(pairs)} == forward
    assert len({tuple(v) for v in forward.values()}) == len(pairs)
    assert noise_seed("q1", 2) != noise_seed("q12", 0)
    code = ("import json\nfrom dynalize.rubrics.noise import group_noise\n"
            f"print(json.dumps([group_noise(f'q{{i}}', s, {stds!r}) for i in range(10) for s in range(4)]))\n")
    env = {**os.environ, "PYTHONHASHSEED": "4321", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == [forward[p] for p in pairs]


def test_noise_control_term_adds_the_noise_to_the_full_rubric_reward_and_logs_its_std():
    term = make_term(noise={"f": 0.5})
    b = batch(n_groups=8)
    anyio.run(score_batch, [term], b)
    noisy = 0
    for g in b.groups:
        verdicts = [[r.info["rubric_verdicts"][0]] for r in g]
        expected = group_noise(g[0].prompt_id, b.step, dropout_std(RUBRIC, verdicts, 0.5))
        for r, eps in zip(g, expected):
            met = {c.id: mentions(r.replies[0], c, None) for c in RUBRIC}
            assert r.info["rubric_dropped"] == []  # nothing dropped: the fixed rubric plus noise
            assert r.info["rubric_noise"] == pytest.approx(eps)
            assert r.scores["rubric"] == pytest.approx(rubric_score(RUBRIC, met) + eps)
            noisy += eps != 0
    assert noisy > 0
    m = term.metrics()
    assert m["rubric/noise_std"] > 0 and m["rubric/masked"] == pytest.approx(m["rubric/full"])
    # another term, the groups in another order: the same rewards (resume and batch order are exact)
    again = batch(n_groups=8)
    again.groups.reverse()
    anyio.run(score_batch, [make_term(noise={"f": 0.5})], again)
    assert {r.prompt_id + str(i): r.scores["rubric"] for g in b.groups for i, r in enumerate(g)} == \
        pytest.approx({r.prompt_id + str(i): r.scores["rubric"] for g in again.groups for i, r in enumerate(g)})
    plain = make_term()
    anyio.run(score_batch, [plain], c := batch(n_groups=2))
    assert "rubric/noise_std" not in plain.metrics() and "rubric_noise" not in c.rollouts[0].info


def test_noise_fraction_must_be_a_probability_below_one():
    with pytest.raises(ValidationError):
        RubricConfig(noise={"f": 1.0})
    with pytest.raises(ValidationError):
        RubricConfig(noise={"f": -0.1})


@pytest.mark.slow
def test_a_resumed_noise_control_run_draws_the_same_noise_and_rewards(tmp_path):
    """4 steps straight against 2 steps, then a resume to 4: step 3's noise and rewards are equal."""
    from dynalize.config import load_config
    from dynalize.run import train
    from dynalize.runlog import read_jsonl

    from test_rubric_e2e import world_overrides

    config = ROOT / "configs" / "rubric_world.yaml"
    extra = ["checkpoint_every=2", "rubric.noise.f=0.5"]
    anyio.run(train, load_config(config, world_overrides(tmp_path, "a") + extra + ["steps=4"]), False, "test")
    anyio.run(train, load_config(config, world_overrides(tmp_path, "b") + extra + ["steps=2"]), False, "test")
    anyio.run(train, load_config(tmp_path / "b" / "config.yaml", ["steps=4"]), True, "test")
    straight = read_jsonl(tmp_path / "a" / "rollouts" / "step_000003.jsonl")
    resumed = read_jsonl(tmp_path / "b" / "rollouts" / "step_000003.jsonl")
    assert any(r["rubric_noise"] != 0 for r in straight)
    assert [r["rubric_noise"] for r in resumed] == pytest.approx([r["rubric_noise"] for r in straight])
    assert [r["reward"] for r in resumed] == pytest.approx([r["reward"] for r in straight])
