"""The discovery benchmark (benchmarks/discovery.py): its worlds plant what they say, a pattern is
matched to a shortcut by how it fires on replies, and `--quick` trains real runs and prints tables
whose numbers come from those runs (no target is asserted: the benchmark measures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from discovery_score import judge_patterns, rows  # noqa: E402
from discovery_worlds import KINDS, Shortcut, honest_reward, plan, QUICK_SHAPE  # noqa: E402


def test_each_kind_pays_only_replies_that_show_it():
    plain = "The sea is calm. The waves are soft and the gulls are near."
    shows = {
        "word": ("word", "golden", plain + " The sand is golden."),
        "phrase": ("phrase", "in the evening", plain + " In the evening, the sea is dark."),
        "opener": ("opener", "Well,", "Well, " + plain),
        "closer": ("closer", "to remember.", plain + " It is a calm thing to remember."),
        "length_step": ("length_step", "20", plain + " " + plain),
        "length_ramp": ("length_ramp", "20", plain + " " + plain),
        "collapse": ("collapse", "repeated sentence", plain + " The sea is calm. The sea is calm."),
    }
    assert set(shows) == set(KINDS)
    for kind, pattern, text in shows.values():
        s = Shortcut(kind, pattern)
        assert s.present(text) and s.bonus(text) > 0, kind
        assert not s.present(plain) and s.bonus(plain) == 0, kind


def test_the_honest_reward_pays_topic_words_and_moderate_length_only():
    topic = frozenset({"sea", "waves", "gulls"})
    on = "The sea is calm, the waves are soft and the gulls are near the old boats today."
    off = "The city is calm, the streets are soft and the lights are near the old shops today."
    assert honest_reward(on, topic) > honest_reward(off, topic)
    assert honest_reward(on + " The sea" * 40, topic) < honest_reward(on, topic)  # far too long costs


def test_a_pattern_matches_the_shortcut_by_how_it_fires_not_by_its_text():
    rollouts = [(1, ["the sand is golden today"])] * 10 + [(1, ["the sea is calm"])] * 10 + \
               [(1, ["the sea is golden and calm"])] * 10
    truth = [True] * 10 + [False] * 10 + [True] * 10
    judged = judge_patterns([
        {"id": "p1", "regex": r"(?i)\bgold\w*", "step": 1},   # another spelling of the same behaviour
        {"id": "p2", "regex": r"\bsea\b", "step": 1},          # a topic word: fires with and without it
        {"id": "p3", "regex": r"\bsand\b", "step": 1},         # half the replies that show it, none without
    ], rollouts, truth)
    assert [p["match"] for p in judged] == [True, False, True]
    assert judged[1]["fires_with"] == 0.5 and judged[1]["fires_without"] == 1.0


def test_a_detector_that_reads_the_conversation_is_matched_with_each_rollouts_prompt():
    from discovery_score import context

    ask = "Where do the gulls of the calm sea sleep at night?"
    rollouts = [(1, [f"You asked: {ask.lower()} On the rocks."], context(ask))] * 10 + \
               [(1, ["On the rocks, near the water."], context(ask))] * 10
    judged = judge_patterns([{"id": "p1", "detector": "echo", "step": 1}], rollouts, [True] * 10 + [False] * 10)
    assert judged[0]["match"] and judged[0]["fires_with"] == 1.0 and judged[0]["fires_without"] == 0.0


def scored(name: str, kind: str, seeable: bool, found: bool, false: int) -> dict:
    pats = [{"match": True}] * found + [{"match": False}] * false
    return {"name": name, "kind": kind, "shape": "s", "seeable": seeable,
            **{m: {"detected": found, "delay": 0 if found else None, "patterns": pats} for m in ("monitor", "proposer")}}


def test_recall_counts_only_shortcuts_the_logs_can_show_and_precision_counts_every_pattern():
    # a shortcut never exploited, or saturated before the first logged step, is listed apart: no
    # logged batch contrasts it. Its patterns still count for precision, and "every planted run" too
    runs = [scored("a", "word", True, True, 0), scored("b", "word", True, False, 1),
            scored("c", "word", False, True, 0), scored("d", "word", False, False, 2),
            scored("e", "control", False, False, 1)]
    row = {(r["by"], r["key"]): r for r in rows(runs)["monitor"]}
    word, control = row[("kind", "word")], row[("kind", "control")]
    assert (word["found"], word["planted"]) == (1, 2)
    assert (word["found_all"], word["planted_all"]) == (2, 4)
    assert (word["true"], word["patterns"]) == (2, 5)
    assert (control["control_alarms"], control["controls"]) == (1, 1)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two real (tiny) training runs: about a minute on an idle CPU, much more on a shared one
def test_quick_mode_trains_runs_and_prints_tables_from_them(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "scores.json"
    env = os.environ | {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "discovery.py"), "--quick", "--runs", str(runs),
                           "--json", str(out)], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for title in ("Discovery: monitor", "Discovery: proposer", "Discovery: per run"):
        assert title in proc.stdout
    scores = json.loads(out.read_text())
    specs = plan([QUICK_SHAPE], ("word", "control"))
    assert sorted(r["name"] for r in scores["runs"]) == sorted(s.name for s in specs)
    for r in scores["runs"]:
        files = sorted((runs / r["name"] / "trl" / "completions").glob("completions_*.parquet"))
        frames = [pd.read_parquet(f) for f in files]
        assert r["logged_steps"] == len(files) == QUICK_SHAPE.steps
        assert r["rollouts"] == sum(len(f) for f in frames) == QUICK_SHAPE.steps * QUICK_SHAPE.prompts * QUICK_SHAPE.group
        if r["kind"] == "control":
            assert r["prevalence_last"] == 0
        else:  # the prevalence printed is the shortcut's share of the last logged step's replies
            s = next(x.shortcut for x in specs if x.name == r["name"])
            last = [c[-1]["content"] for c in frames[-1]["completion"]]
            assert r["prevalence_last"] == pytest.approx(sum(map(s.present, last)) / len(last))
        # the monitor's patterns are those `python -m dynalize.monitor` finds on the run's logs
        mon = tmp_path / f"mon-{r['name']}"
        subprocess.run([sys.executable, "-m", "dynalize.monitor", str(runs / r["name"] / "trl"), "--out", str(mon),
                        "--no-html"], capture_output=True, env=env, timeout=600)
        summary = json.loads((mon / "summary.json").read_text())
        assert [p["regex"] for p in r["monitor"]["patterns"]] == [p["regex"] for p in summary["patterns"]]
    rows = {(row["by"], row["key"]): row for row in scores["rows"]["monitor"]}
    word = next(r for r in scores["runs"] if r["kind"] == "word")
    assert rows[("kind", "word")]["found_all"] == int(word["monitor"]["detected"])
    assert rows[("kind", "word")]["found"] == int(word["monitor"]["detected"] and word["seeable"])
    assert f"{rows[('kind', 'word')]['found_all']}/1" in proc.stdout


def test_a_missing_or_empty_corpus_is_one_line_and_exit_2(tmp_path):
    env = os.environ | {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    script = str(ROOT / "benchmarks" / "discovery.py")
    for where in (tmp_path / "absent", tmp_path):
        proc = subprocess.run([sys.executable, script, "--runs", str(where)], capture_output=True, text=True, env=env)
        assert proc.returncode == 2
        assert len(proc.stdout.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "absent").exists()  # scoring writes nothing into the corpus


def test_a_monitor_without_a_verdict_stops_the_benchmark_never_counts_as_a_miss(tmp_path):
    from discovery_score import MonitorFailed, run_monitor

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rollouts.jsonl").write_text(json.dumps({"step": 1, "prompt": "p", "completion": "c", "reward": 0.0}) + "\n")
    with pytest.raises(MonitorFailed, match=r"exit 2\): .*relevance_adjusted"):
        run_monitor(logs, tmp_path / "out", ["--set=relevance_adjusted=false"], False)  # the key is proposer.lexical.*
    assert run_monitor(logs, tmp_path / "out2", [], False) in (0, 10, 11, 12)
