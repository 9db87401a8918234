"""The "Add a domain" section: its doc shows the example files byte for byte, they run as written,
and the domains it describes (an arithmetic task rewarded from each prompt's answer, a tutor whose
student has a persona per conversation) work from what docs/add_a_domain.md says."""

import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from dynalize import tiny
from dynalize.backends.base import SamplingParams
from dynalize.backends.hf import load_tokenizer
from dynalize.build import build_reward_model
from dynalize.config import load_config
from dynalize.rewards import RMTerm, score_batch
from dynalize.rollouts import sample_groups
from dynalize.run import main
from dynalize.runlog import read_jsonl
from dynalize.tasks.base import build_task
from dynalize.tasks.data import DataError
from dynalize.types import Batch
from toytask import ScriptedGenerator

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "add_a_domain.md"
COMMANDS = {"haiku": "python -m dynalize.run --config examples/haiku/haiku.yaml",
            "tutor": "python -m dynalize.run --config examples/tutor/tutor.yaml"}


def doc_blocks(kind: str) -> dict[str, str]:
    """Each `<!-- kind: NAME -->` marker in the doc and the fenced block under it."""
    pattern = re.compile(rf"<!-- {kind}: (\S+) -->\n```\w*\n(.*?)^```$", re.S | re.M)
    return dict(pattern.findall(DOC.read_text(encoding="utf-8")))


@pytest.fixture
def repo_on_path(monkeypatch):
    """`examples.*` importable, as `python -m` from the repository root makes it."""
    monkeypatch.syspath_prepend(str(REPO))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(tiny.resolve("tiny:policy"))


def test_doc_shows_the_example_files_byte_for_byte():
    shown = doc_blocks("file")
    assert sorted(shown) == ["examples/haiku/haiku.yaml", "examples/haiku/haiku_task.py",
                             "examples/tutor/tutor.yaml", "examples/tutor/tutor_task.py"]
    for path, text in shown.items():
        assert text == (REPO / path).read_text(encoding="utf-8"), path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_doc_gives_the_one_command_and_the_yaml_names_the_module(name):
    doc = DOC.read_text(encoding="utf-8")
    assert f"```bash\n{COMMANDS[name]}\n```" in doc
    yml = (REPO / f"examples/{name}/{name}.yaml").read_text(encoding="utf-8")
    assert f"name: examples.{name}.{name}_task:" in yml


def test_haiku_reward_scores_the_form(repo_on_path):
    from examples.haiku.haiku_task import haiku_reward, syllables

    perfect = "An old silent pond\nA frog jumps into the pond\nSplash! Silence again"
    assert haiku_reward([perfect, "", "one line only"]) == [1.0, 0.0, pytest.approx(1 - 13 / 17)]
    assert [syllables(w) for w in ["pond", "silent", "silence", "table", "free"]] == [1, 2, 2, 2, 1]


def test_tutor_student_follows_its_persona_and_evaluate_reads_whole_conversations(repo_on_path, tok):
    from examples.tutor.tutor_task import TutorTask

    task = build_task("examples.tutor.tutor_task:TutorTask", {"max_turns": 3}, 0)
    assert isinstance(task, TutorTask) and task.max_turns == 3
    ana, ben = task.prompts("train")[:2]
    assert ana.meta["key"] == "tilt" and ben.meta["key"] == "dense"
    # the tutor talks about tilt once a student has doubted it: Ana comes round, Ben does not
    policy = ScriptedGenerator(tok, lambda text: "It is the tilt of the axis." if "still don't get it" in text
                               else "Good question!")
    groups = anyio.run(sample_groups, policy, tok, task, [ana, ben], 2, SamplingParams(max_new_tokens=16))
    a, b = groups[0][0], groups[1][0]
    assert [m.content for m in a.turns] == ["Good question!", f"Sorry, I still don't get it. {ana.meta['doubt']}",
                                            "It is the tilt of the axis."]  # won over: the student ends it
    assert len(b.replies) == 3 and b.turns[-2].content.endswith(ben.meta["doubt"])
    metrics = anyio.run(task.evaluate, [ana, ben], [a.replies[-1], b.replies[-1]], [a.conversation, b.conversation])
    assert metrics == {"convinced": 0.5, "tutor_replies": 2.5}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_example_runs_as_written(name, tmp_path):
    """The doc's command from the repository root, plus an output folder and 2 steps."""
    cmd = [sys.executable, *COMMANDS[name].split()[1:], f"output_dir={tmp_path}", "steps=2", "progress=false",
           "generator.max_new_tokens=12"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 3  # the evaluation before training (step 0), then steps 1 and 2
    evals = read_jsonl(tmp_path / name / "eval" / "task.jsonl")
    metric = {"haiku": "form", "tutor": "convinced"}[name]
    assert len(evals) == 2 and metric in evals[0]  # the task's own evaluate() ran (steps 0 and 2)
    assert f"eval/{metric}" in out.stdout  # and shows in the end-of-run summary


# --- the arithmetic domain of "Per-prompt data" ----------------------------------------------------

SUMS = [{"question": f"{a} + {b}", "answer": a + b} for a, b in
        [(2, 3), (17, 25), (4, 4), (9, 1), (6, 7), (12, 30), (5, 5), (8, 13), (1, 1), (20, 2), (3, 9), (14, 6)]]


@pytest.fixture
def arithmetic(tmp_path, monkeypatch):
    """The doc's arithmetic.py and arithmetic.yaml, written as they are shown, beside a data
    file; run from that folder."""
    for name, text in doc_blocks("snippet").items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SUMS), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "arithmetic", raising=False)
    yield tmp_path
    sys.modules.pop("arithmetic", None)


def test_arithmetic_rewards_read_each_prompts_answer(arithmetic, tok):
    assert sorted(doc_blocks("snippet")) == ["arithmetic.py", "arithmetic.yaml"]
    cfg = load_config(arithmetic / "arithmetic.yaml", [])
    task = build_task(cfg.task.name, cfg.task.args, 0)
    prompts = task.prompts("train")
    assert len(prompts) == 9 and len(task.prompts("eval")) == 3
    assert all(p.meta["answer"] == sum(map(int, p.id.split(" + "))) for p in prompts)

    def answer(text):  # right for sums whose first number is even, off by one otherwise
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
        return f"That makes {a + b if a % 2 == 0 else a + b + 1}."

    expected = [float(int(p.id.split(" + ")[0]) % 2 == 0) for p in prompts]
    assert 0 < sum(expected) < len(expected)
    for engine in ("python", "task"):
        cfg.reward_model.engine = engine
        groups = anyio.run(sample_groups, ScriptedGenerator(tok, answer), tok, task, prompts, 2, SamplingParams())
        anyio.run(score_batch, [RMTerm(build_reward_model(cfg, task), task)], Batch(0, groups))
        assert [g[0].scores["rm"] for g in groups] == expected, engine
    replies = [answer(f"What is {p.id}?") for p in prompts]
    assert anyio.run(task.evaluate, prompts, replies) == {"accuracy": sum(expected) / len(expected)}
    (arithmetic / "bad.jsonl").write_text('{"question": "1 + 1", "answer": "two"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"^data error: bad.jsonl line 1: answer 'two' is not a whole number$"):
        build_task(cfg.task.name, {"train_file": "bad.jsonl"}, 0)


def test_arithmetic_yaml_runs_as_shown(arithmetic, capsys):
    code = main(["--config", "arithmetic.yaml", "steps=2", "eval_every=1", "progress=false",
                 "generator.max_new_tokens=8", "trainer.micro_batch_size=16"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    evals = read_jsonl(arithmetic / "runs" / "arithmetic" / "eval" / "task.jsonl")
    assert [sorted(e) for e in evals] == [["accuracy", "rm", "step", "version"]] * 3
    assert "eval/accuracy" in out.out
    for line in read_jsonl(arithmetic / "runs" / "arithmetic" / "rollouts" / "step_000001.jsonl"):
        assert line["rm_score"] in (0.0, 1.0)
