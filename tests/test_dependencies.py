"""Every third-party module the checkout imports is declared in pyproject.toml: deptry, configured in
[tool.deptry], run on the whole checkout, tests/ included (its helper modules are local code)."""

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# deptry's default excludes without "tests", plus [tool.deptry] extend_exclude (read below).
DEFAULT_EXCLUDE = ["venv", r"\.venv", r"\.direnv", r"\.git", r"setup\.py"]


def deptry_violations(root: Path) -> list[str]:
    """One line per violation deptry finds in `root` (rule, module, where), tests/ scanned too."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("tool", {}).get("deptry", {})
    # the scripts' own modules: benchmarks/, scripts/ and each examples/ folder put their folder on
    # sys.path, so a module that lives there is local code, not a package (a new benchmark module
    # needs no entry of its own)
    beside_scripts = [root / "tests", root / "benchmarks", root / "scripts",
                      *[p.parent for p in (root / "examples").rglob("*.py")]]
    local = set(config.get("known_first_party", [])) | {p.stem for d in beside_scripts for p in d.glob("*.py")}
    out = root / ".pytest_cache" / "deptry.json"
    out.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "deptry", ".", "--json-output", str(out),
           *[a for x in DEFAULT_EXCLUDE + config.get("extend_exclude", []) for a in ("--exclude", x)],
           *[a for m in sorted(local) for a in ("--known-first-party", m)]]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_COLOR": "1"})
    if not out.exists():
        raise AssertionError(f"deptry did not run (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    found = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return [f"{v['error']['code']} {v['error']['message']} ({v['location']['file']}:{v['location']['line']})"
            for v in found]


@pytest.mark.skipif(importlib.util.find_spec("deptry") is None,
                    reason="deptry is not installed (pip install -e '.[dev]' installs it)")
def test_every_third_party_import_is_declared():
    problems = deptry_violations(ROOT)
    assert not problems, "undeclared or transitive-only imports (declare them in pyproject.toml):\n" + \
        "\n".join(problems)
