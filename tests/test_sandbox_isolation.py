"""The sandbox package is the only place in dynalize/ that knows the planted features.

Dynalize must discover the sandbox's planted hacks the way it would discover a real RM's: from
rollouts and RM scores alone. So nothing outside dynalize/tasks/sandbox/ may name a planted
feature, read the feature list, or import the sandbox's features module; and the proposer, judge,
buffer, engine and loop import nothing from the sandbox at all.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

from dynalize.tasks.sandbox import FEATURE_SETS, describe_features

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dynalize"
SANDBOX = PACKAGE / "tasks" / "sandbox"

# Exact, justified exceptions: (file, text) pairs that are *not* the feature list.
ALLOWED: set[tuple[str, str]] = set()

# Names that expose the feature list; only the sandbox may use them.
FEATURE_API = {"FEATURE_SETS", "default_features", "alternative_features", "describe_features",
               "feature_prevalence", "feature_bonus", "SandboxRewardModel"}

# The sandbox's language (its grammar and topics, not its features or RM) is shared with the rubric
# world, which runs on the sandbox's pre-trained policy: that package may import these two modules.
SHARED_LANGUAGE = {"grammar", "topics"}
LANGUAGE_USERS = [PACKAGE / "tasks" / "rubric_world"]

# Modules that must not import anything from the sandbox, not even indirectly.
BLIND = ["dynalize.loop", "dynalize.penalties", "dynalize.penalties.lexical", "dynalize.judge.judge",
         "dynalize.rewards", "dynalize.rewards.penalties", "dynalize.rewards.rm", "dynalize.penalties.buffer", "dynalize.penalties.proposer",
         "dynalize.penalties.views", "dynalize.penalties.config", "dynalize.grpo", "dynalize.rollouts"]


def outside_files() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*.py") if SANDBOX not in p.parents]
    assert len(files) > 10  # the scan sees the package
    return files


def blind(path: Path) -> bool:
    """Whether `path` is one of the modules that must not even mention a feature word."""
    rel = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
    return rel.startswith("dynalize.penalties") or rel in BLIND


def planted_texts() -> set[str]:
    """What would give a feature away: opener and word patterns, and metric names, of every list."""
    texts = set()
    for make in FEATURE_SETS.values():
        features = make()
        texts |= {f.pattern for f in features if f.kind in ("opener", "word") and f.pattern}
        texts |= {label for label, _ in describe_features(features)}
    assert {"Okay,", "galactic", "Honestly,", "crimson", "opener_okay", "word_crimson"} <= texts
    return texts


def code_text(path: Path) -> str:
    """The file's code without docstrings and comments (prose may use any word as an example)."""
    source = path.read_text(encoding="utf-8")
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.add(first.lineno)
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start[0] in docstrings):
            continue
        kept.append(tok.string)
    return " ".join(kept)


def test_no_feature_text_outside_the_sandbox():
    planted = planted_texts()
    found = []
    for path in outside_files():
        rel = path.relative_to(ROOT).as_posix()
        code = code_text(path)
        prose = path.read_text(encoding="utf-8").lower() if blind(path) else ""
        for text in planted:
            # in code anywhere; in the proposer/judge/loop also distinctive words in prose
            hit = text in code or (text.isalpha() and text.lower() in prose)
            if hit and (rel, text) not in ALLOWED:
                found.append((rel, text))
    assert not found, f"planted feature text outside dynalize/tasks/sandbox/: {found}"


def test_allowed_exceptions_are_still_needed():
    for rel, text in ALLOWED:
        assert text in code_text(ROOT / rel), f"stale exception {(rel, text)}: remove it from ALLOWED"


def test_no_import_of_the_sandbox_outside_it():
    bad = []
    for path in outside_files():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "") + "." + a.name for a in node.names]
            shares = any(u in path.parents for u in LANGUAGE_USERS)
            for name in names:
                parts = name.split(".")
                if "sandbox" in parts:
                    after = parts[parts.index("sandbox") + 1:]
                    if not (shares and after and after[0] in SHARED_LANGUAGE):
                        bad.append((rel, name))
            if isinstance(node, ast.Name | ast.Attribute):
                ident = node.id if isinstance(node, ast.Name) else node.attr
                if ident in FEATURE_API:
                    bad.append((rel, ident))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "sandbox" in node.value:
                # a dotted path into the sandbox other than the task registry's entry point
                if "sandbox.features" in node.value or "sandbox.reward" in node.value \
                        or "sandbox:" in node.value and not node.value.endswith(":SandboxTask"):
                    bad.append((rel, node.value))
    assert not bad, f"code outside dynalize/tasks/sandbox/ reaches into it: {bad}"


def test_the_shared_language_does_not_reach_the_feature_list():
    for name in SHARED_LANGUAGE:
        tree = ast.parse((SANDBOX / f"{name}.py").read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= {"__future__", "topics", "grammar", "random", "re", "dataclasses"}, (name, imported)


def test_proposer_judge_and_loop_load_without_the_sandbox():
    code = (
        "import importlib, sys\n"
        f"for m in {BLIND!r}: importlib.import_module(m)\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('dynalize.tasks.sandbox'))\n"
        "assert not leaked, leaked\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
