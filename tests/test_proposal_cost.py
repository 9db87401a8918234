"""What a lexical proposal builds and what the monitor-scale benchmark prints: a pattern (its
regex) is built only for the n-grams that enough groups show to be tested, and the benchmark's
smallest size produces its table with the planted shortcut found and the control left alone."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dynalize.penalties.surface as surface
from dynalize.penalties.config import LexicalConfig
from dynalize.penalties.lexical import LexicalProposer
from dynalize.penalties.views import ProposerView, ViewSample

ROOT = Path(__file__).resolve().parents[1]


def test_a_proposal_builds_patterns_only_for_ngrams_shown_in_enough_groups(monkeypatch):
    """Every reply carries words of its own (rare: one sample shows each); only the n-grams of at
    least `min_groups` groups can be tested, so only theirs are built as patterns."""
    rng = random.Random(0)
    samples = []
    for g in range(16):
        for i in range(8):
            own = " ".join(f"zq{g}x{i}y{k}" for k in range(6))
            paid = i % 2 == 0
            text = ("Certainly! " if paid else "") + f"common words here {own} and more."
            samples.append(ViewSample(f"s{len(samples) + 1:03d}", g, text, float(paid) + rng.random() * 0.1,
                                      "+" if paid else "-"))
    built: list[tuple[str, ...]] = []
    wrapped = surface.ngram_feature

    def counted(gram):
        built.append(gram)
        return wrapped(gram)

    monkeypatch.setattr(surface, "ngram_feature", counted)
    found = LexicalProposer(LexicalConfig(min_groups=2)).best(ProposerView(5, samples))
    assert found is not None and "Certainly" in found.title
    assert built and not [g for g in built if any(w.startswith("zq") for w in g)]


@pytest.mark.slow
@pytest.mark.timeout(2000)  # past the inner limits of its subprocesses (the suite's default is 600 s)
def test_the_scale_benchmarks_quick_size_prints_its_table_and_sensible_verdicts(tmp_path):
    out = tmp_path / "scale.json"
    # started as a shell's background job is (SIGINT ignored, inherited by its children): the
    # benchmark's Ctrl-C must still stop the --follow monitor (before, it waited for it forever)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "monitor_scale.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollouts/CPU-s" in proc.stdout and "peak RSS MB" in proc.stdout
    measured = json.loads(out.read_text())
    assert [m["mode"] for m in measured] == ["one-off", "follow"]
    for m in measured:
        assert m["rows"] == 10 * 1024 and m["cpu_s"] > 0 and m["peak_rss_mb"] > 0
        assert m["shortcut_live"] and not m["control_proposed"], m
    assert [m["exit"] for m in measured] == [10, 130]  # a live pattern; the follow stopped with Ctrl-C
    # one line per target measured at this size (the rate, one-off and following), met or not
    rates = [line for line in proc.stdout.splitlines() if "rollouts per CPU-second at" in line]
    assert len(rates) == 2 and all(line.endswith(("target >= 10,000 met", "target >= 10,000 not met"))
                                   or "(measured at 10,240 rows, not at 10^6)" in line for line in rates)
