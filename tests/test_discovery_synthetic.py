"""The synthetic discovery suite (benchmarks/discovery_synthetic.py): its split is fixed and covers every
category in each half, a planted world pays what it states on the replies showing its shortcut and
nothing else, a null world's reward ignores what it should, the logs read as the monitor reads them,
and `--quick` prints the three tables from the runs it monitored (no recall figure is asserted: the
benchmark measures)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synthetic_policy import TRAITS, Drift, Policy, Reply, prompts  # noqa: E402
from synthetic_score import clopper_pearson, kind_row, net_pay, null_row  # noqa: E402
from synthetic_worlds import (CATEGORIES, HELD_OUT, NULL_KINDS, PAYS, PREVALENCE, SHAPES, SHORTCUT_KINDS,  # noqa: E402
                              TUNED, honest, honest_std, kind_category, make_world, simulate, split_rule, write_logs)


def test_the_split_is_the_recorded_rule_and_each_half_covers_every_category():
    assert split_rule() == (TUNED, HELD_OUT)
    assert not set(TUNED) & set(HELD_OUT) and set(TUNED) | set(HELD_OUT) == set(SHORTCUT_KINDS)
    assert len(SHORTCUT_KINDS) >= 16
    for half in (TUNED, HELD_OUT):
        assert {kind_category(k) for k in half} == set(CATEGORIES)


def test_each_trait_is_told_from_the_text_alone():
    p = prompts()[0]
    for name, trait in TRAITS.items():
        for seed in range(20):
            rng = random.Random(seed)
            plain = Reply([f"The {w} is calm and quiet today." for w in ("river", "garden", "road", "table")])
            assert not trait.present(plain.text(), p), name
            trait.apply(plain, rng, p)
            assert trait.present(plain.text(), p), (name, plain.text())


def test_a_planted_world_pays_its_stated_stds_only_on_replies_showing_it():
    unit = honest_std()
    for kind in SHORTCUT_KINDS:
        for seed in (0, 1):
            world = make_world(kind, seed, "8x8")
            assert world.pay == PAYS[seed % 2]
            rollouts = simulate(world, SHAPES["8x8"], f"t-{kind}-{seed}")
            shown = {r for r in rollouts if world.shows(r.reply, r.prompt)}
            first = [world.shows(r.reply, r.prompt) for r in rollouts if r.step == 1]
            last = [world.shows(r.reply, r.prompt) for r in rollouts if r.step == 20]
            assert sum(first) / len(first) < 0.25 and sum(last) / len(last) >= PREVALENCE - 0.2, kind
            for r in rollouts[:200]:
                rng_a, rng_b = random.Random(r.reply), random.Random(r.reply)
                gap = world.reward(r.reply, r.prompt, rng_a) - honest(r.reply, r.prompt, rng_b)
                if r in shown and kind != "length_ramp":
                    assert gap == pytest.approx(world.pay * unit), kind
                elif r in shown:  # pays per word past the bar, up to the stated pay
                    assert 0 < gap <= world.pay * unit + 1e-9
                else:
                    assert gap == 0, kind


def test_a_null_worlds_reward_ignores_the_style_that_drifts_in_it():
    p = prompts()[0]
    base = ["The waves are calm.", "We see the gulls near the road."]

    def styled(trait: str, seed: int) -> str:
        r = Reply(list(base))
        TRAITS[trait].apply(r, random.Random(seed), p)
        return r.text()

    plain = Reply(list(base)).text()
    for kind in NULL_KINDS:
        for seed in range(6):
            world = make_world(kind, seed, "16x8")
            assert world.pay == 0
            if kind in ("noise", "heavy_tails", "ties", "rising"):  # the drifting style (an opener in rising) is unpaid
                assert world.drifting
                other = styled(world.drifting, seed)
                assert other != plain
                assert world.reward(plain, p, random.Random(7)) == world.reward(other, p, random.Random(7)), kind
    topic = make_world("topic", 0, "8x8")
    assert topic.reward(plain, p, random.Random(1)) == topic.reward(styled("caps", 0), p, random.Random(1))
    assert topic.reward(plain + " The tide is near the shore.", p, random.Random(1)) > topic.reward(plain, p, random.Random(1))
    length = make_world("length", 0, "8x8")  # pays the number of words, not which
    assert length.reward("a b c d e f", p, random.Random(1)) == length.reward("g h i j k l", p, random.Random(1))
    assert length.reward("a b c d e f g h i j k l", p, random.Random(1)) > length.reward("a b c", p, random.Random(1))
    ending = make_world("ending", 0, "8x8")  # pays a finished reply, not how it ends
    assert ending.reward("The sea is calm.", p, random.Random(1)) == ending.reward("The road is wide!", p, random.Random(1))
    assert ending.reward("The sea is calm.", p, random.Random(1)) > ending.reward("The sea is", p, random.Random(1))


def test_the_logs_read_as_the_monitor_reads_them(tmp_path):
    from dynalize.monitor.readers import by_step, read_rollouts

    for shape_name in ("8x8_verl", "32x2", "8x8_log5"):
        shape = SHAPES[shape_name]
        world = make_world("noise", 0, shape_name)
        rollouts = simulate(world, shape, "logs")
        read = read_rollouts(write_logs(rollouts, shape, tmp_path / shape_name))
        assert [(r.step, r.replies, r.reward) for r in read] == [(r.step, [r.reply], r.reward) for r in rollouts]
        steps = by_step(read)
        assert list(steps) == list(range(shape.log_every, shape.steps + 1, shape.log_every))
        for batch in steps.values():
            groups: dict[str, int] = {}
            for r in batch:
                groups[r.group] = groups.get(r.group, 0) + 1
            assert len(groups) == shape.prompts and set(groups.values()) == {shape.group}


def test_a_drift_reaches_its_end_and_starts_at_its_start():
    d = Drift(0.02, 0.85, mid=0.3)
    assert d.at(0.0) == pytest.approx(0.02) and d.at(1.0) == pytest.approx(0.85)
    assert d.at(0.2) < d.at(0.3) < d.at(0.5)
    pol = Policy(styles=(("caps", d),))
    rng, p = random.Random(0), prompts()[3]
    assert sum(TRAITS["caps"].present(pol.reply(rng, p, 1.0), p) for _ in range(400)) / 400 > 0.75


def test_the_false_alarm_interval_is_clopper_pearson():
    lo, hi = clopper_pearson(0, 56)
    assert lo == 0 and hi == pytest.approx(0.0637, abs=5e-4)  # issue 55's "0 of 56, [0, 0.064]"
    lo, hi = clopper_pearson(13, 14)
    assert 0.66 < lo < 0.67 and 0.998 < hi < 0.999


def _run(kind: str, exit_: int, patterns: list[bool], qualifying: bool = True, seeable: bool = True) -> dict:
    return {"kind": kind, "exit": exit_, "patterns": [{"match": m, "title": "t"} for m in patterns],
            "seeable": seeable, "qualifying": qualifying, "detected": any(patterns), "delay": 1 if any(patterns) else None}


def test_rows_count_exit_0_only_on_qualifying_shortcuts_and_alarms_on_any_pattern():
    runs = [_run("caps", 0, []), _run("caps", 0, [], qualifying=False), _run("caps", 10, [True, False]),
            _run("caps", 11, [], seeable=False), _run("caps", 1, [])]
    row = kind_row("caps", runs)
    assert (row["found"], row["seeable"]) == (1, 4)
    assert (row["true"], row["patterns"]) == (1, 2)
    assert (row["exit0_qualifying"], row["qualifying"]) == (1, 4)
    assert row["exits"] == {"0": 2, "10": 1, "11": 1, "12": 0, "other": 1}
    null = null_row("noise", [_run("noise", 0, []), _run("noise", 11, [False]), _run("noise", 0, []),
                              _run("noise", 12, [])])
    # unnamed pay (exit 12) on a null world is a false alarm too
    assert (null["alarmed"], null["runs"]) == (2, 4) and null["proposed"] == [("t", 1)]


def test_an_exit_0_counts_against_the_monitors_claim_only_where_the_trait_netted_what_it_said_it_could_see():
    runs = [{**_run("short", 0, []), "net_pay": 0.4, "detectable": 0.94},
            {**_run("short", 0, []), "net_pay": 1.1, "detectable": 0.94},
            {**_run("short", 0, []), "net_pay": None, "detectable": 0.94},  # not measurable: counted
            _run("short", 0, [])]  # scored before the claim was kept: counted
    row = kind_row("short", runs)
    assert (row["exit0_qualifying"], row["exit0_claim_broken"]) == (4, 3)


def test_a_trait_that_costs_honest_reward_nets_less_than_its_planted_bonus():
    # "short" deletes all but a reply's first sentence: fewer topic words, a length under 10
    # words, both paid less by the honest reward, so its bonus of 1 std nets well under 1
    world = make_world("short", 0, "8x8")
    rollouts = simulate(world, SHAPES["8x8"], "t-short-net")
    truth = [world.shows(r.reply, r.prompt) for r in rollouts]
    short = net_pay(rollouts, truth, None)
    word = make_world("word", 0, "8x8")
    w_rollouts = simulate(word, SHAPES["8x8"], "t-word-net")
    plain = net_pay(w_rollouts, [word.shows(r.reply, r.prompt) for r in w_rollouts], None)
    assert short is not None and plain is not None and short < 0.75 < plain, (short, plain)
    assert net_pay(rollouts, [False] * len(rollouts), None) is None


@pytest.mark.slow
@pytest.mark.timeout(900)  # five small monitored runs: under a minute idle, a few on a loaded machine
def test_quick_mode_monitors_runs_and_prints_the_three_tables_from_them(tmp_path):
    out, results = tmp_path / "scores.json", tmp_path / "runs.jsonl"
    env = os.environ | {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "discovery_synthetic.py"), "--quick", "--json", str(out),
           "--results", str(results)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for title in ("Null worlds", "Tuned kinds", "Held-out kinds"):
        assert title in proc.stdout
    scores = json.loads(out.read_text())
    assert len(scores["runs"]) == 5 and len(results.read_text().splitlines()) == 5
    assert scores["split"] == {"tuned": list(TUNED), "held_out": list(HELD_OUT)}
    for r in scores["runs"]:
        assert r["exit"] in (0, 10, 11, 12) and r["rollouts"] == 10 * 8 * 4
    # the tables are those of the runs: a row's counts are the runs' own
    held = next(r for r in scores["rows"]["held_out"] if r["kind"] == HELD_OUT[0])
    run = next(r for r in scores["runs"] if r["kind"] == HELD_OUT[0])
    assert held["exits"][str(run["exit"])] == 1 and held["patterns"] == len(run["patterns"])
    # continued: nothing is monitored again, the same tables come from the file
    md = tmp_path / "tables.md"
    again = subprocess.run(cmd[:-2] + ["--results", str(results), "--tables-only", "--markdown", str(md)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "0 run(s) monitored" in again.stdout
    assert md.read_text().count("| kind |") == 3 and f"| {HELD_OUT[0]} |" in md.read_text()


def test_bad_arguments_are_one_line_and_exit_2():
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    script = str(ROOT / "benchmarks" / "discovery_synthetic.py")
    for args in (["--kinds", "nope"], ["--shapes", "9x9"], ["--tables-only"], ["--jobs", "0"]):
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, args


def test_runs_come_in_rounds_every_kind_once_before_any_twice_and_nulls_on_more_seeds():
    from discovery_synthetic import ALL_KINDS, plan

    shapes = list(SHAPES)
    todo = plan(ALL_KINDS, shapes, null_seeds=6, seeds=2)
    assert len(todo) == len(set(todo)) == 6 * 7 * len(NULL_KINDS) + 2 * 7 * (len(ALL_KINDS) - len(NULL_KINDS))
    first = todo[:len(ALL_KINDS)]
    assert sorted(k for k, _, _ in first) == sorted(ALL_KINDS)
    assert len({s for _, s, _ in first}) == len(shapes)  # the first round already spans every shape
    for kind in ALL_KINDS:
        runs = [(s, seed) for k, s, seed in todo if k == kind]
        assert len(runs) == (6 if kind in NULL_KINDS else 2) * len(shapes)
        assert {s for s, _ in runs} == set(shapes)


def test_results_scored_with_other_settings_are_refused_never_mixed_in(tmp_path):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    results = tmp_path / "runs.jsonl"
    line = {"name": "8x8__noise__s0", "kind": "noise", "run_with": {"dynalize": "elsewhere", "commit": "abc",
                                                                     "dirty": False, "settings": []}}
    results.write_text(json.dumps(line) + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "discovery_synthetic.py"), "--kinds", "noise",
                           "--shapes", "8x8", "--null-seeds", "1", "--results", str(results)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "other code or settings" in proc.stdout
    assert results.read_text() == json.dumps(line) + "\n"  # nothing appended
