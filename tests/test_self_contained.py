"""The repository stands alone: no file points outside it with a relative path (into a `shared`
folder beside the checkout, a sibling checkout), which a user who clones it would not have. A relative path that climbs up
(`../`) must, from the directory of the file that names it, land on a file or folder of the
repository. Absolute paths of this machine are tests/test_portable_paths.py's concern."""

from __future__ import annotations

import posixpath
import re

import pytest
from test_portable_paths import NOT_CHECKED, ROOT, repository_files

UP = ".." + "/"  # written so that this file itself names no such path
CLIMB = re.compile(r"(?<![\w.~$}])(?:\.\./)+[\w.@+-][\w.@+/-]*")
"""A relative path that starts by climbing up one or more directories."""


def outside_references(rel: str, text: str, inside: set[str]) -> list[str]:
    """The climbing paths in `text` (of the repository file `rel`) that do not land on one of the
    repository's paths (`inside`: its files and their folders) from `rel`'s directory."""
    found = []
    for m in CLIMB.finditer(text):
        target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), m.group(0).rstrip(".,:;)")))
        if target.startswith(UP) or target == ".." or target not in inside:
            found.append(m.group(0))
    return found


def _inside(files: list[str]) -> set[str]:
    paths = set(files)
    for f in files:
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return paths


def test_no_file_refers_outside_the_repository():
    files = repository_files()
    inside = _inside(files)
    found = []
    for rel in files:
        if rel.startswith(NOT_CHECKED):
            continue
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary
            continue
        for n, line in enumerate(text.splitlines(), 1):
            found += [f"{rel}:{n}: {p}" for p in outside_references(rel, line, inside)]
    assert not found, "paths that leave the repository (a clone does not have them):\n" + "\n".join(found)


INSIDE = _inside(["README.md", "docs/architecture.md", "docs/sandbox.md", "dynalize/run.py"])


@pytest.mark.parametrize("rel, line", [
    ("README.md", f"see [{UP}shared/ARCHITECTURE.md]({UP}shared/ARCHITECTURE.md)"),
    ("docs/sandbox.md", f"the layout: {UP}{UP}shared/ARCHITECTURE.md"),
    ("docs/sandbox.md", f"the layout: {UP}shared/ARCHITECTURE.md"),  # inside, but no such file
    ("dynalize/run.py", f'Path(__file__).parent / "{UP}{UP}{UP}other-checkout/data.jsonl"'),
])
def test_paths_out_of_the_repository_are_found(rel, line):
    assert outside_references(rel, line, INSIDE)


@pytest.mark.parametrize("rel, line", [
    ("docs/sandbox.md", f"the layout: [architecture]({UP}docs/architecture.md), [readme]({UP}README.md)."),
    ("dynalize/run.py", f'ROOT / "docs/architecture.md" and "{UP}README.md"'),
    ("README.md", "docs/architecture.md, ./docs/sandbox.md, ~/..x/y, a.../b"),
])
def test_paths_inside_the_repository_pass(rel, line):
    assert outside_references(rel, line, INSIDE) == []
