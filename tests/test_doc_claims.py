"""Claims of README.md and docs/ that the code decides, checked against the code: where each
config section is declared, which tasks are built in, when the built-in demo runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dynalize.config import RunConfig
from dynalize.run import config_sections
from dynalize.tasks.base import BUILTIN_TASKS

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def flat(path: Path) -> str:
    """A doc's text with its line breaks and runs of spaces as one space."""
    return " ".join(path.read_text(encoding="utf-8").split())


def section_files() -> dict[str, str]:
    """Each config section (`penalties.judge`) -> the file declaring its fields."""
    return {name: cls.__module__.replace(".", "/") + ".py" for name, cls in config_sections()}


PLACED = re.compile(r"((?:`[a-z_.]+\.\*`(?:,| and| or)? ?)+) in `(dynalize/[a-z_/]*config\.py)`")


def misplaced(text: str, files: dict[str, str]) -> list[str]:
    """"`a.b.*` (and `c.*`) in `dynalize/x/config.py`" claims whose sections that file does not declare."""
    wrong = []
    for m in PLACED.finditer(text):
        for section in re.findall(r"`([a-z_.]+)\.\*`", m.group(1)):
            if section in files and files[section] != m.group(2):
                wrong.append(f"{section}.* in {m.group(2)} (declared in {files[section]})")
    return wrong


def test_the_placement_check_finds_a_section_named_in_the_wrong_file():
    files = {"penalties.judge": "dynalize/judge/config.py", "penalties.proposer": "dynalize/penalties/config.py"}
    text = "Settings: `penalties.judge.*` and `penalties.proposer.*` in `dynalize/penalties/config.py`, the"
    assert misplaced(text, files) == ["penalties.judge.* in dynalize/penalties/config.py "
                                      "(declared in dynalize/judge/config.py)"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_place_each_config_section_in_the_file_that_declares_it(doc):
    assert misplaced(flat(doc), section_files()) == []


def test_the_docs_name_every_file_that_declares_config_fields():
    paragraph = re.search(r"Every config field is documented where it is declared, (.*?)\. ",
                          flat(REPO / "docs" / "running.md"))
    assert paragraph, "docs/running.md lost its sentence on where config fields are declared"
    missing = sorted(set(section_files().values()) - set(re.findall(r"`(dynalize/\S+?\.py)`", paragraph.group(1))))
    assert missing == []


def test_the_docs_list_every_built_in_task():
    listed = re.search(r"Built in: (.*?)\(data formats", flat(REPO / "docs" / "how_it_works.md"))
    assert listed, "docs/how_it_works.md lost its list of built-in tasks"
    assert sorted(set(BUILTIN_TASKS) - set(re.findall(r"`([a-z_]+)`", listed.group(1)))) == []


def printed_config(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "dynalize.run", "--print-config", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return yaml.safe_load(proc.stdout)


def test_the_demo_runs_without_config_resume_or_override_whatever_the_flags_and_the_docs_say_so():
    demo = yaml.safe_load((REPO / "dynalize" / "assets" / "default.yaml").read_text(encoding="utf-8"))
    assert printed_config()["name"] == demo["name"] != RunConfig().name
    assert printed_config("--overwrite", "--log-level", "WARNING")["name"] == demo["name"]
    assert printed_config("steps=3")["name"] == RunConfig().name
    readme = flat(REPO / "docs" / "running.md")
    assert ("With no `--config`, no `--resume` and no dotted override, `python -m dynalize.run` runs the built-in "
            "demo") in readme
    assert "whatever flags that set nothing are given (`--overwrite`, `--log-level`; `--print-config` then shows " \
           "the demo's settings)" in readme


def test_what_the_docs_say_of_trls_defaults_is_trls_default():
    """docs/learner.md and docs/how_it_works.md name TRL's `disable_dropout` default: it is the installed TRL's."""
    trl = pytest.importorskip("trl")
    default = trl.GRPOConfig.__dataclass_fields__["disable_dropout"].default
    for doc in (REPO / "docs" / "learner.md", REPO / "docs" / "how_it_works.md"):
        text = flat(doc)
        claims = re.findall(r"TRL(?: [0-9.]+)?'s `?disable_dropout`? defaults to (true|false)|"
                            r"`disable_dropout`, (on|off) by default", text)
        assert claims, f"{doc.name} no longer says what TRL's disable_dropout default is"
        for said in claims:
            assert (said[0] or said[1]) in (("true", "on") if default else ("false", "off")), (doc.name, said)


SANDBOX_CONFIGS = {"single-turn": "sandbox_dynalize.yaml", "multi-turn": "sandbox_multiturn_dynalize.yaml",
                   "learned-RM": "sandbox_learned_dynalize.yaml"}


def lexical_setting(config: Path, key: str):
    lexical = (((yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("penalties") or {})
               .get("proposer") or {}).get("lexical") or {}
    return lexical.get(key)


def test_the_sandboxes_docs_say_turn_a_lexical_setting_on_are_those_whose_configs_do():
    """"`x` (off by default; on in the single-turn and multi-turn sandboxes)" names exactly the
    shipped sandbox configs that set x to true."""
    claims = re.findall(r"`([a-z_]+)` \(off by default; on in the ([A-Za-z, -]+?) sandboxes\)", flat(REPO / "docs" / "penalties.md"))
    assert claims, "docs/penalties.md no longer says which sandboxes turn a setting on"
    for key, where in claims:
        named = {w.strip() for w in re.split(r",| and ", where) if w.strip()}
        on = {name for name, file in SANDBOX_CONFIGS.items() if lexical_setting(REPO / "configs" / file, key) is True}
        assert named == on, (key, named, on)
