"""The docs build as a site in strict mode (every link and anchor checked, every page in the nav),
and the README, which the site does not read, indexes every docs page with links that exist."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]'; '.[dev]' includes it)")
def test_the_docs_site_builds_in_strict_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not problems, "\n".join(problems) or done.stderr[-3000:]
    assert (tmp_path / "site" / "quickstart" / "index.html").is_file()


def test_the_readme_links_to_every_docs_page_and_each_link_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)}
    assert sorted(t for t in targets if not (ROOT / t).exists()) == []
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md"}
    assert sorted(pages - targets) == [], "docs pages the README's index does not list"
