"""The rubric world's package is the only place in dynalize/ that knows its rubric and flaw lists.

Rubric Dropout, the rubric term, the judge and the measurement must work from what any rubric
task gives them (criteria with weights and tags, a judge's verdicts): so nothing outside
dynalize/tasks/rubric_world/ may import it (the task registry names its entry point, as for the
sandbox), name its list API, or carry its cue words and flaw texts in code; and the reward terms,
judge, rubric maths and loop load without it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from test_sandbox_isolation import code_text

from dynalize.tasks.rubric_world import LISTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dynalize"
WORLD = PACKAGE / "tasks" / "rubric_world"

# The language the world shares with the sandbox: its quirk words are the corpus's; which of
# them a proxy credits is the world's list.
ALLOWED_FILES = {"dynalize/tasks/sandbox/grammar.py"}
REGISTRY = {"rubric_world", "dynalize.tasks.rubric_world:RubricWorldTask"}
"""The task registry's name and entry point (dynalize/tasks/base.py), as for the sandbox."""
LIST_API = {"LISTS", "default_rubric", "default_eval_rubric", "default_flaws", "alternative_flaws",
            "alternative_rubric", "alternative_eval_rubric", "Flaw", "CriterionTemplate", "proxy_verdict",
            "gold_verdict", "CUE_WORDS"}
BLIND = ["dynalize.loop", "dynalize.rewards", "dynalize.rewards.rubric", "dynalize.judge.judge",
         "dynalize.rubrics.criteria", "dynalize.rubrics.dropout", "dynalize.rubrics.reweight",
         "dynalize.rubrics.protocol", "dynalize.rubrics.config", "dynalize.tasks.rubric", "dynalize.build"]


def outside_files() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py") if WORLD not in p.parents]
    assert len(files) > 10
    return files


def planted_texts() -> set[str]:
    """What would give the lists away: cue words and phrases of every flaw and pitfall, criterion texts."""
    texts: set[str] = set()

    def words(spec):
        texts.update(str(w) for w in spec.get("words", []))
        of = spec.get("of")
        for s in of if isinstance(of, list) else [of] if isinstance(of, dict) else []:
            words(s)

    for make_rubric, make_eval, make_flaws in LISTS.values():
        for t in make_rubric() + make_eval():
            words(t.gold)
            if "{" not in t.text:
                texts.add(t.text)
        for f in make_flaws():
            words(f.check)
            texts.add(f.why)
    texts = {t for t in texts if t and not t.startswith("{")}
    assert {"velvet", "cosmic", "Well,", "Repeats itself", "length taken for detail", "a lot to say"} <= texts
    return texts


def test_no_list_text_outside_the_world():
    """A cue word, a flaw's description or a criterion's text anywhere in code gives the lists away;
    a cue *phrase* is ordinary English (a scripted patient may say "it's hard to explain"), so a
    file gives them away when its code holds two or more of them."""
    planted = planted_texts()
    phrases = {t for t in planted if " " in t and t.islower()}
    found = []
    for path in outside_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED_FILES:
            continue
        code = code_text(path)
        found += [(rel, t) for t in planted - phrases if t in code]
        hits = sorted(t for t in phrases if t in code)
        if len(hits) >= 2:
            found.append((rel, " / ".join(hits)))
    assert not found, f"rubric world list text outside dynalize/tasks/rubric_world/: {found}"


def test_no_import_of_the_world_outside_it():
    bad = []
    for path in outside_files():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "") + "." + a.name for a in node.names]
            bad += [(rel, n) for n in names if "rubric_world" in n.split(".")]
            if isinstance(node, ast.Name | ast.Attribute):
                ident = node.id if isinstance(node, ast.Name) else node.attr
                if ident in LIST_API:
                    bad.append((rel, ident))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "rubric_world" in node.value \
                    and node.value not in REGISTRY:
                bad.append((rel, node.value))
    assert not bad, f"code outside dynalize/tasks/rubric_world/ reaches into it: {bad}"


def test_rubric_machinery_loads_without_the_world():
    code = (
        "import importlib, sys\n"
        f"for m in {BLIND!r}: importlib.import_module(m)\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('dynalize.tasks.rubric_world'))\n"
        "assert not leaked, leaked\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
