"""EQ-Bench Creative Writing v3 protocol: assets, template filling, parsing and scoring of recorded
judge outputs (hand-computed), the protocol with a fake policy, and a tiny end-to-end run."""

import json
import shutil
from pathlib import Path

import anyio
import pytest

from dynalize import tiny
from dynalize.eval import eqbench
from dynalize.eval.__main__ import main as eval_main
from dynalize.eval.common import BenchmarkError, bootstrap_ci
from dynalize.eval.eqbench import (
    EQBenchAssets,
    EQBenchSettings,
    fill_judge_prompt,
    parse_judge_scores,
    piece_score,
    run_eqbench,
    seed_modifier,
    split_reasoning,
    strip_judge_reasoning,
)

FIXTURES = Path(__file__).parent / "fixtures" / "eqbench"
CRITERIA = ["Imagery", "Coherent", "Originality", "Purple Prose", "Meandering"]
NEGATIVE = ["Purple Prose", "Meandering"]


def recorded(name: str) -> str:
    return (FIXTURES / "recorded" / f"{name}.txt").read_text()


@pytest.fixture
def assets():
    return EQBenchAssets.load(FIXTURES)


def test_assets_load(assets):
    assert [p.id for p in assets.prompts] == ["1", "2"]
    assert assets.criteria == CRITERIA and assets.negative == NEGATIVE
    assert assets.prompts[0].title == "The Lighthouse Cat"


def test_missing_file_is_one_clear_line(tmp_path):
    with pytest.raises(BenchmarkError, match=r"creative_writing_prompts_v3.json not found") as e:
        EQBenchAssets.load(tmp_path)
    assert "\n" not in str(e.value)


def test_judge_template_with_stray_braces_is_refused(tmp_path):
    shutil.copytree(FIXTURES / "data", tmp_path / "data")
    (tmp_path / "data" / "creative_writing_judging_prompt.txt").write_text("{writing_prompt} {oops}")
    with pytest.raises(BenchmarkError, match="str.format template"):
        EQBenchAssets.load(tmp_path)


def test_seed_modifiers_cycle_over_iterations(assets):
    p1 = assets.prompts[0]  # two modifiers: iteration 3 wraps around to the first
    assert [seed_modifier(p1, i) for i in (1, 2, 3)] == [
        "The cat is afraid of water.", "A storm is coming.", "The cat is afraid of water."]


def test_judge_prompt_filled_as_the_benchmark_does(assets):
    text = fill_judge_prompt(assets.judge_template, assets.prompts[0].writing_prompt, "THE STORY",
                             assets.criteria, assets.negative)
    assert "about a cat who keeps a lighthouse. <SEED> Aim" in text  # the literal <SEED> stays
    assert "- Imagery\n- Coherent\n- Originality\n- Purple Prose\n- Meandering" in text
    assert "lower is better: Purple Prose, Meandering" in text
    assert "THE STORY" in text


@pytest.mark.parametrize("name, parsed, faithful, strict", [
    # 15, 12, 10, 20-4, 20-6 -> 67 / 5
    ("judge_clean", {"Imagery": 15, "Coherent": 12, "Originality": 10, "Purple Prose": 4, "Meandering": 6},
     13.4, 13.4),
    # an analysis line parses too (faithful keeps it); 25 > 20 is dropped; "Score 14" and "[8.5]" parse
    # faithful: 3, 14, 8.5, 20-2 -> 43.5 / 4; strict: 14, 8.5, 18 -> 40.5 / 3
    ("judge_messy", {"The story runs long": 3, "Imagery": 14, "Originality": 8.5, "Purple Prose": 2},
     10.875, 13.5),
    # a complete <think> pair: stripped; a negative criterion scored -3 inverts to 23 > 20 and is dropped
    ("judge_negative", {"Imagery": 10, "Meandering": -3}, 10.0, 10.0),
    ("judge_garbage", {}, None, None),
    # <thinking> is no pair the benchmark strips: its lines parse, a later "Imagery: 16" wins over 8
    # faithful: 16, 3, 9, 11, 20-5, 20-7 -> 67 / 6; strict (no Pacing): 64 / 5
    ("judge_thinking_block", {"Imagery": 16, "Pacing": 3, "Originality": 9, "Coherent": 11, "Purple Prose": 5,
                              "Meandering": 7}, 67 / 6, 12.8),
    # a lone </think> (no opening tag) strips nothing: Pacing and Originality above it count
    # faithful: 2, 6, 12, 14, 20-8, 20-4 -> 62 / 6; strict: 60 / 5
    ("judge_lone_close", {"Pacing": 2, "Originality": 6, "Imagery": 12, "Coherent": 14, "Purple Prose": 8,
                          "Meandering": 4}, 62 / 6, 12.0),
    # a complete <think> pair with scores inside: stripped; 13, 12, 11, 20-6, 20-9 -> 61 / 5
    ("judge_think_pair", {"Imagery": 13, "Coherent": 12, "Originality": 11, "Purple Prose": 6, "Meandering": 9},
     12.2, 12.2),
    # a <think> pair, then a <reasoning> pair: both stripped (Pacing 2 goes); 14, 13, 12, 17, 15 -> 71 / 5
    ("judge_think_then_reasoning", {"Imagery": 14, "Coherent": 13, "Originality": 12, "Purple Prose": 3,
                                    "Meandering": 5}, 14.2, 14.2),
])
def test_recorded_judge_outputs_score_as_the_benchmark(name, parsed, faithful, strict):
    text = strip_judge_reasoning(recorded(name))[1]
    scores = parse_judge_scores(text)
    assert scores == parsed
    for got, want in ((piece_score(scores, CRITERIA, NEGATIVE), faithful),
                      (piece_score(scores, CRITERIA, NEGATIVE, strict=True), strict)):
        assert (got is None and want is None) or got == pytest.approx(want)


def test_judge_reasoning_is_stripped_only_as_the_benchmark_client_does():
    assert strip_judge_reasoning("<think>a</think>B") == ("<think>a</think>", "B")
    assert strip_judge_reasoning("<reasoning>a</reasoning>B") == ("<reasoning>a</reasoning>", "B")
    assert strip_judge_reasoning("a</think>B") == ("", "a</think>B")  # a lone closing tag stays
    assert strip_judge_reasoning("<thinking>a</thinking>B") == ("", "<thinking>a</thinking>B")
    assert strip_judge_reasoning("<think>a") == ("", "<think>a")  # no closing tag: nothing goes
    # both tags anywhere: cut at the end of the first closing tag, even one before the opening tag
    assert strip_judge_reasoning("a</think>B<think>c</think>D") == ("a</think>", "B<think>c</think>D")
    assert strip_judge_reasoning("<think>a</think><reasoning>b</reasoning>C")[1] == "C"


def test_split_reasoning():
    assert split_reasoning("<think>plan</think>\n\nStory") == ("<think>plan", "\n\nStory")
    assert split_reasoning("plan</think>Story") == ("plan", "Story")  # template opened the block
    assert split_reasoning("just a story") == ("", "just a story")


def test_bootstrap_ci():
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    lo, hi = bootstrap_ci([10.875, 13.4], seed=0)
    assert (lo, hi) == (10.875, 13.4)  # 500 resamples of 2 items: both extremes are within the 2.5% tails
    assert bootstrap_ci([]) is None and bootstrap_ci([None]) is None


def test_bootstrap_ci_on_the_benchmark_scale():
    # EQ-Bench rounds each resample's 0-20 score to 2 decimals: means of 11.111 and 12.222 only
    assert bootstrap_ci([11.111, 12.222], digits=2) == (11.11, 12.22)
    # a piece rated without a usable value is resampled but adds nothing; a resample of only such
    # pieces scores 0 (as the benchmark): a quarter of the resamples, well inside the lower 2.5%
    assert bootstrap_ci([10.0, None]) == (0.0, 10.0)


# --- the protocol with a fake policy -----------------------------------------------------------

class FakePolicy:
    """Replies chosen by the seed modifier in the prompt; records every batch."""

    def __init__(self):
        self.calls = []
        self.storm_attempts = 0

    async def sample(self, conversations, sampling):
        self.calls.append((conversations, sampling))
        out = []
        for convo in conversations:
            text = convo[-1].content
            if "afraid of water" in text:
                out.append("x" * 600)
            elif "storm" in text:
                self.storm_attempts += 1  # first attempt: long reasoning, short reply -> retried
                out.append("<think>" + "y" * 600 + "</think>short" if self.storm_attempts == 1 else "z" * 600)
            elif "dawn" in text:
                out.append("tiny")  # always too short: fails after 3 attempts
            elif "closing" in text:
                out.append("c" * 600)
            else:
                out.append("n" * 600)
        return out

    async def close(self):
        pass


JUDGE_BY_REPLY = {"x": "judge_clean", "z": "judge_messy", "c": "judge_negative", "n": "judge_garbage"}


def judge_by_reply(messages):
    prompt = messages[-1].content
    for ch, name in JUDGE_BY_REPLY.items():
        if ch * 600 in prompt:
            return recorded(name)
    raise AssertionError("unexpected piece")


def test_protocol_end_to_end_with_fake_policy(assets):
    from dynalize.backends.chat import ScriptedChatModel

    policy, judge = FakePolicy(), ScriptedChatModel(judge_by_reply)
    result = anyio.run(lambda: run_eqbench(policy, judge, assets, EQBenchSettings(), show_progress=False))
    # generation: one user message, no system prompt, temperature 0.7, min_p 0.1
    convos, sampling = policy.calls[0]
    assert len(convos) == 6 and all(len(c) == 1 and c[0].role == "user" for c in convos)
    assert (sampling.temperature, sampling.min_p, sampling.max_new_tokens) == (0.7, 0.1, 4000)
    assert [len(c) for c, _ in policy.calls] == [6, 2, 1]  # retries: storm + dawn, then dawn alone
    # judging as the benchmark: temperature 0, max_tokens 1000, min_p 0.1, one user message, the base
    # prompt with the literal <SEED>
    assert len(judge.calls) == 5
    assert all(s == {"temperature": 0.0, "max_tokens": 1000, "min_p": 0.1} for s in judge.sampling)
    assert all("<SEED>" in c[0].content and len(c) == 1 for c in judge.calls)
    # pieces: clean 13.4 (x2), messy 10.875, negative 10.0 -> 11.91875 on 0-20; dawn too short, one unparsed
    assert result.score == 59.59 and result.extra["score_0_20"] == 11.92  # rounded to 2 decimals, as upstream
    assert result.counts == {"pieces": 6, "scored": 4, "too_short": 1, "judge_errors": 0, "unparsed": 1,
                             "no_value": 0, "retries": 3, "scores_over_20": 1, "unlisted_names": 1,
                             "missing_criteria": 5}
    assert result.failed == 1 and not result.complete  # the unparsed piece is judged again on a rerun
    assert result.criteria == pytest.approx({"Imagery": 13.5, "Coherent": 12.0, "Originality": 9.5,
                                             "Purple Prose": 10 / 3, "Meandering": 3.0})
    lo, hi = result.ci
    assert 50.0 <= lo <= result.score <= hi <= 67.0
    assert (result.extra["ci_low_0_20"] * 5, result.extra["ci_high_0_20"] * 5) == pytest.approx((lo, hi))
    storm = next(r for r in result.raw if r["seed_modifier"] == "A storm is coming.")
    assert storm["attempt_chars"] == [5, 600] and storm["reasoning"] == ""  # of the accepted attempt
    assert storm["response"] == "z" * 600 and storm["piece_score"] == pytest.approx(10.875)
    dawn = next(r for r in result.raw if r["seed_modifier"] == "It is written at dawn.")
    assert dawn["status"] == "too_short" and dawn["response"] == "tiny"  # the last attempt stays readable
    negative = next(r for r in result.raw if r["response"] == "c" * 600)
    assert negative["judge_raw"] == recorded("judge_negative")  # raw: the reasoning block kept
    assert negative["judge_text"] == recorded("judge_negative").split("</think>", 1)[1]


def test_protocol_strict_mode_and_judge_errors(assets):
    from dynalize.backends.chat import ScriptedChatModel

    def judge(messages):
        if "n" * 600 in messages[-1].content:
            raise RuntimeError("judge down")
        return judge_by_reply(messages)

    s = EQBenchSettings(strict=True)
    result = anyio.run(lambda: run_eqbench(FakePolicy(), ScriptedChatModel(judge), assets, s, show_progress=False))
    assert result.score == round((13.4 + 13.5 + 13.4 + 10.0) / 4 * 5, 2)  # 62.875 -> 62.88
    assert result.counts["judge_errors"] == 1 and result.counts["unparsed"] == 0
    failed = next(r for r in result.raw if r["status"] == "judge_error")
    assert failed["judge_error"] == "RuntimeError: judge down" and failed["judge_raw"] is None


# --- a tiny end-to-end run through the command line --------------------------------------------

def judge_clean(messages):
    return recorded("judge_clean")


def fake_run(tmp_path: Path, step: int = 10) -> Path:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / f"step_{step:06d}"
    shutil.copytree(tiny.resolve("tiny:policy"), ckpt / "policy")
    (ckpt / "state.json").write_text(json.dumps({"step": step}))
    return run


@pytest.mark.slow
def test_tiny_run_through_the_cli(tmp_path, capsys):
    run = fake_run(tmp_path)
    args = ["--run", str(run), "--bench", "eqbench", "--bench-dir", str(FIXTURES), "--judge",
            json.dumps({"engine": "scripted", "path": "test_eqbench:judge_clean"}), "--iterations", "1",
            "--min-chars", "1", "--max-tokens", "8", "--no-progress", "--log-level", "WARNING"]
    assert eval_main(args) == 0
    rows = [json.loads(line) for line in (run / "eval" / "eqbench.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 10 and rows[0]["bench"] == "eqbench"
    assert rows[0]["counts"]["pieces"] == 2
    if rows[0]["counts"]["scored"]:
        assert rows[0]["score"] == pytest.approx(67.0) and rows[0]["ci_low"] == pytest.approx(67.0)
    raw = (run / "eval" / "eqbench_raw" / "step_000010.jsonl").read_text().splitlines()
    assert len(raw) == 2 and json.loads(raw[0])["prompt"].startswith("Write a short fable")
    assert rows[0]["settings"]["judge"] == {"engine": "scripted", "path": "test_eqbench:judge_clean",
                                            "max_concurrency": 16,
                                            "sampling": {"temperature": 0.0, "max_tokens": 1000, "min_p": 0.1}}
    assert eval_main(args) == 0  # resumes: nothing left to do
    assert "nothing to do" in capsys.readouterr().out
    assert len((run / "eval" / "eqbench.jsonl").read_text().splitlines()) == 1


def test_cli_errors_are_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    judge = json.dumps({"engine": "scripted", "path": "test_eqbench:judge_clean"})
    assert eval_main(["--run", str(run), "--bench", "eqbench", "--bench-dir", str(tmp_path), "--judge", judge]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: eqbench:") and "\n" not in err
    assert eval_main(["--run", str(run), "--bench", "eqbench", "--bench-dir", str(FIXTURES), "--judge", "{bad"]) == 2
    assert "--judge: not valid JSON" in capsys.readouterr().err
    assert eval_main(["--run", str(run), "--bench", "eqbench", "--bench-dir", str(FIXTURES), "--judge", judge]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_module_doc_names_the_files():
    for path in eqbench.FILES.values():
        assert path in eqbench.__doc__


def test_checkpoint_selection(tmp_path):
    from dynalize.eval.checkpoints import find_checkpoints, select

    for step, complete in ((10, True), (20, True), (30, False), (40, True)):
        d = tmp_path / "checkpoints" / f"step_{step:06d}"
        (d / "policy").mkdir(parents=True)
        (d / "policy" / "config.json").write_text("{}")
        if complete:
            (d / "state.json").write_text("{}")
    found = find_checkpoints(tmp_path)
    assert [s for s, _ in found] == [10, 20, 40]  # step 30 was cut off mid-save
    assert [s for s, _ in select(found, every=20)] == [20, 40]
    assert [s for s, _ in select(found, steps=[10, 40])] == [10, 40]
