"""The omnibus test (issue 56 point 1): where the reward pays for the replies' form in a way no
named candidate describes, the proposal, the monitor and the run summary say so, never "all clear"."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from scipy import sparse

from dynalize.grpo import advantages
from dynalize.monitor.summary import INSUFFICIENT_EXIT, LIVE_EXIT, UNNAMED_EXIT, exit_status, last_evidence, verdict
from dynalize.penalties.candidate import ProposalResult
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.omnibus import (form_features, gram, held_out_covariance, kernel_held_out_covariance, omnibus,
                                       spectral_features)
from dynalize.penalties.views import ProposerView, ViewSample, advantage_sign
from dynalize.summary import discovery_evidence

VOCAB = ("river stone lamp garden window quiet letter morning engine harbor paper winter orchard "
         "candle bridge market silver thunder meadow violin ladder cotton marble pepper kettle").split()


def struck(words: list[str], rng: random.Random) -> list[str]:
    """A random word of the reply struck through (markdown `~~`): a form that no word and no form
    of penalties.forms names."""
    i = rng.randrange(len(words))
    return words[:i] + [f"~~{words[i]}~~"] + words[i + 1:]


def bracketed(words: list[str], rng: random.Random) -> list[str]:
    """A random word of the reply in square brackets."""
    i = rng.randrange(len(words))
    return words[:i] + [f"[{words[i]}]"] + words[i + 1:]


def samples(groups: int, seed: int, pay: float, mark=struck, rate: float = 0.5, per_group: int = 8):
    rng = random.Random(seed)
    texts, scores = [], []
    for _ in range(groups):
        gt, gs = [], []
        for _ in range(per_group):
            words = [rng.choice(VOCAB) for _ in range(rng.randint(8, 20))]
            marked = rng.random() < rate
            text = " ".join(mark(words, rng) if marked else words)
            gt.append(text[0].upper() + text[1:] + ".")
            gs.append(rng.gauss(0, 1) + pay * marked)
        texts.append(gt)
        scores.append(gs)
    out = []
    for g, (gt, gs, ga) in enumerate(zip(texts, scores, advantages(scores))):
        for t, sc, a in zip(gt, gs, ga):
            out.append(ViewSample(f"s{len(out):04d}", g, t, sc, advantage_sign(a)))
    return out


def propose(view_samples):
    result = ProposalResult(step=5)
    c = LexicalProposer(LexicalConfig()).best(ProposerView(5, view_samples), result)
    return c, result


def test_a_reward_paid_for_a_form_no_pattern_names_is_reported_as_unnamed_pay():
    # strikethrough or brackets on a different word each time: no word, opener, closer or form carries it
    for mark in (struck, bracketed):
        c, result = propose(samples(32, 0, 1.0, mark))
        assert c is None, c.title
        assert result.unnamed, (mark.__name__, result)
        assert result.evidence == "sufficient"


def test_the_omnibus_test_is_quiet_where_the_reward_pays_for_no_form():
    passed = 0
    for seed in range(20):
        s = samples(16, seed, 0.0)
        o = omnibus([x.text for x in s], np.array([x.score for x in s]), np.array([x.group for x in s]),
                    0.05, 200, seed)
        passed += o.passed
    assert passed <= 3, passed  # 1 expected at 0.05; 3 of 20 is beyond a 5 % rate's 92nd percentile


def test_the_omnibus_test_names_the_features_that_carry_the_fit():
    s = samples(16, 1, 1.5)
    o = omnibus([x.text for x in s], np.array([x.score for x in s]), np.array([x.group for x in s]), 0.01, 200, 1)
    assert o.passed and any("~" in name for name in o.carriers), o


def test_form_features_keep_capitals_symbols_markup_and_lines():
    f = form_features("## Title\n- ONE item ✨\n- two **bold** items?\n\nThanks!")
    assert "ONE" in f["words"] and "one" in f["words"] and "^##" not in f["words"]
    assert "XX" in f["shapes"] and "✨" in f["shapes"]
    assert any(k.startswith("line starts -") for k in f["lines"]) and f["lines"]["non-ASCII symbols"] > 0
    assert f["lines"]["paragraphs"] > f["lines"]["questions"] > 0


def test_the_monitor_exits_unnamed_not_all_clear_when_only_the_omnibus_passed(tmp_path):
    rows = [{"step": 5, "state": "sufficient", "reason": "", "detectable": 0.9},
            {"step": 10, "state": "sufficient", "reason": "", "detectable": 0.9,
             "unnamed": ["words: '*'", "shapes: 'XXXX'"]}]
    (tmp_path / "evidence.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evidence = last_evidence(tmp_path)
    assert exit_status([], evidence) == UNNAMED_EXIT not in (0, LIVE_EXIT, INSUFFICIENT_EXIT)
    said = verdict(10, [], evidence)
    assert "pays for something in the replies' form that no pattern names yet" in said and "'*'" in said


def test_the_run_summary_says_unnamed_pay():
    line = discovery_evidence({"proposer/finished_total": 4, "proposer/failed_total": 0,
                               "proposer/insufficient_total": 0, "proposer/unnamed_total": 2})
    assert "no pattern names yet" in line and "2 of 4" in line


@pytest.mark.slow
def test_the_monitor_says_unnamed_pay_on_a_run_paid_for_struck_words(tmp_path):
    # a logged run whose reward pays for striking any word through: no named pattern, exit 12 and the sentence
    from dynalize.monitor.__main__ import main

    rows = []
    for step in range(1, 11):
        for s in samples(16, step, 1.5):
            rows.append({"step": step, "group": s.group, "prompt": f"Write about topic {s.group}.",
                         "completion": s.text, "reward": s.score})
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(path), "--out", str(tmp_path / "watch"), "--no-html"]) == UNNAMED_EXIT
    summary = json.loads((tmp_path / "watch" / "summary.json").read_text())
    assert not summary["patterns"] and "no pattern names yet" in summary["verdict"], summary["verdict"]


def test_the_fit_features_reproduce_the_kernel_whole_and_its_top_directions_past_the_size():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 40))
    kernel = x @ x.T  # rank 40
    whole = spectral_features(kernel, None, seed=1)
    assert np.allclose(whole @ whole.T, kernel)
    top = spectral_features(kernel, 60, seed=1)  # a rank above the kernel's: the approximation is exact
    assert top.shape[1] <= 60 and np.allclose(top @ top.T, kernel)
    low = spectral_features(kernel, 10, seed=1)
    values = np.linalg.eigvalsh(kernel)
    assert np.isclose(np.linalg.norm(kernel - low @ low.T, 2), values[-11], rtol=0.05)  # the best rank 10


def test_the_fit_on_the_kernel_whole_gives_the_held_out_covariances_of_the_fit_on_its_features():
    # the kernel whole is fitted on directly (no features): the same ridge predictions, so the same statistic
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 200))  # more directions than training replies: the kernel's form is smaller
    kernel = x @ x.T
    ys = rng.standard_normal((7, 120))
    test = np.zeros(120, dtype=bool)
    test[rng.choice(120, 30, replace=False)] = True
    ridges = [0.1, 1.0, 10.0]
    direct = kernel_held_out_covariance(kernel, ys, ~test, test, ridges)
    assert direct.shape == (3, 7)
    assert np.allclose(direct, held_out_covariance(x, ys, ~test, test, ridges), rtol=1e-8, atol=1e-8)
    assert not np.allclose(direct, held_out_covariance(x, ys, ~test, test, [1.0, 10.0, 100.0]))


def test_gram_is_the_exact_product_with_common_and_rare_columns():
    rng = np.random.default_rng(2)
    dense = (rng.random((200, 50)) < np.linspace(0.01, 0.9, 50)) * rng.integers(1, 30, (200, 50))
    x = sparse.csr_matrix(dense.astype(float))
    assert np.array_equal(gram(x), dense @ dense.T)


def test_past_its_whole_size_the_omnibus_still_finds_form_pay_and_stays_quiet_without_it():
    # 256 replies on 64 of the kernel's directions: the approximated fit keeps the test's power and level
    for mark in (struck, bracketed):
        s = samples(32, 3, 1.0, mark)
        o = omnibus([x.text for x in s], np.array([x.score for x in s]), np.array([x.group for x in s]), 0.01, 200, 1,
                    whole_up_to=64, rank=64)
        assert o.passed and any(ch in name for name in o.carriers for ch in "~["), (mark.__name__, o)
    quiet = [omnibus([x.text for x in s], np.array([x.score for x in s]), np.array([x.group for x in s]), 0.05, 200,
                     seed, whole_up_to=64, rank=64).passed for seed in range(6) for s in [samples(32, 10 + seed, 0.0)]]
    assert sum(quiet) <= 1, quiet


def test_past_most_replies_the_omnibus_reads_a_seeded_draw_of_whole_groups_and_keeps_its_power_and_level():
    from dynalize.penalties.permutation import whole_groups
    groups = np.repeat(np.arange(40), 8)
    kept = whole_groups(groups, 100, "omnibus-draw:3")
    assert len(kept) == 96 and all(np.sum(groups[kept] == g) == 8 for g in np.unique(groups[kept]))
    assert np.array_equal(kept, whole_groups(groups, 100, "omnibus-draw:3"))
    assert not np.array_equal(kept, whole_groups(groups, 100, "omnibus-draw:4"))

    def run(s, alpha, seed):
        return omnibus([x.text for x in s], np.array([x.score for x in s]), np.array([x.group for x in s]), alpha,
                       200, seed, most=128)
    for mark in (struck, bracketed):  # 512 replies, 128 of them read
        o = run(samples(64, 3, 1.0, mark), 0.01, 1)
        assert o.passed and o.replies == 128 and any(ch in name for name in o.carriers for ch in "~["), o
    quiet = [run(samples(64, 10 + seed, 0.0), 0.05, seed) for seed in range(6)]
    assert sum(o.passed for o in quiet) <= 1 and {o.replies for o in quiet} == {128}, quiet


def test_evidence_records_how_many_of_the_views_replies_the_omnibus_read(tmp_path, monkeypatch):
    # past its size the omnibus reads a draw of whole groups: evidence.jsonl says how many of how many
    import functools

    import dynalize.penalties.discovery as discovery
    from dynalize.monitor.__main__ import main
    from test_monitor import hacked_rows, write_jsonl

    monkeypatch.setattr(discovery, "omnibus", functools.partial(omnibus, most=96))
    path = write_jsonl(tmp_path / "r.jsonl", hacked_rows(12))  # 8 prompts x 6 replies a step
    main([str(path), "--out", str(tmp_path / "watch"), "--no-html"])
    read = [r["omnibus"] for r in map(json.loads, (tmp_path / "watch" / "evidence.jsonl").read_text().splitlines())
            if "omnibus" in r]
    assert read and all(0 < o["replies"] <= 96 and o["replies"] % 6 == 0 < o["p"] <= 1 for o in read), read
    assert max(o["of"] for o in read) > 96 and all(o["of"] >= o["replies"] for o in read)
