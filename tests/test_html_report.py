"""The HTML run report (`python -m dynalize.report RUN [RUN] --html OUT.html`): one self-contained
page, tested in a real headless Chromium (tests/browser.py): it loads without console errors, the
rollout browser's filters work, a screenshot is saved, and hostile rollout or penalty text stays
text (no script of it runs)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from browser import CHROMIUM, NO_CHROMIUM, Browser
from toytask import DOUBLE_VOWEL, penalty_overrides

from dynalize.analysis.html import chosen_steps, highlight, render_page, rollout_view
from dynalize.analysis.runs import Run
from dynalize.judge.saferegex import SafeRegex
from dynalize.report import main as report_main
from dynalize.run import main as run_main

PWN = "window.__pwned"
HOSTILE_REPLIES = [
    f"Okay! </script><script>{PWN}='reply'</script> okay",
    f'<img src=x onerror="{PWN}=\'img\'">Okay fine?',
    "plain text & <b>bold</b>",
    "nothing to see",
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rollout(step: int, i: int, reply: str, verdicts: dict[str, bool], turns: list | None = None) -> dict:
    return {"step": step, "prompt_id": f"topic-{i // 2}", "group": i // 2, "policy_version": step,
            "prompt": [{"role": "user", "content": f"Write about <topic {i // 2}>."}],
            "turns": turns or [{"role": "assistant", "content": reply}], "replies": [reply],
            "scores": {"rm": 0.1 * i, "penalties": -0.5 * sum(verdicts.values())},
            "reward": 0.1 * i - 0.5 * sum(verdicts.values()), "advantage": 0.05 * i - 0.1, "verdicts": verdicts,
            "violations": sum(verdicts.values()), "judge_failed": []}


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    """An RM-only run and a Dynalize run, 5 steps each, with hostile text everywhere a run has text."""
    base, dyn = tmp_path / "rm-only<i>", tmp_path / "dynalize"
    for run in (base, dyn):
        write_jsonl(run / "metrics.jsonl", [{"step": s, "reward/mean": 0.1 * s, "rm/mean": 0.2 * s, "gen_len/mean": 10 + s}
                                            for s in range(5)])
        write_jsonl(run / "eval" / "task.jsonl", [{"version": v, "gold": 0.5 + 0.01 * v} for v in (0, 2, 5)])
    for s in range(5):
        write_jsonl(base / "rollouts" / f"step_{s:06d}.jsonl", [rollout(s, i, r, {}) for i, r in enumerate(HOSTILE_REPLIES)])
        rows = [rollout(s, i, r, {"p001": "okay" in r.lower(), "p002": r.endswith("?")})
                for i, r in enumerate(HOSTILE_REPLIES)]
        rows[3] = rollout(s, 3, "nothing to see", {"p001": False, "p002": False}, turns=[
            {"role": "assistant", "content": "Okay, first"}, {"role": "user", "content": f"<script>{PWN}='user'</script>"},
            {"role": "assistant", "content": "nothing to see"}])
        rows[3]["verdicts"]["p001"] = True
        write_jsonl(dyn / "rollouts" / f"step_{s:06d}.jsonl", rows)
    write_jsonl(dyn / "penalties.jsonl", [
        {"step": 1, "event": "add", "id": "p001", "title": f"Says okay <script>{PWN}='title'</script>",
         "description": f"<img src=x onerror=\"{PWN}='desc'\">", "regex": "(?i)okay", "references": ["s01", "s02"]},
        {"step": 1, "event": "add", "id": "p002", "title": "Ends on a question", "description": "d", "regex": None,
         "references": ["s03"]},
        {"step": 1, "event": "stats", "n_judged": 4, "triggers": {"p001": 3}, "prevalence": {"p001": 0.75, "p002": 0.25}},
        {"step": 2, "event": "add", "id": "p003", "title": "Matches nothing", "description": "d", "regex": "a*",
         "references": ["s04"]},
        {"step": 3, "event": "retire", "id": "p001", "title": "t", "reason": "no_triggers"},
        {"step": 4, "event": "revive", "id": "p001", "title": "t"},
        {"step": 4, "event": "stats", "n_judged": 4, "triggers": {"p001": 3}, "prevalence": {"p001": 0.5, "p002": 0.25}}])
    return [base, dyn]


def test_the_page_is_self_contained_and_holds_no_run_text_as_markup(runs, tmp_path):
    page = render_page([Run(p) for p in runs])
    assert len(re.findall(r"<script\b", page)) == 2  # the data block and the page's own script
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(|@import""", page)  # nothing fetched
    assert "<script>" + PWN not in page and "<img src=x" not in page and "<b>bold</b>" not in page
    assert "rm-only&lt;i&gt;" in page and "Says okay &lt;script&gt;" in page  # escaped where it is shown
    data = re.search(r'<script type="application/json" id="dynalize-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in data and ">" not in data  # JSON in a script element cannot end or open a tag
    assert json.loads(data)["runs"][1]["steps"][-1]["rollouts"][0]["turns"][0][1][0] == ["Okay", ["p001"]]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "unsafe" not in csp


def test_highlight_cuts_text_at_every_match_of_every_penalty():
    assert highlight("okay, okay now", {"p1": [(0, 4), (6, 10)], "p2": [(2, 8)]}) == [
        ["ok", ["p1"]], ["ay", ["p1", "p2"]], [", ", ["p2"]], ["ok", ["p1", "p2"]], ["ay", ["p1"]], [" now", []]]
    assert highlight("plain", {"p1": []}) == [["plain", []]]
    assert highlight("", {}) == [["", []]]


def test_a_regex_too_slow_to_highlight_is_dropped_once_and_noted():
    slow = SafeRegex("(a|aa)+$")
    regexes, unusable = {"p1": slow}, {}
    rows = [{"turns": [{"role": "assistant", "content": "a" * 5000 + "b"}], "verdicts": {"p1": True}}] * 3
    views = [rollout_view(r, regexes, unusable) for r in rows]
    assert regexes == {} and unusable["p1"].startswith("too slow to highlight")
    assert all(v["turns"][0][1] == [["a" * 5000 + "b", []]] for v in views)


def test_chosen_steps_spread_over_the_run_with_the_last_one():
    files = [(s, Path(f"{s}")) for s in range(100)]
    assert [s for s, _ in chosen_steps(files, 5)] == [0, 25, 50, 74, 99]
    assert [s for s, _ in chosen_steps(files, 1)] == [99]
    assert chosen_steps(files[:3], 12) == files[:3] and chosen_steps(files, 0) == []


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    if importlib.util.find_spec("websockets") is None:
        pytest.skip("the websockets package is not installed (pip install -e \".[dev]\")")
    b = Browser(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


RENDERED = """(() => [...document.querySelectorAll('.browser')].map(b => ({
    name: b.querySelector('h3').textContent, count: b.querySelector('.count').textContent,
    cards: [...b.querySelectorAll('.rollout')].map(c => ({
        text: c.textContent, marks: [...c.querySelectorAll('mark')].map(m => [m.textContent, m.dataset.penalties]),
        on: [...c.querySelectorAll('.badge.on')].map(x => x.textContent)}))})))()"""


def choose(run: int, control: str, value: str) -> str:
    """JavaScript: set a control of run `run`'s browser as a user would, firing its event."""
    event = "input" if control == "search" else "change"
    return (f"(() => {{ const c = document.querySelectorAll('.browser')[{run}].querySelector('.{control}'); "
            f"c.value = {json.dumps(value)}; c.dispatchEvent(new Event('{event}')); }})()")


def test_the_page_works_in_a_real_browser_and_its_filters_too(runs, tmp_path, browser):
    out = tmp_path / "report.html"
    assert report_main([str(p) for p in runs] + ["--html", str(out), "--rollout-steps", "3"]) == 0
    browser.errors.clear()
    browser.open(out)
    shown = browser.js(RENDERED)
    assert [b["name"] for b in shown] == ["rm-only<i>", "dynalize"]  # side by side, names as text
    assert [b["count"] for b in shown] == ["4 of 4 rollouts"] * 2  # the last step's rollouts
    assert browser.js("document.querySelectorAll('.browser')[1].querySelector('.step').options.length") == 3
    dyn = shown[1]["cards"]
    assert "</script><script>window.__pwned='reply'</script>" in dyn[0]["text"]  # shown as text
    assert dyn[0]["marks"] == [["Okay", "p001"], ["okay", "p001"]] and dyn[0]["on"] == ["p001"]
    assert dyn[3]["marks"] == [["Okay", "p001"]] and "<script>window.__pwned='user'</script>" in dyn[3]["text"]
    assert shown[0]["cards"][0]["marks"] == []  # RM-only: no verdicts, nothing highlighted
    browser.js(choose(1, "filter", "p:p002"))
    after = browser.js(RENDERED)[1]
    assert after["count"] == "1 of 4 rollouts" and after["cards"][0]["on"] == ["p001", "p002"]
    browser.js(choose(1, "filter", "none"))
    assert browser.js(RENDERED)[1]["count"] == "1 of 4 rollouts"
    browser.js(choose(1, "filter", "all"))
    browser.js(choose(1, "search", "BOLD"))
    assert [c["text"].count("plain text & <b>bold</b>") for c in browser.js(RENDERED)[1]["cards"]] == [1]
    browser.js(choose(1, "search", ""))
    browser.js(choose(1, "step", "0"))
    assert browser.js(RENDERED)[1]["count"] == "4 of 4 rollouts" and "step 0" in browser.js(
        "document.querySelectorAll('.browser')[1].querySelector('.step').selectedOptions[0].textContent")
    assert "p003: its regex highlights nothing here: matches the empty text" in browser.js(
        "document.querySelectorAll('.browser')[1].textContent")
    assert browser.js(f"typeof {PWN}") == "undefined"  # no script from the run ran
    assert browser.js("document.querySelectorAll('img.figure').length") == 2  # curves + one timeline
    assert browser.js("[...document.images].every(i => i.complete && i.naturalWidth > 0)")  # the SVGs render
    assert browser.errors == []
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    print(f"screenshot: {shot}")


@pytest.mark.slow
def test_a_real_dynalize_run_and_its_rm_only_arm_on_one_page(toy_overrides, tmp_path, browser):
    arms = {"rm_only": ["penalties.enabled=false"], "dynalize": penalty_overrides()}
    for name, extra in arms.items():
        assert run_main([*toy_overrides, f"name={name}", "steps=4", "eval_every=2", "export_final=false", *extra]) == 0
    out = tmp_path / "both.html"
    assert report_main([str(tmp_path / n) for n in arms] + ["--html", str(out)]) == 0
    browser.errors.clear()
    browser.open(out)
    shown = browser.js(RENDERED)
    assert [b["name"] for b in shown] == ["rm_only", "dynalize"] and [b["count"] for b in shown] == ["16 of 16 rollouts"] * 2
    marks = [m for c in shown[1]["cards"] for m in c["marks"]]
    assert marks and all(re.fullmatch(DOUBLE_VOWEL, text) and pid == "p001" for text, pid in marks)
    on = sum("p001" in c["on"] for c in shown[1]["cards"])
    browser.js(choose(1, "filter", "p:p001"))
    assert browser.js(RENDERED)[1]["count"] == f"{on} of 16 rollouts"
    assert "Doubles its vowels" in browser.js("document.querySelector('#penalties').textContent")
    assert browser.errors == []
    browser.screenshot(tmp_path / "both.png")


HELD_OUT = """(() => [...document.querySelectorAll('.heldout')].map(b => ({
    count: b.querySelector('.count').textContent,
    options: [...b.querySelector('.hfilter').options].map(o => o.value),
    highlighted: [...b.querySelectorAll('tr.disagree')].map(t => t.dataset.criterion),
    replies: b.querySelectorAll('.heldreply').length})))()"""


@pytest.mark.slow
def test_a_rubric_run_shows_proxy_and_gold_verdicts_dropped_criteria_and_disagreements(tmp_path, browser):
    import yaml
    from test_rubric_e2e import sample_config

    from dynalize.runlog import read_jsonl

    data = sample_config(tmp_path, name="rubric", reward_model={"enabled": False}, penalties={"enabled": False})
    data["rubric"]["dropout"] = {"f": 0.5, "min_keep": 1}
    data["rubric"]["gold_judge"]["chat"]["path"] = "rubricjudge:odd_keys"  # disagrees with the proxy somewhere
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    assert run_main(["--config", str(tmp_path / "r.yaml")]) == 0
    run = tmp_path / "rubric"
    out = tmp_path / "rubric.html"
    assert report_main([str(run), "--html", str(out)]) == 0
    browser.errors.clear()
    browser.open(out)
    page = browser.js("document.body.textContent")
    assert browser.js("document.querySelector('#penalties')") is None  # a rubric-only run: no penalty panel
    header = browser.js("[...document.querySelectorAll('#summary th')].map(t => t.textContent)")
    assert "rubric gold (held-out): peak / final" in header and not any(h.startswith(("RM", "penalties")) for h in header)
    assert "Rubric: held-out proxy and gold" in page
    assert browser.js("document.querySelectorAll('img.figure').length") == 2  # curves + the rubric figure
    # training rollouts: each card lists its criteria with verdicts, dropped ones struck through
    last = read_jsonl(run / "rollouts" / "step_000002.jsonl")
    cards = browser.js("[...document.querySelectorAll('.browser .rollout')].map(c => ({"
                       "rows: c.querySelectorAll('table.verdicts tr').length, "
                       "dropped: c.querySelectorAll('tr.dropped').length, head: c.querySelector('.score').textContent}))")
    assert [c["rows"] for c in cards] == [len(r["rubric_verdicts"][0]) for r in last]
    assert [c["dropped"] for c in cards] == [len(r["rubric_dropped"]) for r in last]
    assert all("masked" in c["head"] and "RM" not in c["head"] for c in cards)
    dropped_anywhere = [r for s in (1, 2) for r in read_jsonl(run / "rollouts" / f"step_{s:06d}.jsonl")
                        if r["rubric_dropped"]]
    assert dropped_anywhere  # f=0.5 drops some
    # held-out replies: proxy (lenient) and gold (strict) disagree; highlighted and filterable
    evals = read_jsonl(run / "rollouts" / "eval_000002.jsonl")
    disagree = [[k for k in r["gold_verdicts"][0] if r["gold_verdicts"][0][k] != r["proxy_verdicts"][0][k]]
                for r in evals]
    [shown] = browser.js(HELD_OUT)
    assert shown["count"] == f"{len(evals)} of {len(evals)} replies"
    assert len(shown["highlighted"]) == sum(len(d) for d in disagree) > 0
    browser.js("(() => { const f = document.querySelector('.hfilter'); f.value = 'disagree'; "
               "f.dispatchEvent(new Event('change')); })()")
    [shown] = browser.js(HELD_OUT)
    assert shown["replies"] == sum(bool(d) for d in disagree)
    cid = shown["options"][2].removeprefix("c:")
    browser.js(f"(() => {{ const f = document.querySelector('.hfilter'); f.value = 'c:{cid}'; "
               f"f.dispatchEvent(new Event('change')); }})()")
    [shown] = browser.js(HELD_OUT)
    assert shown["replies"] == sum(cid in d for d in disagree) and cid in shown["highlighted"]
    browser.js("(() => { const f = document.querySelector('.hfilter'); f.value = 'all'; "
               "f.dispatchEvent(new Event('change')); })()")
    assert browser.js("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
    assert browser.errors == []
    shot = browser.screenshot(tmp_path / "rubric.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")
