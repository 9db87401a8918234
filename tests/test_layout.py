"""The package's shape: no import cycles, settings modules that import no engine, engines that
know nothing of Dynalize."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dynalize"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks (imports there never run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere (module level or inside functions), with the
    packages that importing them runs (`a.b.c` runs `a` and `a.b` first), except the module's own
    enclosing packages (already being imported when it runs)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != me and not me.startswith(prefix + "."):
                    found.add(prefix)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert len(files) > 40
    return {m: imports_of(p, set(files)) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_import_cycles_in_the_package():
    found = cycles(import_graph())
    assert not found, f"import cycles (imports inside functions count too): {found}"


def test_no_import_cycles_among_the_benchmarks():
    """The benchmark scripts import each other by file name (benchmarks/ on sys.path)."""
    files = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {m: imports_of(p, set(files)) for m, p in files.items()}
    assert graph["gpu_check"], "the benchmarks' imports of each other were not found"
    found = cycles(graph)
    assert not found, f"import cycles among benchmarks/ (imports inside functions count too): {found}"


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_settings_modules_import_only_settings():
    graph = import_graph()
    settings = {"dynalize.config", "dynalize.penalties.config", "dynalize.backends.config", "dynalize.errors",
                "dynalize.judge.config", "dynalize.yamlload",  # yamlload: YAML read with its aliases bounded
                "dynalize.rubrics.config", "dynalize.rm.config"}
    light_packages = {"dynalize", "dynalize.penalties", "dynalize.backends", "dynalize.rubrics", "dynalize.judge",
                      "dynalize.rm"}  # their __init__ imports nothing
    for m in settings:
        assert reaches(graph, m) <= settings | light_packages, f"{m} loads runtime code"
    for pkg in light_packages - {"dynalize"}:
        assert not graph[pkg], f"{pkg}/__init__.py imports {sorted(graph[pkg])}"


def test_engines_know_nothing_of_dynalize_and_pure_logic_imports_no_engine():
    graph = import_graph()
    for m, deps in graph.items():
        if m.startswith("dynalize.backends."):
            bad = {d for d in deps if not d.startswith("dynalize.backends") and d not in
                   {"dynalize", "dynalize.types", "dynalize.grpo", "dynalize.errors"}}
            assert not bad, f"engine {m} imports {sorted(bad)}"
    for pure in ("dynalize.types", "dynalize.grpo", "dynalize.penalties.buffer", "dynalize.penalties.views",
                 "dynalize.penalties.lexical", "dynalize.penalties.candidate", "dynalize.penalties.detectors",
                 "dynalize.rubrics.criteria",
                 "dynalize.rubrics.dropout", "dynalize.rubrics.reweight", "dynalize.rubrics.protocol",
                 "dynalize.judge.saferegex", "dynalize.judge.prompting", "dynalize.judge.levels"):
        engines = {d for d in reaches(graph, pure) if d.startswith("dynalize.backends.") and d not in
                   {"dynalize.backends.base", "dynalize.backends.config"}}
        assert not engines, f"{pure} reaches engine modules {sorted(engines)}"


def test_the_criteria_judge_is_its_own_package_of_modules_readable_in_one_sitting():
    graph = import_graph()
    for user in ("dynalize.rewards.rubric", "dynalize.rubrics.criteria", "dynalize.rubrics.protocol",
                 "dynalize.eval.healthbench", "dynalize.eval.researchqa"):
        assert not {d for d in graph[user] if d.startswith("dynalize.penalties")}, \
            f"{user} imports from penalties/ (the judge lives in dynalize/judge/)"
    for path in sorted((PACKAGE / "judge").glob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        assert n < 400, f"{path.relative_to(ROOT)} has {n} lines: split it"
    assert not (PACKAGE / "penalties" / "judge.py").exists()
