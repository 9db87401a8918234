"""The "Add a domain" example: its doc shows the files byte for byte, and it runs as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "README.md"  # its "Add a domain" section
COMMAND = "python -m dynalize.run --config examples/haiku/haiku.yaml"


def doc_files() -> dict[str, str]:
    """Each `<!-- file: PATH -->` marker in the doc and the fenced block under it."""
    pattern = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", re.S | re.M)
    return dict(pattern.findall(DOC.read_text(encoding="utf-8")))


def test_doc_shows_the_example_files_byte_for_byte():
    shown = doc_files()
    assert sorted(shown) == ["examples/haiku/haiku.yaml", "examples/haiku/haiku_task.py"]
    for path, text in shown.items():
        assert text == (REPO / path).read_text(encoding="utf-8"), path


def test_doc_gives_the_one_command_and_the_yaml_names_the_module():
    doc = DOC.read_text(encoding="utf-8")
    assert f"```bash\n{COMMAND}\n```" in doc
    yml = (REPO / "examples/haiku/haiku.yaml").read_text(encoding="utf-8")
    assert "name: examples.haiku.haiku_task:HaikuTask" in yml
    assert "path: examples.haiku.haiku_task:haiku_reward" in yml


def test_haiku_reward_scores_the_form():
    sys.path.insert(0, str(REPO))
    try:
        from examples.haiku.haiku_task import haiku_reward, syllables
    finally:
        sys.path.remove(str(REPO))
    perfect = "An old silent pond\nA frog jumps into the pond\nSplash! Silence again"
    assert haiku_reward([perfect, "", "one line only"]) == [1.0, 0.0, pytest.approx(1 - 13 / 17)]
    assert [syllables(w) for w in ["pond", "silent", "silence", "table", "free"]] == [1, 2, 2, 2, 1]


@pytest.mark.slow
def test_example_runs_as_written(tmp_path):
    """The doc's command from the repository root, plus an output folder and 2 steps."""
    cmd = [sys.executable, *COMMAND.split()[1:], f"output_dir={tmp_path}", "steps=2", "progress=false",
           "generator.max_new_tokens=12"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = (tmp_path / "haiku" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 2
    evals = (tmp_path / "haiku" / "eval" / "task.jsonl").read_text().splitlines()
    assert len(evals) == 2 and '"form"' in evals[0]  # the task's own evaluate() ran (steps 0 and 2)
