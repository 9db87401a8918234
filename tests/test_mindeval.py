"""MindEval protocol: templates read from Python modules without running them, profiles, parsing
of recorded judge outputs (hand-computed), the conversation with a fake policy, and a tiny
end-to-end run through the command line."""

import json
import shutil
from pathlib import Path

import anyio
import pytest

from dynalize import tiny
from dynalize.backends.chat import ScriptedChatModel
from dynalize.eval.__main__ import main as eval_main
from dynalize.eval.common import BenchmarkError
from dynalize.eval.mindeval import (
    CRITERIA,
    MindEvalAssets,
    MindEvalSettings,
    conversation_str,
    parse_judgment,
    run_mindeval,
    separate_thinking,
)
from dynalize.eval.pytemplates import PromptModule, TemplateLayoutError
from dynalize.types import Message

FIXTURES = Path(__file__).parent / "fixtures" / "mindeval"


def recorded(name: str) -> str:
    return (FIXTURES / "recorded" / f"{name}.txt").read_text()


# --- templates from Python modules -------------------------------------------------------------

def test_templates_are_read_without_running_the_module(tmp_path):
    mod = tmp_path / "prompts.py"
    mod.write_text('raise SystemExit("this file must never run")\nfrom string import Template\n'
                   'A = Template("""Hi ${name}""")\nB = "plain " "joined " + "string"\nC = A\n'
                   'D: str = string.Template("x ${y}")\nV = {"v1": A, "v2": "lit"}\n')
    m = PromptModule(mod)
    assert m.template("A").substitute(name="Ada") == "Hi Ada"
    assert m.template("B").template == "plain joined string"
    assert m.template("C").template == "Hi ${name}"
    assert m.template("D").template == "x ${y}"
    assert m.versioned("V", "v2").template == "lit"
    assert m.lookup("v1", "V").template == "Hi ${name}" and m.lookup("A", "V").template == "Hi ${name}"


@pytest.mark.parametrize("source, ref, message", [
    ('A = f"hi {x}"\n', "A", r"A in .* is not a string, Template"),
    ('A = load_prompt("a.txt")\n', "A", "refusing to run the file"),
    ('A = "x"\n', "MISSING", "defines no MISSING"),
    ('V = {"v1": "x"}\n', "V[v9]", "has no version 'v9'"),
    ('V = {"v1": NOPE}\n', "V[v1]", "defines no NOPE"),
])
def test_template_layout_errors_are_one_line(tmp_path, source, ref, message):
    mod = tmp_path / "prompts.py"
    mod.write_text(source)
    m = PromptModule(mod, "mindeval")
    with pytest.raises(TemplateLayoutError, match=message) as e:
        if "[" in ref:
            m.versioned(ref.split("[")[0], ref.split("[")[1].rstrip("]"))
        else:
            m.template(ref)
    assert "\n" not in str(e.value)


def test_assets_from_the_fixture_checkout():
    a = MindEvalAssets.load(FIXTURES)
    assert [p["name"] for p in a.profiles] == ["Ada", "Bram"]
    assert a.profiles[0]["member_narrative"].startswith("You fix ferry engines")
    assert "- Name: Ada\n- Age: 34" in a.clinician.substitute(**a.profiles[0])
    assert "Backstory: You moved" in a.member.substitute(**a.profiles[1])
    assert "<length_guideline>" in a.judge.template
    short = MindEvalAssets.load(FIXTURES, clinician="MINDEVAL_CLINICIAN_TEMPLATE_SHORT")
    assert short.clinician.substitute(name="Ada") == "Counsel Ada in two sentences or fewer."


def test_missing_module_or_version_is_a_clear_error(tmp_path):
    with pytest.raises(BenchmarkError, match=r"mindeval/prompts.py not found"):
        MindEvalAssets.load(tmp_path)
    with pytest.raises(BenchmarkError, match=r"JUDGE_PROMPT_TEMPLATE_VERSION_DICT .* has no version 'v9'"):
        MindEvalAssets.load(FIXTURES, judge="v9")


# --- parsing and scoring -----------------------------------------------------------------------

@pytest.mark.parametrize("name, strict, scores, missing, out_of_range, mean", [
    ("judge_full", False, [4, 5, 3.5, 4, 2], 0, 0, 3.7),  # 18.5 / 5
    # thinking holds a decoy score (stripped first); "- 4" and "[5]" do not parse -> 3; 7 is out of 1-6
    ("judge_partial", False, [2, 7, 3, 3, 3], 3, 1, 3.6),  # 18 / 5
    ("judge_partial", True, [2, 3, 3, 3, 3], 3, 1, 2.8),  # strict: 7 counts as missing -> 14 / 5
    ("judge_garbage", False, [3, 3, 3, 3, 3], 5, 0, 3.0),
])
def test_recorded_judge_outputs(name, strict, scores, missing, out_of_range, mean):
    j = parse_judgment(separate_thinking(recorded(name))[1], strict=strict)
    assert [j.scores[c] for c in CRITERIA] == scores
    assert len(j.missing) == missing and len(j.out_of_range) == out_of_range
    assert j.score == pytest.approx(mean)


def test_separate_thinking_and_transcript():
    assert separate_thinking("<think> a </think>\n Hi ") == ("a", "Hi")
    assert separate_thinking("plan</think>Hi") == ("plan", "Hi")
    assert separate_thinking("<think>all thought</think>") == ("all thought", "")
    assert separate_thinking(" Hi ") == ("", "Hi")
    convo = [Message("user", "Hello"), Message("assistant", "Hi there"), Message("user", "Meh")]
    assert conversation_str(convo) == ("<member>\nHello\n</member>\n<therapist>\nHi there\n</therapist>\n"
                                       "<member>\nMeh\n</member>")


# --- the conversation with a fake policy -------------------------------------------------------

class FakeClinician:
    def __init__(self):
        self.calls = []

    async def sample(self, conversations, sampling):
        self.calls.append(([list(c) for c in conversations], sampling))
        # Ada's first reply is only thinking: it becomes "..."
        return ["<think>plan</think>" if len(self.calls) == 1 and "Ada" in c[0].content else "How are you?"
                for c in conversations]

    async def close(self):
        pass


def judge_by_member(messages):
    return recorded("judge_full" if "Member: Ada" in messages[-1].content else "judge_partial")


def test_protocol_with_fake_policy():
    assets = MindEvalAssets.load(FIXTURES)
    policy = FakeClinician()
    patient = ScriptedChatModel(lambda m: "<think>hm</think> Fine, I guess.")
    judge = ScriptedChatModel(judge_by_member)
    result = anyio.run(lambda: run_mindeval(policy, patient, judge, assets, MindEvalSettings(), show_progress=False))
    assert len(policy.calls) == 10  # 10 turns, each one batch over both profiles
    first = policy.calls[0][0][0]
    assert [m.role for m in first] == ["system", "user"] and first[1].content == "Hello"
    assert "- Name: Ada" in first[0].content
    p0 = patient.calls[0]
    assert [m.role for m in p0] == ["system", "assistant", "user"] and p0[1].content == "Hello"
    assert p0[2].content == "..." and "Backstory: You fix ferry engines" in p0[0].content
    ada = result.raw[0]
    assert len(ada["interaction"]) == 21 and ada["interaction"][0] == {"role": "user", "content": "Hello"}
    assert ada["interaction"][2] == {"role": "user", "content": "Fine, I guess."}  # patient thinking stripped
    assert ada["clinician_thinking_traces"][0] == "plan" and len(ada["member_thinking_traces"]) == 10
    judge_prompt = judge.calls[0][0].content
    assert judge.calls[0][0].role == "user" and len(judge.calls[0]) == 1
    assert "<conversation>\n<member>\nHello\n</member>\n<therapist>\n" in judge_prompt
    # Ada 3.7, Bram 3.6 (faithful: the 7 is kept)
    assert result.score == pytest.approx(3.65)
    assert result.criteria == pytest.approx(dict(zip(CRITERIA, [3.0, 6.0, 3.25, 3.5, 2.5])))
    assert result.counts == {"conversations": 2, "scored": 2, "judge_errors": 0, "patient_errors": 0,
                             "missing_scores": 3, "all_missing": 0, "out_of_range": 1, "empty_clinician_replies": 1}
    assert result.ci[0] == pytest.approx(3.6) and result.ci[1] == pytest.approx(3.7)
    # the benchmark's sampling: 16000 tokens, no temperature (None: not sent, the server's default)
    assert all(s == {"temperature": None, "max_tokens": 16000} for s in patient.sampling + judge.sampling)
    bram = result.raw[1]
    assert bram["judge_raw"] == recorded("judge_partial") and "<think>" not in bram["judge_text"]
    assert bram["judge_thinking"].startswith("Let me weigh it.")


def test_failed_calls_are_done_again_from_the_saved_records():
    assets = MindEvalAssets.load(FIXTURES)
    whole = anyio.run(lambda: run_mindeval(FakeClinician(), ScriptedChatModel(lambda m: "Fine."),
                                           ScriptedChatModel(judge_by_member), assets, show_progress=False))

    def patient(messages):  # Bram's patient fails at its third turn
        if "Bram" in messages[0].content and len(messages) > 5:
            raise ConnectionError("patient down")
        return "Fine."

    def judge(messages):
        if "Member: Ada" in messages[-1].content:
            raise ConnectionError("judge down")
        return judge_by_member(messages)

    first = anyio.run(lambda: run_mindeval(FakeClinician(), ScriptedChatModel(patient), ScriptedChatModel(judge),
                                           assets, show_progress=False))
    assert [r["status"] for r in first.raw] == ["judge_error", "patient_error"]
    assert first.failed == 2 and not first.complete and first.score is None
    assert first.raw[1]["patient_error"] == "ConnectionError: patient down"

    policy, judge2 = FakeClinician(), ScriptedChatModel(judge_by_member)
    again = anyio.run(lambda: run_mindeval(policy, ScriptedChatModel(lambda m: "Fine."), judge2, assets,
                                           show_progress=False, records=first.raw))
    assert [len(convos) for convos, _ in policy.calls] == [1] * 10  # only Bram's conversation is held again
    assert len(judge2.calls) == 2 and again.complete  # Ada's saved conversation is judged, Bram's new one too
    assert again.score == pytest.approx(whole.score)
    assert [r["interaction"] for r in again.raw][0] == [r["interaction"] for r in whole.raw][0]


def test_profile_missing_a_template_field(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "me")
    (tmp_path / "me" / "data" / "profiles.jsonl").write_text(json.dumps(
        {"member_attributes": {"name": "Cy"}, "member_narrative": "n"}) + "\n")
    assets = MindEvalAssets.load(tmp_path / "me")
    with pytest.raises(BenchmarkError, match="profile 0 has no field 'age' that the clinician template uses"):
        anyio.run(lambda: run_mindeval(FakeClinician(), ScriptedChatModel([]), ScriptedChatModel([]), assets,
                                       show_progress=False))


# --- a tiny end-to-end run through the command line --------------------------------------------

def patient_reply(messages):
    return "I slept badly again."


def judge_full(messages):
    return recorded("judge_full")


@pytest.mark.slow
def test_tiny_run_through_the_cli(tmp_path):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000010"
    shutil.copytree(tiny.resolve("tiny:policy"), ckpt / "policy")
    (ckpt / "state.json").write_text("{}")
    spec = lambda fn: json.dumps({"engine": "scripted", "path": f"test_mindeval:{fn}"})
    args = ["--run", str(run), "--bench", "mindeval", "--bench-dir", str(FIXTURES), "--judge", spec("judge_full"),
            "--patient", spec("patient_reply"), "--max-tokens", "4", "--no-progress", "--log-level", "WARNING"]
    assert eval_main(args) == 0
    row = json.loads((run / "eval" / "mindeval.jsonl").read_text())
    assert row["step"] == 10 and row["score"] == pytest.approx(3.7) and row["counts"]["scored"] == 2
    assert row["criteria"]["Ethical & Professional Conduct"] == 5.0
    assert row["settings"]["turns"] == 10 and row["settings"]["templates"][2] == "v0_1_w_length_guidelines"
    raw = [json.loads(line) for line in (run / "eval" / "mindeval_raw" / "step_000010.jsonl").read_text().splitlines()]
    assert len(raw) == 2 and len(raw[1]["interaction"]) == 21
    assert raw[1]["interaction"][-1] == {"role": "user", "content": "I slept badly again."}


def judge_names_nothing(messages):
    return "The therapist did well overall."  # no `Name: score` line: every criterion missing


@pytest.mark.slow
def test_a_complete_row_with_an_all_criteria_missing_warning_exits_0_and_prints_the_warning(tmp_path, capsys):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000010"
    shutil.copytree(tiny.resolve("tiny:policy"), ckpt / "policy")
    (ckpt / "state.json").write_text("{}")
    spec = lambda fn: json.dumps({"engine": "scripted", "path": f"test_mindeval:{fn}"})
    args = ["--run", str(run), "--bench", "mindeval", "--bench-dir", str(FIXTURES), "--judge",
            spec("judge_names_nothing"), "--patient", spec("patient_reply"), "--max-tokens", "4", "--no-progress",
            "--log-level", "WARNING"]
    assert eval_main(args) == 0  # a warning is not a failure
    row = json.loads((run / "eval" / "mindeval.jsonl").read_text())
    assert row["complete"] and row["score"] == pytest.approx(3.0) and row["counts"]["all_missing"] == 2
    err = capsys.readouterr().err
    assert "warning: mindeval step 10: 2 judge replies named none of the five criteria" in err
    assert "error:" not in err


def test_cli_needs_a_patient(capsys):
    with pytest.raises(SystemExit):
        eval_main(["--run", "x", "--bench", "mindeval", "--bench-dir", "y", "--judge", "{}"])
    assert "--patient" in capsys.readouterr().err
