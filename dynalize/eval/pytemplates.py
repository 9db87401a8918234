"""Read string templates out of a benchmark's Python prompt module without running it.

A benchmark repository keeps its prompts as module-level assignments, e.g.

    from string import Template
    CLINICIAN = Template(\"\"\"You are ... ${name} ...\"\"\")
    PLAIN = "a plain string"
    VERSIONS = {"v0_1": CLINICIAN}

`PromptModule(path)` parses the file with `ast` (nothing of it is executed) and resolves such
names: a string constant (adjacent literals and `+` of literals included), `Template(<string>)`
or `string.Template(<string>)`, another name, or a dict of string keys to any of these. Anything
else (f-strings, calls to other functions) is refused with a one-line `TemplateLayoutError`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from string import Template


class TemplateLayoutError(ValueError):
    """The checkout does not hold the module, name or kind of value we expect."""


class PromptModule:
    """The module-level assignments of one Python file, resolved lazily by name."""

    def __init__(self, path: str | Path, what: str = "benchmark"):
        self.path = Path(path)
        self.what = what
        if not self.path.is_file():
            raise TemplateLayoutError(f"{what}: {self.path} not found (is --bench-dir a checkout of the benchmark?)")
        try:
            tree = ast.parse(self.path.read_text(encoding="utf-8"), filename=str(self.path))
        except SyntaxError as e:
            raise TemplateLayoutError(f"{what}: {self.path} is not valid Python (line {e.lineno})") from None
        self._nodes: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self._nodes[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self._nodes[node.target.id] = node.value

    def names(self) -> list[str]:
        return sorted(self._nodes)

    def template(self, name: str) -> Template:
        """The `string.Template` named `name` (a plain string becomes a Template too)."""
        value = self._resolve(name, self._nodes.get(name), name, depth=0)
        if isinstance(value, dict):
            raise TemplateLayoutError(f"{self.what}: {name} in {self.path} is a dict; name one of its keys "
                                      f"({', '.join(map(str, value))})")
        return Template(value)

    def versioned(self, dict_name: str, key: str) -> Template:
        """The template under `key` of the dict `dict_name` (a benchmark's version table)."""
        table = self._resolve(dict_name, self._nodes.get(dict_name), dict_name, depth=0)
        if not isinstance(table, dict):
            raise TemplateLayoutError(f"{self.what}: {dict_name} in {self.path} is not a dict of templates")
        if key not in table:
            raise TemplateLayoutError(f"{self.what}: {dict_name} in {self.path} has no version {key!r} "
                                      f"(it has {', '.join(map(str, table))})")
        value = table[key]
        if isinstance(value, dict):
            raise TemplateLayoutError(f"{self.what}: {dict_name}[{key!r}] in {self.path} is not a template")
        return Template(value)

    def lookup(self, spec: str, version_dict: str | None = None) -> Template:
        """A template by module-level name, or (if `spec` is no such name) by version key of `version_dict`."""
        if spec in self._nodes or version_dict is None:
            return self.template(spec)
        return self.versioned(version_dict, spec)

    # --- internals ------------------------------------------------------------------------------

    def _resolve(self, name: str, node: ast.expr | None, ref: str, depth: int) -> str | dict:
        if node is None:
            raise TemplateLayoutError(f"{self.what}: {self.path} defines no {ref} "
                                      f"(the benchmark's layout may have changed)")
        if depth > 20:
            raise TemplateLayoutError(f"{self.what}: {name} in {self.path} refers to itself")
        if isinstance(node, ast.Name):
            return self._resolve(name, self._nodes.get(node.id), node.id, depth + 1)
        if isinstance(node, ast.Call) and _is_template_call(node) and len(node.args) == 1 and not node.keywords:
            value = self._resolve(name, node.args[0], ref, depth + 1)
            if isinstance(value, str):
                return value
        if isinstance(node, ast.Dict):
            out: dict = {}
            for k, v in zip(node.keys, node.values):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    raise TemplateLayoutError(f"{self.what}: {name} in {self.path} has a key that is not a string")
                out[k.value] = self._resolve(name, v, ref, depth + 1)
            return out
        text = _constant_str(node)
        if text is not None:
            return text
        raise TemplateLayoutError(f"{self.what}: {name} in {self.path} (line {getattr(node, 'lineno', '?')}) is not "
                                  f"a string, Template(\"...\") or dict of them; refusing to run the file")


def _is_template_call(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "Template") or (
        isinstance(f, ast.Attribute) and f.attr == "Template" and isinstance(f.value, ast.Name)
        and f.value.id == "string")


def _constant_str(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _constant_str(node.left), _constant_str(node.right)
        if left is not None and right is not None:
            return left + right
    return None
